// Package rdma gives Go programs RDMA reliable connections that behave like
// TCP ones. [*Conn] is a [net.Conn], [*Listener] a [net.Listener], and
// [Dialer.DialContext] has the signature of [net.Dialer.DialContext], so
// net/http, net/rpc, gRPC, bufio, io.Copy and anything else that takes a
// listener or a dial function run over InfiniBand or RoCE unchanged. Beside
// the byte stream, a Conn has a zero-copy message view and one-sided access
// to memory the peer exported.
//
// Connections are set up with rdma_cm; queue pairs and their state
// transitions, registered memory and credit-based flow control (the NIC never
// meets a receiver without a posted buffer) stay inside the package. It runs
// on Linux, through cgo, over rdma-core's libibverbs and librdmacm, and needs
// an RDMA device: a RoCE or InfiniBand NIC, or Soft-RoCE on an Ethernet netdev
// (`modprobe -a rdma_rxe rdma_ucm; rdma link add rxe0 type rxe netdev eth0`).
// Addresses are IPs of RDMA-capable netdevs (`rdma link show` lists them).
//
// # Quick start
//
//	ln, err := rdma.Listen("rdma", "192.168.1.10:7471") // port 0: a free port
//	if err != nil { ... }
//	go http.Serve(ln, handler) // or grpc.Server's Serve, rpc.Server's Accept
//
//	c, err := rdma.Dial("rdma", "192.168.1.10:7471") // a *Conn, a net.Conn
//
//	var d rdma.Dialer
//	client := &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
//	resp, err := client.Get("http://192.168.1.10:7471/")
//
// The networks are "rdma", "rdma4" and "rdma6"; DialContext also takes the
// "tcp", "tcp4" and "tcp6" that net/http and gRPC ask for. [Dialer] and
// [ListenConfig] carry a [Config], whose zero value is ready to use (every
// field documents its default). The stream behaves as TCP's: a Write of any
// size returns once every byte is in a posted send buffer; Read and Write
// may run concurrently; [Conn.CloseWrite] half-closes; Close delivers what
// was written (within Config.CloseTimeout) before the peer reads io.EOF, and
// unblocks every call blocked on the Conn.
//
// # Messages without copies
//
// [Conn.Alloc] returns a [buffer.Buf]: registered memory from the device's
// pool, of the length asked for (up to 4 MiB by default). [Conn.Send] posts
// it as one message, and the NIC reads it in place; the receiver gets the
// buffer the NIC wrote into, whole and in order, from [Conn.Recv] or
// [Conn.Messages]:
//
//	b, err := c.Alloc(len(payload))
//	copy(b.Bytes(), payload)
//	err = c.Send(ctx, b) // b is the connection's from here on
//
//	m, err := peer.Recv(ctx) // io.EOF after the sender's CloseWrite or Close
//	use(m.Bytes())           // valid until Release
//	m.Release()              // the buffer goes back to the connection
//
// How long bytes stay valid: a Buf from Alloc is the caller's until Send,
// which takes it over whatever its outcome (do not touch, Send again or
// Release it afterwards) and releases it once the NIC, or for a large
// message the peer, has read it. A received Buf is the receiver's until its
// Release, even past its Conn's Close; after Release the handle is stale
// (Bytes returns nil; a second Release returns an error wrapping
// [buffer.ErrReleased], and panics in a test binary so the faulty line
// shows), and slices taken from Bytes must not be kept.
// A received Buf may itself be given to Send on a connection of the same
// device, passing it on without a copy.
//
// Each received message holds one of the connection's receive buffers and
// the sender's credit for it: a receiver that keeps messages without
// releasing them stops the peer's Send and Write, as a full TCP window
// would (the stream and the messages share the credits). A message larger
// than the peer's receive buffers (Config.BufferSize, 32 KiB by default) is
// not split: the peer reads it from the sender's Buf with one RDMA READ, so
// it too arrives whole, up to [Conn.MaxMessageSize] (4 MiB by default). A
// larger Send fails with [ErrMessageTooLarge]. [Conn.PostSend] is Send whose end
// also arrives on [Conn.Completions].
//
// # One-sided access
//
// Nothing of a process's memory is reachable by a peer unless exported.
// [Conn.Export] makes a Buf from Alloc readable and/or writable by the peer
// until the [Export] is closed or the connection ends; its descriptor
// ([RemoteBuf]: address, length and rkey, 16 bytes encoded by
// [RemoteBuf.AppendTo]) travels to the peer in a message, where
// [ParseRemoteBuf] decodes it:
//
//	exp, err := c.Export(buf, rdma.RemoteWrite|rdma.RemoteRead)
//	defer exp.Close()
//	desc := exp.Remote().AppendTo(nil) // send it to the peer
//
//	remote, err := rdma.ParseRemoteBuf(desc)                 // on the peer
//	err = peer.WriteRemote(ctx, local, remote, offset)       // or ReadRemote
//	err = peer.WriteRemoteImm(ctx, local, remote, offset, 7) // c: Notification{Imm: 7}
//	err = peer.PostWriteRemote(local, remote, offset, id)    // its end: Completions()
//
// [Conn.WriteRemote] and [Conn.ReadRemote] return when the NIC reports the
// transfer complete; the exporter's CPU takes no part and is not told.
// [Conn.WriteRemoteImm] also tells it: a [Notification] with the immediate
// value arrives from [Conn.RecvNotification] or [Conn.Notifications] once
// the bytes are in its memory, and holds a receive buffer until its Release.
// [Conn.PostWriteRemote], [Conn.PostReadRemote] and [Conn.PostSend] return
// once posted; each one's [OpCompletion] arrives on [Conn.Completions] with
// the id given. The connection holds a reference to the local Buf until the
// operation ends, but its bytes must stay untouched until then. Completions
// has room for every operation that can be in flight; a post that might not
// fit fails with [ErrCompletionsFull] rather than block the poller.
//
// An access outside the export, checked against the descriptor first,
// fails with [ErrRemoteAccess] and nothing else happens; one the NIC
// refuses (a forged descriptor, an export already closed) fails with it
// too and ends the connection, as any RC transport error does. On devices
// with type 2 memory windows an export's key is a window bound to its own
// connection: another connection's peer that learns it is refused too.
//
// # Datagrams
//
// [ListenPacket] opens a [*PacketConn], a [net.PacketConn] over an
// unreliable datagram (UD) queue pair. As with UDP, a datagram arrives
// whole or not at all, in no guaranteed order, and is dropped when the
// receiver has no buffer posted; it is at most one packet
// ([PacketConn.MaxDatagramSize]: the port's active MTU minus a 24-byte
// header), and a larger one fails with [ErrDatagramTooLarge]. ReadFrom and
// WriteTo copy; [PacketConn.Alloc], [PacketConn.SendTo] and
// [PacketConn.Recv] (a [Datagram] in the buffer the NIC wrote) do not.
//
// # TCP fallback
//
// [Fallback] on a [ListenConfig] makes the listener accept TCP on the same
// port beside rdma_cm; on a [Dialer], it makes the dial try RDMA first
// (for Fallback.RDMATimeout, 1 s by default) and dial TCP when RDMA cannot
// reach the address: no device, an address on no RDMA netdev, nobody
// listening on rdma_cm, a peer unreachable over RDMA. A connection that
// fell back is a *Conn like the others: [Conn.Transport] says "tcp" and
// [Conn.FallbackReason] returns the RDMA attempt's error; the stream and
// the message view (with copies) work, the one-sided calls fail with
// [ErrNotRDMA]. Both ends must be this library.
//
// # Errors
//
// Errors from a Conn's methods are [*net.OpError] values with Net "rdma";
// Dial, Listen and Accept return *net.OpError too. The end of a stream or
// of the messages is a bare io.EOF. As with net: a deadline error has
// Timeout() true and matches [os.ErrDeadlineExceeded]; after Close, errors
// match [net.ErrClosed]; a peer whose process died gives
// [syscall.ECONNRESET]; nobody listening, [syscall.ECONNREFUSED]. The
// package's sentinels, for [errors.Is], say what to do in their text:
// [ErrNoDevice] (no RDMA device, or rdma_ucm not loaded), [ErrNotRDMAAddress]
// (the IP is on no RDMA netdev), [ErrHandshake] (the peer is not this
// library or speaks another major protocol version, or the listener
// refused; its reason is included), [ErrMemlock] (the locked-memory limit
// is too low for the buffer pool), [ErrMessageTooLarge], [ErrRemoteAccess],
// [ErrCompletionsFull] and [ErrProtocol] (the peer broke the protocol).
// A Config field out of its range fails Dial and Listen with a
// [*ConfigError] naming it, before any device work.
//
// Queue-pair errors say where they happened: a refused state transition
// names the QP number, the transition (INIT->RTR), the attribute mask in
// ibv_qp_attr_mask names and the errno; a failed work completion names the
// operation it belonged to ("RDMA write", "message send"), the QP and its
// status as ibv_wc_status_str spells it. [Conn.QPInfo] returns what the
// device holds for a connection's queue pair (ibv_query_qp), for debugging.
//
// # Configuration
//
// [Config]'s zero value is ready to use; each field documents its default
// and range. The fields come in groups: buffers and flow control
// (RecvBuffers, SendBuffers, BufferSize, MaxMessageSize); timeouts and
// liveness (ConnectTimeout, HandshakeTimeout, CloseTimeout, KeepAlive);
// the RC transport, set on each side's own queue pair (AckTimeout,
// RetryCount, RNRRetry, MinRNRTimer, MaxPathMTU, ServiceLevel,
// TrafficClass); completion polling (PollMode, PollSpin, Pollers,
// PollCPUs, PollNoPin); the device's shared resources (PoolMaxBytes,
// QPPool, DeviceLinger), which, like the polling settings, the device's
// first connection fixes; and the listener's Backlog.
//
// # How completions are driven
//
// A goroutine that waits for a completion polls the device's completion
// queue itself: Read, Write and Send waiting for a credit, Recv,
// RecvNotification, the blocking one-sided calls and Close spin on it for a
// budget learnt from their recent waits (at least Config.PollSpin), then
// park until a completion wakes them. While they spin, the completion they
// wait for is handled on their own goroutine, with no handoff between
// threads. The device's background poller goroutines (Config.Pollers)
// cover what nobody waits for in the package: idle connections, parked
// callers, and users who receive from Messages(), Notifications() or
// Completions(). A receive from those channels waits for whoever polls
// next, usually the poller, which then wakes the receiver: Recv and
// RecvNotification, which poll themselves, have lower latency.
// Config.PollMode changes this (PollBusy: pollers never sleep; PollEvent:
// nobody spins), and [Conn.Stats] counts who polled and who slept.
//
// # Metrics
//
// [ReadMetrics] returns a snapshot of the process's counters, in total and
// by device, over its connections open and closed: connections, bytes and
// messages each way, credit stalls, the work behind them and the
// registered pools, with each device's hardware counters from sysfs
// ([DeviceCounters] reads those for any device, without a connection). The
// data path keeps these counters as atomics anyway; a snapshot only reads
// them. [github.com/verbline/rdma/metrics/rdmaexpvar] publishes it through
// expvar, [github.com/verbline/rdma/metrics/rdmaprom] to Prometheus.
// [Conn.Stats] and [PacketConn.Stats] count one endpoint's work. Their
// polling and completion counters (PollCalls to Arms) are diagnostics
// whose meaning follows the implementation.
//
// # Builds without RDMA
//
// RDMA needs Linux, cgo and rdma-core (libibverbs and librdmacm). Built
// without cgo (CGO_ENABLED=0) or for another system, the package still
// compiles with the same API, so programs that import it build and test
// anywhere; Dial and Listen then fail with an error wrapping ErrNoDevice.
//
// # Examples
//
// The examples that need an RDMA device carry a "Prints:" comment instead
// of "Output:": `go test` compiles them everywhere and runs none of them;
// inside Soft-RoCE (scripts/softroce), TestExamples and TestPacketExamples
// run each one and check that it prints exactly that. Examples that need
// no device, such as [Fallback]'s, have an "Output:". The repository's
// examples/ directory holds complete programs, and docs/ the guides, the
// wire protocol and the measured performance.
package rdma

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Config tunes connections. The zero value is ready to use; every field's
// zero value is documented beside it.
type Config struct {
	// RecvBuffers is how many receive buffers each connection posts at
	// most, which is also the most messages the peer may have in flight
	// (its credits). A connection starts with 4 and doubles them when the
	// peer runs out of credits while the application keeps up with what
	// arrives, as TCP grows its window; an idle connection pins 228 KiB
	// with the default sizes. Each message, however small, takes a whole
	// receive buffer: until this side reads, the peer has at most 3
	// messages (or writes of up to BufferSize) in flight, the last credit
	// being kept for end of stream. 0 means 64; the minimum is 4.
	RecvBuffers int
	// SendBuffers is how many registered send buffers each connection has
	// at most (it starts with 1 and doubles them when a writer has credits
	// but no free buffer); also the most zero-copy Sends in flight.
	// 0 means 64; the minimum is 2.
	SendBuffers int
	// BufferSize is the size of each send and receive buffer in bytes; writes
	// larger than the peer's buffer size are split. 0 means 32 KiB; the
	// minimum is 64.
	BufferSize int
	// MaxMessageSize is the largest message this side accepts on the message
	// view; messages above BufferSize are read from the sender's memory by
	// RDMA READ into a pool buffer of their size. 0 means the pool's largest
	// buffer (4 MiB, or BufferSize if larger); never less than BufferSize.
	MaxMessageSize int
	// MaxUnreadBytes bounds the bytes of received large messages (those
	// above BufferSize, read by RDMA READ into pool buffers) a connection
	// holds until the application releases them. Past it the next large
	// message is read only when the application releases one; the peer,
	// its credits spent, waits meanwhile, and nothing is lost. A message
	// larger than the bound is read when the connection holds none.
	// Besides, all connections on a device together hold at most half of
	// its PoolMaxBytes in such messages, so that however many connections
	// a peer opens, the rest of the pool stays for the others; past that
	// half, a connection holding none still takes one message, so that
	// reading any connection always makes progress. 0 means 16 MiB;
	// negative values are refused.
	MaxUnreadBytes int64
	// ConnectTimeout bounds address and route resolution and the handshake
	// when the dialer has no earlier deadline. 0 means 15 s.
	ConnectTimeout time.Duration
	// CloseTimeout bounds how long Close waits to deliver data already written
	// (and the end-of-stream mark) before it tears the connection down.
	// 0 means 5 s.
	CloseTimeout time.Duration
	// KeepAlive is how long a connection may hear nothing from its peer
	// before it probes it, as net.Dialer.KeepAlive; the probes repeat at
	// that interval while the connection stays silent. 0 means 15 s; a
	// negative value disables them. A probe is a zero-length send into a
	// receive buffer the peer keeps posted for control messages: its NIC
	// acknowledges it
	// without the peer's application taking part, so a slow reader is never
	// mistaken for a dead peer, and a connection that carries traffic sends
	// none. A probe the peer's NIC does not acknowledge fails after the
	// transport's retries: a peer that vanished (host off, partition) is
	// detected within KeepAlive + AckTimeout x (RetryCount + 1), and blocked
	// and later calls fail with an error wrapping syscall.ETIMEDOUT
	// ("connection timed out"), as TCP's keepalive does. Probes need a peer
	// of protocol 1.2 or later (its control-reserve feature); with an
	// older one none is sent. A value below 10 ms probes every 10 ms, the
	// shortest interval the protocol allows.
	KeepAlive time.Duration
	// The RC transport settings below (AckTimeout to TrafficClass) are
	// each side's own: Dial's Config sets the dialer's QP, the
	// ListenConfig's the accepted connections' QPs, and neither is sent to
	// the peer (except that both sides must agree on MaxPathMTU). Out of
	// range values fail Dial and Listen with a *ConfigError naming the
	// field, before any device work. Conn.QPInfo reads back what the QP
	// holds.

	// AckTimeout is the RC transport's local ACK timeout (the QP's
	// timeout attribute, set at RTS): how long this side's NIC waits for
	// an acknowledgement of what it sent before it retransmits. Devices
	// count it as 4.096 µs x 2^n (n = 1..31): it is rounded up to that, up
	// to about 2 h 27 min. 0 means the value rdma_cm derives from the path
	// (on Soft-RoCE with Linux 6.1: n = 19, about 2.1 s, so with the
	// default RetryCount a vanished peer is detected within 15 s + 7 x
	// 2.1 s, about 30 s). Negative values are refused.
	AckTimeout time.Duration
	// RetryCount is how often this side's NIC retransmits an
	// unacknowledged packet before the connection fails (retry_cnt, set at
	// RTS): 1..6; 0 means 6. 7 is refused: some devices, Soft-RoCE among
	// them, take it to mean "retry forever", so a vanished peer would never
	// be detected.
	RetryCount int
	// RNRRetry is how often this side's NIC resends a message the peer's
	// NIC refused for want of a posted receive (an RNR NAK) before the
	// connection fails (rnr_retry, set at RTS): 1..6; 0 means 6. Credit-based
	// flow control means a well-behaved peer never sends one; 7 is refused,
	// as it means "retry forever" and a peer that stopped posting receives
	// would stall this side instead of failing it.
	RNRRetry int
	// ReadDepth is how many RDMA READs and atomics this side's NIC keeps
	// outstanding on the connection (the QP's initiator depth,
	// max_rd_atomic, set at RTS) and how many of the peer's it serves at
	// once (its responder resources, max_dest_rd_atomic, set at RTR):
	// 1..255; 0 means 16. Each side clamps it to its device's limits
	// (max_qp_init_rd_atom, max_qp_rd_atom); rdma_cm carries both numbers
	// in the handshake and each direction uses the smaller of the
	// initiator's depth and the responder's resources, so the two sides may
	// give different values. Conn.QPInfo reads back what the QP holds
	// (MaxRdAtomic, MaxDestRdAtomic; a device may round them up, Soft-RoCE
	// to a power of two). The READs of large messages
	// (rendezvous), ReadRemote and the atomics share the depth: beyond it
	// the NIC holds further ones, and every request posted after them, in
	// order until responses return; none fails for it.
	ReadDepth int
	// MinRNRTimer is how long this side asks the peer's NIC to wait before
	// resending a message it refused for want of a posted receive (the QP's
	// min_rnr_timer, set at RTR and carried in its RNR NAKs): rounded up
	// to the IB specification's table (10 µs, 20 µs, 30 µs, 40 µs, 60 µs, ...
	// 491.52 ms, 655.36 ms). 0 means rdma_cm's value, the table's longest
	// (655.36 ms); negative values and values above 655.36 ms are refused.
	MinRNRTimer time.Duration
	// MaxPathMTU caps the path MTU in bytes (the QP's path_mtu, set at
	// RTR; the largest packet payload): 256..4096, rounded down to 256,
	// 512, 1024, 2048 or 4096. 0 means the path's, as rdma_cm resolves it
	// (the port's active MTU, 1024 on Soft-RoCE over a 1500-byte netdev).
	// The path MTU serves both directions and the two ends must agree
	// (a multi-packet message's middle packets must be exactly one MTU):
	// give both sides the same cap.
	MaxPathMTU int
	// ServiceLevel is the service level of the packets this side sends
	// (the address vector's sl, set at RTR): 0..15. On InfiniBand it picks
	// the virtual lane; on RoCE the NIC maps it to a priority (PCP), and
	// Soft-RoCE keeps none (its QP reads back 0). 0 means
	// rdma_cm's value (0 unless the route maps a type of service).
	ServiceLevel int
	// TrafficClass is the GRH traffic class of the packets this side sends
	// (the address vector's grh.traffic_class, set at RTR): 0..255; on
	// RoCE v2 it is the IP header's DSCP << 2 | ECN, for QoS in the
	// network. 0 means rdma_cm's value (0 unless the id has a type of
	// service).
	TrafficClass int
	// PollMode is how completions are waited for. PollAdaptive (the zero
	// value): a goroutine that waits for a completion (Read, Write waiting
	// for credit, Recv, a blocking one-sided call) polls the CQ itself for a
	// spin budget, then parks; the device's poller goroutine covers what
	// nobody waits for (Messages(), Notifications() and Completions()
	// consumers, idle connections) and sleeps in the Go netpoller.
	// PollBusy: the pollers never sleep (a core per poller at 100%).
	// PollEvent: nobody spins; every wait goes through the completion channel.
	PollMode PollMode
	// PollSpin is the shortest spin budget of a waiting caller; a caller
	// whose recent waits were longer (a slower round trip) spins for their
	// smoothed mean plus four mean deviations, and never less than a park
	// has recently cost (counted up to 500 µs), up to 2 ms (or PollSpin,
	// if larger), before it parks. 0 means 50 µs; a negative value means PollEvent.
	PollSpin time.Duration
	// Pollers is how many pollers serve a device, shared by all the
	// device's connections (least-loaded first). 0 means 1; never more
	// than GOMAXPROCS-1.
	Pollers int
	// PollCPUs are the cores to pin pollers to (each on an OS thread locked
	// to its core). nil means: pinned only when the process may run on at
	// least 4 CPUs, to cores no other process's poller claimed (one per
	// physical core first, highest-numbered first); with fewer CPUs a
	// pinned poller would share the application's core and every hand-over
	// would be a thread switch, so the pollers run as ordinary goroutines.
	PollCPUs []int
	// PollNoPin runs the pollers as ordinary goroutines (no locked OS
	// thread, no affinity) even when PollCPUs is set.
	PollNoPin bool
	// The poller settings and PoolMaxBytes take effect when a device's first
	// connection is set up; connections share a device's pollers and pool.

	// PoolMaxBytes caps the registered buffer pool of each device (send and
	// receive rings and Alloc'd messages). 0 means 1 GiB. The TCP fallback's
	// process-wide pool takes its cap from the first fallback user's.
	PoolMaxBytes int64
	// QPPool is how many queue pairs of closed connections each device
	// keeps, reset, for new connections: a connection that takes one skips
	// creating a QP and attaching it to a completion queue. A QP joins the
	// pool only after its old connection's rdma_cm id reports
	// TIMEWAIT_EXIT (about 2 s after Close on Soft-RoCE: stale packets may
	// arrive until then), so it serves dials made that long after a close.
	// 0 means 64; a negative value disables the pool; at most 4096.
	QPPool int
	// DeviceLinger is how long a device whose last connection closed is
	// kept, with its pollers, registered buffers and QP pool, for the next
	// connection. 0 means 2 s; a negative value tears it down at once; at
	// most 1 h.
	DeviceLinger time.Duration
	// Backlog bounds the listener's connections not yet accepted: those
	// waiting in Accept's queue and those still in their handshake. A
	// connect request beyond it drops the oldest handshake still in
	// progress (so a flood of dialers that never finish cannot lock out a
	// well-behaved one); with Accept's queue itself full, the dialer is
	// refused as overloaded. 0 means 128.
	Backlog int
	// HandshakeTimeout bounds how long a listener waits for a dialer to
	// finish its handshake (from the connect request to established). On
	// a dialer where the connecting side must send first (iWARP) it bounds
	// how long the dialer repeats its first message until the listener
	// answers (docs/devices.md). 0 means 5 s.
	HandshakeTimeout time.Duration
}

