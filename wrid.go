//go:build linux && cgo

package rdma

import "github.com/verbline/rdma/internal/verbs"

// Work-request ids of a connection's QP: [token:24][kind:8][index:32]. The
// token (the poller's dispatch key, poller.TokenShift) picks the owner on
// the device's shared CQ, the kind what completed, the index which slot or
// buffer. Below the token the id is its owner's: a PacketConn's QP numbers
// its work requests its own way (internal/ud).
const (
	wrRecv     = 1 << 32
	wrSendData = 2 << 32
	wrSendCtl  = 3 << 32
	wrSendMsg  = 4 << 32
	wrOneSided = 5 << 32
	wrSendRv   = 6 << 32  // a rendezvous announcement (index: send slot)
	wrBind     = 7 << 32  // a window bind (index: send slot)
	wrInval    = 8 << 32  // a window invalidate (index: send slot)
	wrReadRv   = 9 << 32  // a rendezvous READ (index: receive buffer)
	wrSendUnc  = 10 << 32 // a credit update or keepalive probe that spends no credit (wire.FeatureControlReserve)

	wrKindMask = 0xff << 32
	wrIdxMask  = 0xffffffff
)

// A failed work completion's opcode is not valid (only its wr_id, status,
// vendor_err and qp_num are), so its error names the operation from the
// work-request id's kind (its layout above).

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
