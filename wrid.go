//go:build linux && cgo

package rdma

// Work-request ids, shared by the QPs of every connection and PacketConn
// on a device's CQ: [token:24][kind:8][index:32]. The token (the poller's
// dispatch key, poller.TokenShift) picks the owner, the kind what
// completed, the index which slot or buffer.
const (
	// A connection's kinds (RC).
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

	// A PacketConn's kinds (UD).
	wrUDRecv = 1 << 32
	wrUDSend = 2 << 32

	wrKindMask = 0xff << 32
	wrIdxMask  = 0xffffffff
)