func (c *Config) withDefaults() Config {
	out := Config{}
	if c != nil {
		out = *c
	}
	def := func(v *int, d, min int) {
		if *v == 0 {
			*v = d
		}
		if *v < min {
			*v = min
		}
	}
	// 64 x 32 KiB in flight at most: a window of 32 leaves a stream short
	// of the device's rate (ib_send_bw's at 32 KiB) on Soft-RoCE, 64
	// reaches it; windows start small and grow only with traffic.
	def(&out.RecvBuffers, 64, 4)
	def(&out.SendBuffers, 64, 2)
	def(&out.BufferSize, 32<<10, 64)
	// The transport settings' ranges are checked by check, before
	// withDefaults: only the zero values are resolved here.
	if out.RetryCount == 0 {
		out.RetryCount = defaultRetry
	}
	if out.RNRRetry == 0 {
		out.RNRRetry = defaultRetry
	}
	if out.ReadDepth == 0 {
		out.ReadDepth = defaultReadDepth
	}
	if out.KeepAlive == 0 {
		out.KeepAlive = 15 * time.Second // net.Dialer's default
	}
	def(&out.Backlog, 128, 1)
	if out.ConnectTimeout == 0 {
		out.ConnectTimeout = 15 * time.Second
	}
	if out.HandshakeTimeout == 0 {
		out.HandshakeTimeout = 5 * time.Second
	}
	if out.CloseTimeout == 0 {
		out.CloseTimeout = 5 * time.Second
	}
	if out.MaxUnreadBytes == 0 {
		out.MaxUnreadBytes = defaultMaxUnread
	}
	if out.PollSpin == 0 {
		out.PollSpin = 50 * time.Microsecond
	}
	if out.PollSpin < 0 {
		out.PollMode = PollEvent
	}
	return out
}

