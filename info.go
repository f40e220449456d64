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
//
// An iWARP device (Soft-iWARP, Chelsio, Intel E810 in iWARP mode) holds
// none of InfiniBand's transport attributes: there DestQPN, the timers,
// the retry counts, the PSNs, ServiceLevel and TrafficClass read zero
// (TCP retransmits; docs/devices.md), and State is the library's record
// of the QP (the device reports none).
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

// ConnStats counts the work behind a connection, to check batching and who
// makes progress: doorbells and signaled completions per message should fall
// below one under load, and a waiting caller should find its completion
// itself (InlinePolls) rather than wait for the poller to wake (PollerWakeups)
// and then wake it (Parks).
type ConnStats struct {
	// PostCalls is how many ibv_post_send / ibv_post_recv calls (cgo
	// crossings, doorbells) this connection made; WorkRequests how many work
	// requests they carried.
	PostCalls, WorkRequests uint64
	// The same by queue: send-queue doorbells and work requests, of which
	// Signaled asked for a completion and Inlined carried their payload in
	// the work request; receive-queue doorbells and work requests.
	SendPosts, SendWRs, Signaled, Inlined, RecvPosts, RecvWRs uint64

	// The eight counters below come from the device poller that serves
	// this connection (shared with the other connections it serves). They
	// are diagnostics of how completions are driven (see the package
	// documentation): what each counts follows the implementation and may
	// change with it, so compare them between runs of one version only.
	// PollCalls: cgo polls by the poller's own goroutine; Completions:
	// completions dispatched by anyone; PollerSleeps: times the poller armed
	// the CQ and slept; PollerWakeups: times a completion event woke it.
	PollCalls, Completions, PollerSleeps, PollerWakeups uint64
	// InlinePolls counts cgo polls made by callers waiting in Read, Write,
	// Recv and the like (EmptyPolls of them found nothing); Parks counts
	// waits that spent their spin budget and slept; Arms counts requests
	// for a completion event.
	InlinePolls, EmptyPolls, Parks, Arms uint64
	// KeepaliveProbes counts the keepalive probes this side sent
	// (Config.KeepAlive): none while the peer is heard from.
	KeepaliveProbes uint64
	// DeviceEvents counts the asynchronous events (port down and up,
	// queue pair and CQ errors, device fatal) the connection's device
	// reported since it was opened.
	DeviceEvents uint64
	// BufferBytes is the registered memory the connection's send and
	// receive rings hold now (they grow with traffic: see Config.RecvBuffers).
	BufferBytes uint64
}

// DeviceInfo is what a connection's RDMA device can do, as the library
// reads it once per device (ibv_query_device and the device's transport)
// and chooses its paths by it: docs/devices.md says what each path needs
// and what the library does without it. [Conn.DeviceInfo] returns it;
// verbline-doctor prints the same for every device on the machine.
type DeviceInfo struct {
	Name string // the device's name, e.g. "mlx5_0", "rxe0", "siw0"
	// Transport is "InfiniBand" (InfiniBand and RoCE: a RoCE port's link
	// layer is Ethernet) or "iWARP".
	Transport string
	// MemoryWindows: type 2 memory windows. With them a large message is
	// lent, and an export keyed, through a window valid on this
	// connection's queue pair only; without, through a registration of
	// exactly its bytes, whose key is valid on every connection of the
	// device (docs/limits-and-security.md).
	MemoryWindows bool
	// Immediates: SEND and RDMA WRITE with immediate data. Without them
	// each message's header travels as a trailer in its payload (wire
	// protocol 1.4), and WriteRemoteImm is a write and a notify message.
	Immediates bool
	// Atomics: RDMA compare-and-swap and fetch-and-add (CompareAndSwap,
	// FetchAdd fail with errors.ErrUnsupported without them).
	Atomics bool
	// Datagrams: UD queue pairs, which ListenPacket needs.
	Datagrams bool
	// MaxInline is the largest payload a send of this connection carries
	// inside its work request (the library may ask a device for less
	// inline room than its most: QPInfo.MaxInline is the device's).
	MaxInline int
	// MaxSendSGE and MaxReadSGE: scatter/gather entries of a send and of
	// an RDMA READ's sink.
	MaxSendSGE, MaxReadSGE int
	// ReadDepth is the RDMA READs a queue pair may serve at once.
	ReadDepth int
	// PrivateDataConnect and PrivateDataAccept: the bytes rdma_cm carries
	// for the handshake in a connect request and in an accept.
	PrivateDataConnect, PrivateDataAccept int
	// ActiveSendsFirst: the connecting side must send a connection's first
	// message (iWARP); the library's dialer does, at once.
	ActiveSendsFirst bool
	// SendsCompleteLocally: a send or write completes once the transport
	// took it, before the peer has it (iWARP): a blocking WriteRemote
	// returns before the peer's device checked the key.
	SendsCompleteLocally bool
}

// String is the DeviceInfo on one line, for a log.
func (d DeviceInfo) String() string {
	yes := map[bool]string{true: "yes", false: "no"}
	s := fmt.Sprintf("%s: transport %s; memory windows %s; immediates %s; atomics %s; datagrams %s; inline %d; "+
		"SGEs send %d, READ sink %d; READ depth %d; CM private data %d on connect, %d on accept",
		d.Name, d.Transport, yes[d.MemoryWindows], yes[d.Immediates], yes[d.Atomics], yes[d.Datagrams], d.MaxInline,
		d.MaxSendSGE, d.MaxReadSGE, d.ReadDepth, d.PrivateDataConnect, d.PrivateDataAccept)
	if d.ActiveSendsFirst {
		s += "; the connecting side sends first"
	}
	if d.SendsCompleteLocally {
		s += "; sends complete locally"
	}
	return s
}
