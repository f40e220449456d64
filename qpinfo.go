package rdma

import (
	"fmt"
	"time"
)

// QPInfo is what the device holds for a connection's queue pair, as
// ibv_query_qp reports it: the transport settings the Config asked for
// (each side's own, see Config.AckTimeout), what rdma_cm negotiated, and
// the queue pair's live state. It is for debugging; [Conn.QPInfo] returns
// it, and its String is one line for a log.
type QPInfo struct {
	QPN     uint32 // this side's QP number
	DestQPN uint32 // the peer's QP number
	// State is the QP's state: "RTS" while the connection works, "ERR"
	// once a transport error or the teardown took it down ("RESET",
	// "INIT", "RTR", "SQD", "SQE" otherwise).
	State string
	// PathMTU is the path MTU in bytes (path_mtu): the largest payload of
	// one packet, in both directions.
	PathMTU int
	// AckTimeout is the local ACK timeout (timeout: 4.096 µs x
	// 2^TimeoutExp; 0 with TimeoutExp 0, which means no timeout).
	AckTimeout time.Duration
	TimeoutExp uint8
	// RetryCount is how often a packet is resent without an ACK (retry_cnt).
	RetryCount int
	// RNRRetry is how often a message the peer refused for want of a
	// posted receive is resent (rnr_retry; 7 would mean forever).
	RNRRetry int
	// MinRNRTimer is the RNR NAK timer this side advertises to the peer
	// (min_rnr_timer: MinRNRTimerCode in the IB specification's table).
	MinRNRTimer     time.Duration
	MinRNRTimerCode uint8
	// SendPSN is the next packet sequence number to send (sq_psn), RecvPSN
	// the next one expected (rq_psn).
	SendPSN, RecvPSN uint32
	// ServiceLevel and TrafficClass are the address vector's (ah_attr.sl
	// and grh.traffic_class) for the packets this side sends; HopLimit
	// and SGIDIndex are its GRH's.
	ServiceLevel, TrafficClass int
	HopLimit, SGIDIndex        int
	// MaxInline is the largest payload a send may carry inline
	// (cap.max_inline_data); MaxSendWR and MaxRecvWR the queue depths.
	MaxInline, MaxSendWR, MaxRecvWR int
	// MaxRdAtomic is how many RDMA READs this side has in flight to the
	// peer at most (max_rd_atomic), MaxDestRdAtomic how many of the
	// peer's it serves at once (max_dest_rd_atomic).
	MaxRdAtomic, MaxDestRdAtomic int
	// RemoteAtomic: the QP accepts the peer's atomics (its access flags
	// have IBV_ACCESS_REMOTE_ATOMIC), where both devices have them and
	// both sides' Hellos announced them.
	RemoteAtomic bool
}

// String is the QPInfo on one line, e.g. "QP 0x11 -> 0x12 RTS mtu 1024
// timeout 2.147483648s (n=19) retry_cnt 6 rnr_retry 6 min_rnr_timer
// 655.36ms (code 0) sq_psn 0x5f2b1 rq_psn 0xc1a2 sl 0 tc 0 max_inline 256".
func (i QPInfo) String() string {
	return fmt.Sprintf("QP 0x%x -> 0x%x %s mtu %d timeout %v (n=%d) retry_cnt %d rnr_retry %d "+
		"min_rnr_timer %v (code %d) sq_psn 0x%x rq_psn 0x%x sl %d tc %d max_inline %d",
		i.QPN, i.DestQPN, i.State, i.PathMTU, i.AckTimeout, i.TimeoutExp, i.RetryCount, i.RNRRetry,
		i.MinRNRTimer, i.MinRNRTimerCode, i.SendPSN, i.RecvPSN, i.ServiceLevel, i.TrafficClass, i.MaxInline)
}