// PollMode says how completion pollers wait; see Config.PollMode.
type PollMode int

const (
	PollAdaptive PollMode = iota // waiting callers spin for a learnt budget, then park; pollers sleep when idle
	PollBusy                     // pollers never sleep: a core each at 100%
	PollEvent                    // nobody spins: every wait goes through the completion channel
)

// Addr is the address of an RDMA endpoint: an IP of an RDMA-capable netdev
// and an rdma_cm port.
type Addr struct {
	AddrPort netip.AddrPort
}

// Network returns "rdma".
func (a *Addr) Network() string { return "rdma" }

// String returns "host:port".
func (a *Addr) String() string {
	if a == nil {
		return "<nil>"
	}
	return a.AddrPort.String()
}

func checkNetwork(network string) error {
	switch network {
	case "rdma", "rdma4", "rdma6":
		return nil
	}
	return net.UnknownNetworkError(network)
}

// resolve turns "host:port" into an address, looking names up as net does.
func resolve(ctx context.Context, network, address string, listen bool) (netip.AddrPort, error) {
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return netip.AddrPort{}, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		p, perr := net.DefaultResolver.LookupPort(ctx, "tcp", portStr)
		if perr != nil {
			return netip.AddrPort{}, fmt.Errorf("invalid port %q", portStr)
		}
		port = uint64(p)
	}
	if host == "" {
		if !listen {
			return netip.AddrPort{}, errors.New("missing host in address (give an IP of the peer's RDMA netdev)")
		}
		if network == "rdma6" {
			return netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(port)), nil
		}
		return netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(port)), nil
	}
	var ips []netip.Addr
	if ip, perr := netip.ParseAddr(host); perr == nil {
		ips = []netip.Addr{ip}
	} else if ips, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host); err != nil {
		return netip.AddrPort{}, err
	}
	for _, ip := range ips {
		if ip = ip.Unmap(); familyFits(network, ip) {
			return netip.AddrPortFrom(ip, uint16(port)), nil
		}
	}
	family := "IPv4"
	if network == "rdma6" {
		family = "IPv6"
	}
	return netip.AddrPort{}, fmt.Errorf("no suitable address for %s: network %s takes only %s addresses", host, network, family)
}

