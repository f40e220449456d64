//go:build linux && cgo

package rdma

import "github.com/verbline/rdma/internal/verbs"

// A failed work completion's opcode is not valid (only its wr_id, status,
// vendor_err and qp_num are), so its error names the operation from the
// work-request id's kind (endpoint.go: [token:24][kind:8][index:32]).

// wrKindNames names each kind of work request a connection posts.
var wrKindNames = [...]string{
	wrRecv >> 32:     "receive",
	wrSendData >> 32: "stream send",
	wrSendCtl >> 32:  "control message send (credits, end of stream)",
	wrSendMsg >> 32:  "message send",
	wrOneSided >> 32: "one-sided operation",
	wrSendRv >> 32:   "large-message announcement send",
	wrBind >> 32:     "memory window bind (large message)",
	wrInval >> 32:    "memory window invalidate (large message)",
	wrReadRv >> 32:   "RDMA read of a large message",
	wrSendUnc >> 32:  "credit update or keepalive probe send",
}

// wrKindName names the kind of work request id; "" for an unknown kind.
func wrKindName(wrid uint64) string {
	if k := (wrid & wrKindMask) >> 32; k < uint64(len(wrKindNames)) {
		return wrKindNames[k]
	}
	return ""
}

// wcErr is wc.Err() naming the operation the failed work request carried
// (nil for a successful completion). Only the error path formats anything.
func wcErr(wc *verbs.WC) error { return wc.ErrOp(wrKindName(wc.WRID)) }

// oneSidedOpName names a one-sided operation by its opcode, more precisely
// than its work-request kind.
func oneSidedOpName(opcode uint32) string {
	switch opcode {
	case verbs.OpRDMAWrite:
		return "RDMA write"
	case verbs.OpRDMAWriteWithImm:
		return "RDMA write with immediate"
	case verbs.OpRDMARead:
		return "RDMA read"
	}
	return wrKindNames[wrOneSided>>32]
}