// familyFits reports whether network takes ip, as net's tcp4 and tcp6 do:
// rdma4 only IPv4, rdma6 only IPv6 (an IPv4-mapped address counts as IPv4).
func familyFits(network string, ip netip.Addr) bool {
	switch network {
	case "rdma4":
		return ip.Is4()
	case "rdma6":
		return !ip.Is4()
	}
	return true
}

// Dial connects to address ("host:port") on network "rdma".
func Dial(network, address string) (*Conn, error) {
	var d Dialer
	return d.dial(context.Background(), network, address)
}

// Listen listens on address ("host:port"; the host must be an IP of an
// RDMA-capable netdev, or empty for all of them; port 0 picks a free port).
func Listen(network, address string) (*Listener, error) {
	var lc ListenConfig
	return lc.Listen(context.Background(), network, address)
}

// Dialer connects to RDMA listeners. The zero value is ready to use.
type Dialer struct {
	// Config tunes the connection.
	Config Config
	// Timeout bounds the whole dial (resolution and handshake); 0 means
	// Config.ConnectTimeout. A context deadline that is earlier wins.
	Timeout time.Duration
	// LocalAddr, if set, is the local address to connect from (its IP picks
	// the device); its port is ignored.
	LocalAddr *Addr
	// Fallback, if set, lets the dial fall back to TCP when RDMA cannot
	// reach the address (see Fallback). nil: RDMA only.
	Fallback *Fallback
}

// DialContext connects to address on network "rdma". It has the signature of
// net.Dialer.DialContext, so it plugs into http.Transport.DialContext and
// grpc.WithContextDialer unchanged; since those ask for "tcp", "tcp4" or
// "tcp6", DialContext takes them to mean "rdma", "rdma4" and "rdma6".
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if strings.HasPrefix(network, "tcp") {
		network = "rdma" + strings.TrimPrefix(network, "tcp")
	}
	c, err := d.dial(ctx, network, address)
	if err != nil {
		return nil, err // a nil *Conn must not become a non-nil net.Conn
	}
	return c, nil
}

func (d *Dialer) dial(ctx context.Context, network, address string) (*Conn, error) {
	ctx, cancel, tg, err := d.prepare(ctx, network, address)
	if err != nil {
		return nil, err
	}
	defer cancel()
	if d.Fallback != nil {
		return d.dialFallback(ctx, network, tg)
	}
	return dialRDMA(ctx, network, tg)
}

// dialTarget is what a dial has checked and resolved before it connects.
type dialTarget struct {
	cfg          Config // with defaults
	laddr, raddr netip.AddrPort
}

// prepare checks the network and the Config, bounds ctx by the dial's
// timeout and resolves address: what every dial, with or without a
// fallback, does first. Its errors are the dial's *net.OpError.
func (d *Dialer) prepare(ctx context.Context, network, address string) (context.Context, context.CancelFunc, dialTarget, error) {
	tg := dialTarget{cfg: d.Config.withDefaults()}
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: network, Addr: dialAddr(address), Err: err}
	}
	if err := checkNetwork(network); err != nil {
		return nil, nil, tg, opErr(err)
	}
	if err := d.Config.check(); err != nil {
		return nil, nil, tg, opErr(err)
	}
	timeout := d.Timeout
	if timeout == 0 {
		timeout = tg.cfg.ConnectTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	raddr, err := resolve(ctx, network, address, false)
	if err != nil {
		cancel()
		return nil, nil, tg, opErr(err)
	}
	tg.raddr = raddr
	if d.LocalAddr != nil {
		tg.laddr = netip.AddrPortFrom(d.LocalAddr.AddrPort.Addr(), 0)
	}
	return ctx, cancel, tg, nil
}

// dialRDMA connects over rdma_cm to the prepared target.
func dialRDMA(ctx context.Context, network string, tg dialTarget) (*Conn, error) {
	c, err := dialConn(ctx, &tg.cfg, tg.laddr, tg.raddr)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Addr: &Addr{tg.raddr}, Err: err}
	}
	return c, nil
}

func dialAddr(address string) net.Addr {
	if ap, err := netip.ParseAddrPort(address); err == nil {
		return &Addr{ap}
	}
	return nil
}

// ListenConfig configures a listener. The zero value is ready to use.
type ListenConfig struct {
	// Config tunes accepted connections (and the listener's backlog).
	Config Config
	// Admit, if set, decides on each connect request before anything is
	// committed to it (no buffer, QP or CQ entry): it gets the dialer's
	// address, and a non-nil error refuses the dialer, who sees the error's
	// text as the reason. It runs on a goroutine of its own, so a slow
	// hook holds up no other dialer, and it may be called concurrently. At
	// most Backlog calls run at once: while that many have not returned,
	// further dialers are refused at once. A request whose hook has not
	// answered within HandshakeTimeout is refused then (the hook's later
	// answer is ignored; a hook that never returns keeps its place).
	Admit func(remote netip.AddrPort) error
	// Fallback, if set, makes the listener accept TCP on the same port too
	// (see Fallback). nil: RDMA only.
	Fallback *Fallback
}

// Listen listens on address; ctx bounds only the set-up.
func (lc *ListenConfig) Listen(ctx context.Context, network, address string) (*Listener, error) {
	if lc.Fallback != nil {
		return lc.listenFallback(ctx, network, address)
	}
	cfg := lc.Config.withDefaults()
	ap, err := lc.listenAddr(ctx, network, address)
	if err != nil {
		return nil, err
	}
	l, err := listen(&cfg, ap, lc.Admit)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Addr: &Addr{ap}, Err: err}
	}
	return l, nil
}

// listenAddr is the first step of every Listen (stream, fallback and
// packet): it checks the network and lc.Config (a device's first user
// fixes its shared settings, so a listener's are checked as a dialer's
// are) and resolves address. Its errors are Listen's *net.OpError.
func (lc *ListenConfig) listenAddr(ctx context.Context, network, address string) (netip.AddrPort, error) {
	err := checkNetwork(network)
	if err == nil {
		err = lc.Config.check()
	}
	var ap netip.AddrPort
	if err == nil {
		ap, err = resolve(ctx, network, address, true)
	}
	if err != nil {
		return ap, &net.OpError{Op: "listen", Net: network, Addr: dialAddr(address), Err: err}
	}
	return ap, nil
}
