//go:build linux && cgo

package ud

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/cmsetup"
	"github.com/verbline/rdma/internal/coarseclock"
	"github.com/verbline/rdma/internal/deadline"
	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/errs"
	"github.com/verbline/rdma/internal/hints"
	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/testhooks"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wait"
	"github.com/verbline/rdma/internal/wire"
)

// Options are what an Endpoint takes from the root package's Config (its
// defaults applied) and from the root package's device glue.
type Options struct {
	// RecvBuffers is the receive ring (datagrams that may wait to be
	// read), SendBuffers the send slots (sends in flight).
	RecvBuffers, SendBuffers int
	// Backlog is the rdma_cm listen backlog of the id that answers other
	// endpoints' address resolutions.
	Backlog int
	// ConnectTimeout bounds one address resolution.
	ConnectTimeout time.Duration
	// PollEvent: a waiter parks at once rather than driving the CQ first
	// (Config.PollMode PollEvent); PollSpin is the least a waiter drives
	// it before parking (Config.PollSpin).
	PollEvent bool
	PollSpin  time.Duration
	// MaxPeers bounds the address handles cached.
	MaxPeers int
	// PeerTTL: a destination neither resolved nor heard from for this
	// long is resolved again (in the background, while sends go on to the
	// address known) at its next send.
	PeerTTL time.Duration
	// Recheck: after a datagram contradicted a destination (see
	// heardLocked) and made a send resolve it again, another
	// contradiction takes effect no sooner than this.
	Recheck time.Duration
	// AcquireDevice returns the shared state of ctx's device: a reference
	// the endpoint releases when it closes.
	AcquireDevice func(ctx *verbs.Context) (*device.Device, error)
}

// Datagram is a received datagram as the endpoint hands it out: the
// receive buffer the NIC wrote the payload into, exactly the payload long,
// and the sender's address.
type Datagram struct {
	Buf  buffer.Buf
	From netip.AddrPort
}

// DatagramType is the type an Endpoint delivers datagrams as: Datagram, or
// a type of the same underlying struct (the root package's public
// Datagram), to and from which the endpoint converts at no cost, so that
// its channel is the public channel type as it is.
type DatagramType interface {
	~struct {
		Buf  buffer.Buf
		From netip.AddrPort
	}
}

// Stats counts an Endpoint's datagrams and the work behind them; the root
// package's PacketStats, which says what each field counts, converts from
// it.
type Stats struct {
	Sent, Received, Dropped                                   uint64
	Resolutions                                               uint64
	Peers                                                     int
	SendPosts, SendWRs, Signaled, Inlined, RecvPosts, RecvWRs uint64
	PollCalls, Completions, PollerSleeps, PollerWakeups       uint64
	InlinePolls, EmptyPolls, Parks, Arms                      uint64
}

// Work-request ids of an endpoint's QP: [token:24][kind:8][index:32]. The
// token (poller.TokenShift) is the endpoint's on the device's shared CQ,
// the kind says what completed, the index which receive buffer or send
// slot. Only the endpoint reads the bits below its token.
const (
	wrRecv = 1 << 32
	wrSend = 2 << 32

	wrKindMask = 0xff << 32
	wrIdxMask  = 0xffffffff
)

// Endpoint is the RDMA side of a PacketConn: the UD queue pair, its rings,
// the peers' address handles and the rdma_cm id that answers address
// resolutions. D is the type datagrams are delivered as (DatagramType).
// The zero Endpoint is made ready by Listen; many goroutines may call it.
type Endpoint[D DatagramType] struct {
	// Immutable after Listen.
	opt          Options
	ap           netip.AddrPort
	ch           *rdmacm.UDChannel
	id           *rdmacm.ID // bound in the UDP port space; answers address resolutions
	dev          *device.Device
	poller       *poller.Poller
	token        uint64
	entries      int
	qp           *verbs.QP
	lim          verbs.PortLimits
	portNum      uint8
	ethernet     bool        // RoCE: a datagram's GRH gives the way back to its sender
	gids         []verbs.GID // the port's GID table, to answer from the GID a datagram came to
	qkey         uint32
	maxPayload   int // largest payload sent and received
	maxInline    int
	nRecv        int
	nSend        int
	repostBatch  int                 // receives posted together (maybeRepostLocked)
	hdr          wire.DatagramHeader // put in front of every datagram
	hdrBytes     []byte              // hdr encoded: the private data of our SIDR answers
	replyBySIDR  bool                // answer senders by resolving their address (IB, where a GRH lacks the LID; tests)
	maxPeers     int                 // opt.MaxPeers
	ttlTicks     int64               // opt.PeerTTL in coarseclock ticks
	recheckTicks int64               // opt.Recheck in coarseclock ticks
	clock        bool                // holds a coarseclock reference
	closing      chan struct{}       // closed by Close
	eventsDone   chan struct{}       // closed when eventLoop exits

	// Synchronized by themselves.
	rdDeadline, wrDeadline deadline.Deadline
	rdSpin, wrSpin         poller.SpinBudget
	chanUser               atomic.Bool
	bg                     sync.WaitGroup // address resolutions in progress
	closeOnce              sync.Once
	closeErr               error // set inside closeOnce
	nSent, nReceived       atomic.Uint64
	dropped, resolutions   atomic.Uint64

	mu         sync.Mutex // guards every field below
	closed     bool       // Close was called
	released   bool       // the QP is gone: completions are ignored
	ringFreed  bool       // the receive ring went back to the pool
	qpErr      error      // the QP failed: every later call returns it
	recv       []buffer.Buf
	recvHdr    buffer.Buf // nRecv slots of HdrSlot bytes: each receive's GRH and header
	slots      []recvSlot[D]
	lent       []bool // receive buffer i is with the user
	recvPosted int
	recvWRs    []verbs.UDRecvWR // scratch for posting receives
	msgs       chan D
	msgsClosed bool
	sendBufs   []buffer.Buf // the send slots' buffers: the header, then a copied payload
	sq         []sendEntry
	sqHead     int
	sqLen      int
	sendSeq    uint64
	sendWRs    []verbs.UDSendWR // scratch, one request
	peers      *PeerCache[*peerEntry]
	resolving  map[netip.AddrPort]*resolution
	resolvers  map[*rdmacm.ID]chan rdmacm.UDEvent
	wake       wait.Wakeup  // the parked waiters
	toRelease  []buffer.Buf // released after mu is dropped
}

const (
	// signalEvery: one send in this many asks for a completion (and
	// every one while the send slots run low); a completion retires every
	// send posted before it.
	signalEvery = 16
)

// peerEntry is one destination: how to reach its QP.
type peerEntry struct {
	addr       netip.AddrPort
	ah         *verbs.AH    // nil until the first send for a peer learned from a datagram
	attr       verbs.AHAttr // the address vector: the resolution's, or a learned peer's (from its datagram's GRH)
	qpn, qkey  uint32
	maxPayload int   // the largest payload the peer accepts
	inflight   int   // sends through ah posted and not retired, and sends about to post
	evicted    bool  // out of the cache: ah is destroyed when inflight reaches 0
	news       int64 // coarseclock.Now() when it was last resolved or heard from
	refreshing bool  // a resolution for it is running
	resolved   bool  // found by this side's address resolution, not learned from a datagram
	doubted    bool  // a datagram contradicted it: the next send resolves the address again
	recheckAt  int64 // coarseclock tick before which a contradiction waits
}

// sendEntry is a posted send, in posting order (the send queue completes
// in order, so one completion retires every entry before it).
type sendEntry struct {
	peer     *peerEntry
	buf      buffer.Buf // SendTo's buffer, released once the device has sent it
	signaled bool
}

// resolution is an address resolution other senders to the same address wait for.
type resolution struct {
	done    chan struct{}
	err     error
	recheck bool // a datagram contradicted the entry cached for the address
}

// recvSlot takes back receive buffer idx when its user releases it.
type recvSlot[D DatagramType] struct {
	p   *Endpoint[D]
	idx int
}

func (r *recvSlot[D]) Recycle(b buffer.Buf) { r.p.recycleRecv(r.idx, b) }

// Listen sets up p, the zero Endpoint, bound to ap, with o; on an error
// it releases whatever it had set up.
func (p *Endpoint[D]) Listen(ap netip.AddrPort, o *Options) (err error) {
	if ap.Addr().IsUnspecified() {
		return hints.Add(fmt.Errorf("%w: a PacketConn needs the IP of one RDMA netdev, not %s "+
			"(its queue pair lives on one device port)", errs.ErrNotRDMAAddress, ap.Addr()))
	}
	ch, err := cmsetup.NewUDChannel()
	if err != nil {
		return err
	}
	p.opt, p.ch = *o, ch
	p.closing = make(chan struct{})
	p.eventsDone = make(chan struct{})
	p.rdDeadline = deadline.New()
	p.wrDeadline = deadline.New()
	p.resolving = make(map[netip.AddrPort]*resolution)
	p.resolvers = make(map[*rdmacm.ID]chan rdmacm.UDEvent)
	p.sendWRs = make([]verbs.UDSendWR, 1)
	p.replyBySIDR = testhooks.ReplyBySIDR.Load()
	p.maxPeers = o.MaxPeers
	p.ttlTicks = max(1, int64((o.PeerTTL+coarseclock.Tick-1)/coarseclock.Tick))
	p.recheckTicks = max(1, int64((o.Recheck+coarseclock.Tick-1)/coarseclock.Tick))
	go p.eventLoop()
	defer func() {
		if err != nil {
			p.teardown()
		}
	}()
	if err = coarseclock.Acquire(); err != nil {
		return err
	}
	p.clock = true
	if p.id, err = ch.CreateUDID(); err != nil {
		return err
	}
	if err = p.id.BindAddr(ap); err != nil {
		return cmsetup.ClassifyResolve(err, netip.Addr{})
	}
	p.ap = p.id.LocalAddr()
	if err = p.setupQP(); err != nil {
		return err
	}
	if err = p.setupRings(); err != nil {
		return err
	}
	return p.id.Listen(o.Backlog)
}

// setupQP creates the UD QP on the device's shared CQ and moves it to RTS
// with the Q_Key and port rdma_cm gives the bound id.
func (p *Endpoint[D]) setupQP() error {
	ctx, err := p.id.Context()
	if err != nil {
		return hints.Add(fmt.Errorf("%w: %w", errs.ErrNotRDMAAddress, err)) // bound, but to no RDMA device
	}
	port, err := ctx.QueryPort(p.id.PortNum())
	if err != nil {
		return err
	}
	if port.State != verbs.PortActive {
		return fmt.Errorf("port %d of %s is %s, not ACTIVE (is the netdev up?)", port.Num, ctx.Name(), port.State)
	}
	if err := ctx.QueryGIDs(port); err != nil {
		return err
	}
	devAttr, err := ctx.QueryDevice()
	if err != nil {
		return err
	}
	p.lim = port.Limits(devAttr)
	p.portNum, p.ethernet, p.gids = port.Num, port.Ethernet, port.GIDs
	if !p.ethernet {
		p.replyBySIDR = true // an IB GRH lacks the sender's LID: resolve its address to answer it
	}
	mtu := port.ActiveMTU.Bytes()
	if mtu <= wire.DatagramHeaderLen {
		return fmt.Errorf("port %d of %s has an active MTU of %d bytes: no room for a datagram", port.Num, ctx.Name(), mtu)
	}
	p.maxPayload = mtu - wire.DatagramHeaderLen
	if p.dev, err = p.opt.AcquireDevice(ctx); err != nil {
		return err
	}
	if err = p.dev.Caps.DatagramError(p.dev.Name()); err != nil {
		return err // iWARP: RC only
	}
	p.nRecv, p.nSend = p.opt.RecvBuffers, p.opt.SendBuffers
	p.repostBatch = max(1, min(16, p.nRecv/8))
	p.entries = p.nRecv + p.nSend
	pl, tok, err := p.dev.Pollers.Attach(p.handleCompletions, p.entries)
	if err != nil {
		return err
	}
	p.poller, p.token = pl, uint64(tok)<<poller.TokenShift
	qpc := verbs.QPConfig{SendCQ: pl.CQ(), RecvCQ: pl.CQ(), SendWR: p.nSend, RecvWR: p.nRecv, InlineData: device.InlineRequest}
	if p.qp, _, err = device.CreateQP(p.dev.PD.CreateUDQP, qpc, &p.dev.InlineGranted); err != nil {
		return err
	}
	p.maxInline = p.qp.MaxInline
	attr, mask, err := p.id.InitQPAttr(verbs.StateInit) // pkey index, port, Q_Key
	if err != nil {
		return err
	}
	p.qkey = attr.QKey
	if err := p.qp.Modify(&attr, mask, p.lim); err != nil {
		return err
	}
	if err := p.qp.Modify(&verbs.QPAttr{State: verbs.StateRTR}, verbs.AttrState, p.lim); err != nil {
		return err
	}
	rts := verbs.QPAttr{State: verbs.StateRTS, SQPSN: rand.Uint32() & 0xffffff}
	if err := p.qp.Modify(&rts, verbs.AttrState|verbs.AttrSQPSN, p.lim); err != nil {
		return err
	}
	p.hdr = wire.DatagramHeader{Port: p.ap.Port(), MaxPayload: uint16(p.maxPayload), Addr: p.ap.Addr().Unmap()}
	p.hdrBytes = p.hdr.AppendTo(nil)
	return nil
}

// setupRings takes the send and receive buffers from the device's pool and
// posts every receive.
func (p *Endpoint[D]) setupRings() error {
	pool := p.dev.Pool
	var err error
	if p.recvHdr, err = pool.Get(p.nRecv * HdrSlot); err != nil {
		return err
	}
	p.slots = make([]recvSlot[D], p.nRecv)
	p.lent = make([]bool, p.nRecv)
	for i := 0; i < p.nRecv; i++ {
		b, err := pool.Get(p.maxPayload)
		if err != nil {
			return err
		}
		p.slots[i] = recvSlot[D]{p, i}
		b.SetRecycler(&p.slots[i])
		p.recv = append(p.recv, b)
	}
	for i := 0; i < p.nSend; i++ {
		b, err := pool.Get(p.maxPayload + wire.DatagramHeaderLen)
		if err != nil {
			return err
		}
		p.sendBufs = append(p.sendBufs, b)
	}
	p.sq = make([]sendEntry, p.nSend)
	p.msgs = make(chan D, p.nRecv) // at most nRecv buffers can be lent at once
	p.peers = NewPeerCache(p.maxPeers, p.evictLocked)
	p.recvWRs = make([]verbs.UDRecvWR, 0, p.nRecv)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.recv {
		p.recvWRs = append(p.recvWRs, p.recvWR(i))
	}
	return p.repostLocked()
}

func (p *Endpoint[D]) recvWR(i int) verbs.UDRecvWR {
	b := p.recv[i]
	return verbs.UDRecvWR{WRID: p.token | wrRecv | uint64(i),
		HdrAddr: p.recvHdr.Addr() + uint64(i*HdrSlot), HdrLen: HdrSlot, HdrLKey: p.recvHdr.LKey(),
		Addr: b.Addr(), Len: uint32(b.Cap()), LKey: b.LKey()}
}

// maybeRepostLocked posts the receives collected in recvWRs once there are
// repostBatch of them: at most repostBatch-1 receive buffers ever wait,
// neither posted nor with the user, and posting them costs a cgo call per
// batch rather than per datagram.
func (p *Endpoint[D]) maybeRepostLocked() {
	if len(p.recvWRs) >= p.repostBatch {
		p.repostLocked()
	}
}

// repostLocked posts the receives collected in recvWRs.
func (p *Endpoint[D]) repostLocked() error {
	if len(p.recvWRs) == 0 {
		return nil
	}
	n := len(p.recvWRs)
	err := p.qp.PostRecvUDs(p.recvWRs)
	p.recvWRs = p.recvWRs[:0]
	if err != nil {
		p.failLocked(err)
		return err
	}
	p.recvPosted += n
	return nil
}

// ReadFrom copies the next datagram's payload into b (truncated to b) and
// returns its length and sender, waiting as Recv does.
func (p *Endpoint[D]) ReadFrom(b []byte) (int, netip.AddrPort, error) {
	dd, err := p.Recv(context.Background())
	if err != nil {
		return 0, netip.AddrPort{}, err
	}
	d := Datagram(dd)
	n := copy(b, d.Buf.Bytes())
	d.Buf.Release()
	return n, d.From, nil
}

// Recv takes the next datagram, bounded by ctx (which may be nil), the
// read deadline and Close, driving the CQ while it waits (as Conn's Recv
// does): a completion handled on the waiting goroutine needs no wake-up of
// the poller's thread.
func (p *Endpoint[D]) Recv(ctx context.Context) (D, error) {
	var w poller.Waiter
	defer w.End()
	for {
		if err := p.readable(ctx); err != nil {
			return D{}, err
		}
		select {
		case d, ok := <-p.msgs:
			return p.received(d, ok)
		default:
		}
		if !p.spinWait(&w, &p.rdSpin) {
			break
		}
	}
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	select {
	case d, ok := <-p.msgs:
		return p.received(d, ok)
	case <-p.rdDeadline.Wait():
		return D{}, os.ErrDeadlineExceeded
	case <-p.closing:
		return D{}, net.ErrClosed
	case <-done:
		return D{}, ctx.Err()
	}
}

// readable reports why a read must not go on: Close, ctx or the deadline
// (checked before any datagram is taken, as net does: a read past its
// deadline fails even when datagrams wait).
func (p *Endpoint[D]) readable(ctx context.Context) error {
	if p.isClosed() {
		return net.ErrClosed
	}
	if ctx != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	if p.rdDeadline.Expired() {
		return os.ErrDeadlineExceeded
	}
	return nil
}

func (p *Endpoint[D]) received(d D, ok bool) (D, error) {
	if ok {
		return d, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.qpErr == nil {
		return D{}, net.ErrClosed
	}
	return D{}, p.qpErr
}

// spinWait drives the CQ for a waiting caller (as the root package's
// engine.spinWait does for a connection).
func (p *Endpoint[D]) spinWait(w *poller.Waiter, est *poller.SpinBudget) bool {
	if !w.Started() {
		wait.Start(w, p.poller, est, p.opt.PollEvent, p.opt.PollSpin)
	}
	return w.Spin()
}

// Send posts one datagram to `to`: payload copied into a send slot, or zb
// (when valid) by reference. It waits (bounded by ctx, which may be nil,
// the write deadline and Close) for a free send slot and, for an address
// not yet known, for its resolution.
func (p *Endpoint[D]) Send(ctx context.Context, payload []byte, zb buffer.Buf, to netip.AddrPort) error {
	to = netip.AddrPortFrom(to.Addr().Unmap(), to.Port())
	if !to.Addr().IsValid() || to.Addr().IsUnspecified() || to.Port() == 0 {
		return fmt.Errorf("invalid destination %s (want the ip:port of a PacketConn)", to)
	}
	n := len(payload)
	if zb.Valid() {
		n = zb.Len()
	}
	if p.wrDeadline.Expired() { // as net: a write past its deadline fails, even one that would not wait
		return os.ErrDeadlineExceeded
	}
	if n > p.maxPayload {
		return fmt.Errorf("%w: %d bytes, limit %d", errs.ErrDatagramTooLarge, n, p.maxPayload)
	}
	peer, err := p.peerFor(ctx, to, n) // holds a reservation on peer (inflight)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	posted := false
	defer func() {
		if !posted {
			p.putPeerLocked(peer)
		}
	}()
	if n > peer.maxPayload {
		return fmt.Errorf("%w: %d bytes, %s accepts at most %d", errs.ErrDatagramTooLarge, n, to, peer.maxPayload)
	}
	if err := p.waitSendSlotLocked(ctx); err != nil {
		return err
	}
	if err := p.postDatagramLocked(peer, payload, zb, n); err != nil {
		return err
	}
	posted = true
	return nil
}

// waitSendSlotLocked waits (bounded by ctx and the write deadline) until
// the send ring has a free slot. Called with p.mu held.
func (p *Endpoint[D]) waitSendSlotLocked(ctx context.Context) error {
	var w poller.Waiter
	defer w.End()
	for {
		if p.closed {
			return net.ErrClosed
		}
		if p.qpErr != nil {
			return p.qpErr
		}
		if p.sqLen < p.nSend {
			break
		}
		if err := p.waitLocked(ctx, &p.wrDeadline, &w); err != nil {
			return err
		}
	}
	return nil
}

// postDatagramLocked posts one datagram of n bytes to peer in the send
// ring's next slot: the header, then payload copied behind it or the
// zero-copy buffer zb as a second entry; inline when it fits. Called with
// p.mu held and a free slot.
func (p *Endpoint[D]) postDatagramLocked(peer *peerEntry, payload []byte, zb buffer.Buf, n int) error {
	slot := (p.sqHead + p.sqLen) % p.nSend
	sb := p.sendBufs[slot]
	full := sb.Full()
	copy(full, p.hdrBytes)
	wr := &p.sendWRs[0]
	*wr = verbs.UDSendWR{WRID: p.token | wrSend | uint64(slot),
		HdrAddr: sb.Addr(), HdrLen: wire.DatagramHeaderLen, HdrLKey: sb.LKey(),
		RemoteQPN: peer.qpn, QKey: peer.qkey}
	wr.SetAH(peer.ah)
	if zb.Valid() {
		wr.Addr, wr.Len, wr.LKey = zb.Addr(), uint32(n), zb.LKey()
	} else {
		copy(full[wire.DatagramHeaderLen:], payload)
		wr.HdrLen += uint32(n) // one entry: header and payload are contiguous
	}
	if wire.DatagramHeaderLen+n <= p.maxInline {
		wr.Flags |= verbs.SendInline
	}
	// Signal one send in signalEvery, every one while the slots run low
	// (so a full ring always has a completion coming), and every zero-copy
	// send (its buffer goes back promptly: it may be a receive buffer).
	signaled := zb.Valid() || p.sendSeq%signalEvery == 0 || p.nSend-p.sqLen <= signalEvery
	if signaled {
		wr.Flags |= verbs.SendSignaled
	}
	if err := p.qp.PostSendUDs(p.sendWRs); err != nil {
		p.failLocked(err)
		return err
	}
	p.sq[slot] = sendEntry{peer: peer, buf: zb, signaled: signaled}
	p.sqLen++
	p.sendSeq++
	p.nSent.Add(1)
	return nil
}

// waitLocked waits for a state change, ctx, the deadline or Close, driving
// the CQ meanwhile (as the root package's engine.waitLocked). Called with
// p.mu held; returns with it held.
func (p *Endpoint[D]) waitLocked(ctx context.Context, d *deadline.Deadline, w *poller.Waiter) error {
	if d.Expired() {
		return os.ErrDeadlineExceeded
	}
	if ctx != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	if !w.Started() || w.Spinning() {
		p.mu.Unlock()
		p.spinWait(w, &p.wrSpin)
		p.mu.Lock()
		return nil
	}
	wake := p.wake.Wait()
	p.mu.Unlock()
	defer p.mu.Lock()
	return wait.Park(ctx, wake, d, p.closing)
}

func (p *Endpoint[D]) broadcast() { p.wake.Broadcast() }

// handleCompletions applies a batch of completions. The device's poller
// (or a waiting caller driving the CQ) calls it; it never blocks: Messages
// has room for every receive buffer.
func (p *Endpoint[D]) handleCompletions(wcs []verbs.WC) {
	p.mu.Lock()
	if p.released {
		p.mu.Unlock()
		return
	}
	for i := range wcs {
		wc := &wcs[i]
		idx := int(wc.WRID & wrIdxMask)
		if wc.WRID&wrKindMask == wrRecv {
			p.recvPosted--
			p.recvLocked(wc, idx)
			continue
		}
		p.sendDoneLocked(wc, idx)
	}
	p.maybeRepostLocked()
	p.broadcast()
	rel := p.toRelease
	p.toRelease = p.toRelease[:0]
	p.mu.Unlock()
	// Outside mu: a forwarded receive buffer recycles into this PacketConn.
	for i := range rel {
		rel[i].Release()
		rel[i] = buffer.Buf{}
	}
}

// recvLocked handles the receive completion of buffer idx.
func (p *Endpoint[D]) recvLocked(wc *verbs.WC, idx int) {
	if wc.Status != verbs.WCSuccess {
		if wc.Status == verbs.WCWRFlushErr {
			return // the QP is going down (Close, or a failure)
		}
		p.dropped.Add(1) // e.g. a datagram larger than the buffer: the QP goes on
		p.recvWRs = append(p.recvWRs, p.recvWR(idx))
		return
	}
	if p.msgsClosed {
		return // the PacketConn failed: nothing more is delivered (teardown frees the buffer)
	}
	b := p.recv[idx]
	from, ok := p.parseLocked(wc, p.recvHdr.Full()[idx*HdrSlot:(idx+1)*HdrSlot], b.Cap())
	if !ok {
		p.dropped.Add(1)
		p.recvWRs = append(p.recvWRs, p.recvWR(idx))
		return
	}
	b.SetLen(int(wc.ByteLen) - HdrSlot)
	p.lent[idx] = true
	p.nReceived.Add(1)
	p.msgs <- D(Datagram{Buf: b, From: from})
}

// parseLocked reads who sent the datagram whose GRH and header are in
// slot, checks it (ParseDatagram; room is the payload buffer's size), and
// records what it proves about its sender (heardLocked).
func (p *Endpoint[D]) parseLocked(wc *verbs.WC, slot []byte, room int) (netip.AddrPort, bool) {
	h, g, ok := ParseDatagram(slot, wc.ByteLen, room, wc.HasGRH(), p.ethernet)
	if !ok {
		return netip.AddrPort{}, false
	}
	from := h.AddrPort()
	if !p.ethernet {
		p.heardLocked(from, wc.SrcQP, uint16(wc.SLID), int(h.MaxPayload), nil)
	} else {
		p.heardLocked(from, wc.SrcQP, 0, int(h.MaxPayload), &g)
	}
	return from, true
}

// heardLocked records a datagram that says it comes from `from`, sent by
// QP srcQP from source LID slid (InfiniBand) or with GRH g (RoCE, nil on
// InfiniBand). A datagram changes only what it proves about its sender:
//
//   - The fabric proves the sending QP's number and, on InfiniBand, its
//     port's LID; on RoCE the GRH proves the IP address (ParseDatagram
//     checked it against the header). Nothing proves the port in the
//     header: any QP on the same host (RoCE) or anywhere (InfiniBand) can
//     claim any port.
//   - A datagram matching a cached entry (its QP number, and on
//     InfiniBand its LID) says that the peer is still there: an entry this
//     side resolved is fresh again (no background resolution for another
//     TTL). Nothing else changes: a PacketConn's max payload is fixed for
//     its QP's lifetime, and the one cached came with the entry.
//   - A datagram contradicting a cached entry (another QP, or another LID)
//     neither evicts nor rewrites it: it marks it doubted, and the next
//     send to that address resolves it again before it goes, at most once
//     per Options.Recheck after such a resolution. A peer that restarted on the
//     same port is found so; a forger makes the sender resolve, no more.
//   - A datagram from an address not cached teaches the way back (RoCE
//     only; on InfiniBand an answer resolves the address): a learnt entry,
//     whose max payload is the datagram's (at most ours), which is
//     resolved in the background one TTL after it was learnt whatever
//     datagrams follow, and which a send larger than its max payload
//     resolves at once. Learnt entries evict only each other (PeerCache),
//     so a flood of datagrams from new sources evicts no entry this side
//     resolved.
func (p *Endpoint[D]) heardLocked(from netip.AddrPort, srcQP uint32, slid uint16, maxPayload int, g *wire.GRH) {
	if e, ok := p.peers.Get(from); ok {
		if e.qpn == srcQP && (p.ethernet || e.attr.DLID == slid) {
			if e.resolved {
				e.news = coarseclock.Now()
			}
			return
		}
		e.doubted = true
		return
	}
	if g == nil || p.replyBySIDR {
		return
	}
	attr, ok := p.replyAttr(g)
	if !ok {
		return
	}
	e := &peerEntry{addr: from, attr: attr, qpn: srcQP, qkey: p.qkey,
		maxPayload: min(max(maxPayload, 1), p.maxPayload), news: coarseclock.Now()}
	p.peers.PutLearned(from, e)
}

// replyAttr is the address vector back to a datagram's sender: its source
// GID, sent from the GID of ours it came to (of the RoCE version it came
// with).
func (p *Endpoint[D]) replyAttr(g *wire.GRH) (verbs.AHAttr, bool) {
	sgid := -1
	for _, gid := range p.gids {
		if gid.Raw != g.Dst {
			continue
		}
		if g.IPv4 && gid.Type != verbs.GIDTypeRoCEv2 {
			continue
		}
		if sgid < 0 || gid.Type == verbs.GIDTypeRoCEv2 {
			sgid = gid.Index
		}
	}
	if sgid < 0 || sgid > 255 {
		return verbs.AHAttr{}, false
	}
	hop := g.HopLimit
	if hop <= 1 {
		hop = 64
	}
	return verbs.AHAttr{IsGlobal: true, DGID: g.Src, SGIDIndex: uint8(sgid), HopLimit: hop,
		TrafficClass: g.TrafficClass, PortNum: p.portNum}, true
}

// sendDoneLocked retires every send up to and including slot idx.
func (p *Endpoint[D]) sendDoneLocked(wc *verbs.WC, idx int) {
	if wc.Status != verbs.WCSuccess && wc.Status != verbs.WCWRFlushErr {
		// A UD send fails only on a local error (a bad key, a destroyed
		// address handle): the library's fault, and the QP is down.
		p.failLocked(wc.ErrOp("datagram send"))
	}
	for p.sqLen > 0 {
		k := p.sqHead
		e := &p.sq[k]
		p.putPeerLocked(e.peer)
		if e.buf.Valid() {
			p.toRelease = append(p.toRelease, e.buf)
		}
		*e = sendEntry{}
		p.sqHead = (k + 1) % p.nSend
		p.sqLen--
		if k == idx {
			break
		}
	}
}

// failLocked records a fatal error: every later call returns it.
func (p *Endpoint[D]) failLocked(err error) {
	if p.qpErr != nil {
		return
	}
	p.qpErr = err
	if s := p.qp.State(); s != verbs.StateErr && s != verbs.StateReset {
		p.qp.Modify(&verbs.QPAttr{State: verbs.StateErr}, verbs.AttrState, p.lim)
	}
	p.closeMessagesLocked()
	p.broadcast()
}

func (p *Endpoint[D]) closeMessagesLocked() {
	if !p.msgsClosed {
		p.msgsClosed = true
		close(p.msgs)
	}
}

// recycleRecv takes back a receive buffer its user released and posts it again.
func (p *Endpoint[D]) recycleRecv(idx int, b buffer.Buf) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lent[idx] = false
	p.recv[idx] = b
	if p.released {
		if p.ringFreed { // else teardown frees it with the ring
			b.Free()
			p.dev.BufReturned()
		}
		return
	}
	if p.qpErr != nil {
		return
	}
	p.recvWRs = append(p.recvWRs, p.recvWR(idx))
	p.maybeRepostLocked()
}

// peerFor returns the cached peer for `to`, resolving its address first if
// needed, with a reservation (inflight) the caller gives back with
// putPeerLocked or by posting a send through it. n is the payload's size:
// a peer learned from a datagram that accepts less is resolved first, as
// is one a datagram contradicted (heardLocked).
func (p *Endpoint[D]) peerFor(ctx context.Context, to netip.AddrPort, n int) (*peerEntry, error) {
	p.mu.Lock()
	for {
		if p.closed {
			p.mu.Unlock()
			return nil, net.ErrClosed
		}
		e, ok := p.peers.Get(to)
		if ok && (e.doubted || (!e.resolved && n > e.maxPayload)) &&
			coarseclock.Now() >= e.recheckAt && p.resolving[to] == nil {
			// Resolve the address again and send through what it finds.
			e.doubted = false
			e.recheckAt = coarseclock.Now() + p.recheckTicks
			ok = false
		}
		if ok {
			if e.ah == nil {
				ah, err := p.dev.PD.CreateAH(&e.attr)
				if err != nil {
					// The learned way back did not work: resolve instead.
					p.peers.Remove(to)
					p.evictLocked(to, e)
					continue
				}
				e.ah = ah
			}
			if !e.refreshing && coarseclock.Now()-e.news > p.ttlTicks {
				e.refreshing = true
				p.bg.Add(1)
				go p.refresh(e)
			}
			e.inflight++
			p.mu.Unlock()
			return e, nil
		}
		r := p.resolving[to]
		if r == nil {
			r = &resolution{done: make(chan struct{}), recheck: e != nil}
			p.resolving[to] = r
			p.bg.Add(1)
			go p.resolveInto(to, r)
		}
		p.mu.Unlock()
		if err := p.waitResolution(ctx, r); err != nil {
			return nil, err
		}
		p.mu.Lock()
	}
}

// waitResolution waits for r, bounded by ctx, the write deadline and Close.
func (p *Endpoint[D]) waitResolution(ctx context.Context, r *resolution) error {
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	select {
	case <-r.done:
		return r.err
	case <-p.wrDeadline.Wait():
		return os.ErrDeadlineExceeded
	case <-p.closing:
		return net.ErrClosed
	case <-done:
		return ctx.Err()
	}
}

// resolveInto resolves `to` and caches the result; waiters learn the
// outcome from r.
func (p *Endpoint[D]) resolveInto(to netip.AddrPort, r *resolution) {
	defer p.bg.Done()
	e, err := p.resolveSIDR(to)
	p.mu.Lock()
	delete(p.resolving, to)
	r.err = err
	if err == nil {
		if p.released {
			e.ah.Close()
		} else {
			if old, ok := p.peers.Get(to); ok { // cached meanwhile, or being checked again
				p.peers.Remove(to)
				p.evictLocked(to, old)
			}
			if r.recheck {
				e.recheckAt = coarseclock.Now() + p.recheckTicks
			}
			p.addPeerLocked(e)
		}
	}
	p.mu.Unlock()
	close(r.done)
}

// refresh resolves a stale peer again while sends go on to the address
// known, and replaces it with what the resolution found.
func (p *Endpoint[D]) refresh(old *peerEntry) {
	defer p.bg.Done()
	e, err := p.resolveSIDR(old.addr)
	p.mu.Lock()
	defer p.mu.Unlock()
	old.refreshing = false
	if err != nil {
		// Keep sending to the address known; a send after another TTL
		// without news tries again.
		old.news = coarseclock.Now()
		return
	}
	if p.released || old.evicted {
		e.ah.Close()
		return
	}
	p.peers.Remove(old.addr)
	p.evictLocked(old.addr, old)
	p.addPeerLocked(e)
}

// addPeerLocked caches e (evicting the least recently used beyond
// opt.MaxPeers).
func (p *Endpoint[D]) addPeerLocked(e *peerEntry) {
	e.news = coarseclock.Now()
	p.peers.Put(e.addr, e)
}

// evictLocked takes e out of use (it is no longer in the cache): its
// address handle goes once no send through it is outstanding.
func (p *Endpoint[D]) evictLocked(_ netip.AddrPort, e *peerEntry) {
	e.evicted = true
	if e.inflight == 0 && e.ah != nil {
		e.ah.Close()
		e.ah = nil
	}
}

// putPeerLocked ends a send's use of e.
func (p *Endpoint[D]) putPeerLocked(e *peerEntry) {
	if e == nil {
		return
	}
	e.inflight--
	if e.evicted && e.inflight == 0 && e.ah != nil {
		e.ah.Close()
		e.ah = nil
	}
}

// resolveSIDR asks rdma_cm for the way to the PacketConn bound at `to`
// (an SIDR exchange in the UDP port space): an address vector, its QP
// number and Q_Key; the answer's private data is that PacketConn's
// datagram header, which says how large a datagram it accepts.
func (p *Endpoint[D]) resolveSIDR(to netip.AddrPort) (_ *peerEntry, err error) {
	id, err := p.ch.CreateUDID()
	if err != nil {
		return nil, err
	}
	evs := make(chan rdmacm.UDEvent, 4)
	p.mu.Lock()
	p.resolvers[id] = evs
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.resolvers, id)
		p.mu.Unlock()
		id.Destroy()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), p.opt.ConnectTimeout)
	defer cancel()
	next := func(want rdmacm.EventType) (rdmacm.UDEvent, error) {
		select {
		case ev := <-evs:
			if ev.Type != want {
				return ev, eventError(ev, to)
			}
			return ev, nil
		case <-ctx.Done():
			return rdmacm.UDEvent{}, fmt.Errorf("resolving %s: no answer within %v: %w", to, p.opt.ConnectTimeout, os.ErrDeadlineExceeded)
		case <-p.closing:
			return rdmacm.UDEvent{}, net.ErrClosed
		}
	}
	if err := id.ResolveAddr(netip.AddrPortFrom(p.ap.Addr(), 0), to, cmsetup.MsUntil(ctx)); err != nil {
		return nil, cmsetup.ClassifyResolve(err, to.Addr())
	}
	if _, err := next(rdmacm.EventAddrResolved); err != nil {
		return nil, err
	}
	if err := id.ResolveRoute(cmsetup.MsUntil(ctx)); err != nil {
		return nil, err
	}
	if _, err := next(rdmacm.EventRouteResolved); err != nil {
		return nil, err
	}
	if err := id.Connect(rdmacm.ConnParam{QPNum: p.qp.Num}); err != nil {
		return nil, err
	}
	ev, err := next(rdmacm.EventEstablished)
	if err != nil {
		return nil, err
	}
	e := &peerEntry{addr: to, attr: ev.AH, qpn: ev.QPNum, qkey: ev.QKey, maxPayload: p.maxPayload, resolved: true}
	if h, err := wire.ParseDatagramHeader(ev.PrivateData); err == nil {
		e.maxPayload = min(e.maxPayload, int(h.MaxPayload))
	}
	if e.ah, err = p.dev.PD.CreateAH(&ev.AH); err != nil {
		return nil, fmt.Errorf("address handle for %s: %w", to, err)
	}
	p.resolutions.Add(1)
	return e, nil
}

// SIDR answer statuses (enum ib_cm_sidr_status) rdma_cm reports in an
// EventUnreachable.
const (
	sidrUnsupported = 1 // nobody listens on the port (service id)
	sidrReject      = 2
	sidrNoQP        = 3
)

func eventError(ev rdmacm.UDEvent, to netip.AddrPort) error {
	if err, ok := cmsetup.ResolveError(ev.Type, ev.Status, "to "+to.Addr().String()); ok {
		return err
	}
	switch ev.Type {
	case rdmacm.EventUnreachable:
		switch {
		case ev.Status == sidrUnsupported || ev.Status == sidrNoQP:
			return fmt.Errorf("no PacketConn listens on %s: %w", to, syscall.ECONNREFUSED)
		case ev.Status == sidrReject:
			return fmt.Errorf("the PacketConn on %s refused the address resolution (closing?): %w", to, syscall.ECONNREFUSED)
		case ev.Status < 0:
			return fmt.Errorf("resolving %s: %w", to, syscall.Errno(-ev.Status))
		}
		return fmt.Errorf("resolving %s: SIDR status %d: %w", to, ev.Status, syscall.EHOSTUNREACH)
	}
	return fmt.Errorf("unexpected rdma_cm event %s (status %d) while resolving %s", ev.Type, ev.Status, to)
}

// eventLoop answers other PacketConns' address resolutions (with our QP
// number, and our datagram header as private data) and hands the events of
// our own resolutions to resolveSIDR. It reads UDEvents until the channel
// is stopped, so every connect request's id gets destroyed.
func (p *Endpoint[D]) eventLoop() {
	defer close(p.eventsDone)
	for ev := range p.ch.UDEvents() {
		if ev.Type == rdmacm.EventConnectRequest {
			if p.isClosed() {
				ev.ID.Reject(nil)
			} else {
				ev.ID.Accept(rdmacm.ConnParam{QPNum: p.qp.Num, PrivateData: p.hdrBytes})
			}
			ev.ID.Destroy()
			continue
		}
		p.mu.Lock()
		c := p.resolvers[ev.ID]
		p.mu.Unlock()
		if c != nil {
			select {
			case c <- ev:
			default: // a resolution takes three events at most
			}
		}
	}
}

// teardown releases everything Listen set up, in reverse order; it also
// undoes a Listen that failed halfway.
func (p *Endpoint[D]) teardown() error {
	var errs []error
	p.mu.Lock()
	p.closed = true
	p.released = true // from here on completions are ignored
	p.mu.Unlock()
	if p.id != nil {
		errs = append(errs, p.id.Destroy()) // no more resolutions answered
	}
	p.bg.Wait() // resolutions in progress see p.closing (or fail) and destroy their ids
	if p.chanUser.Load() {
		p.poller.RemoveChannelUser()
	}
	if p.qp != nil {
		errs = append(errs, p.qp.Close()) // nothing touches our memory after this
	}
	if p.poller != nil {
		p.poller.Detach(uint32(p.token>>poller.TokenShift), p.entries)
	}
	p.mu.Lock()
	if p.msgs != nil {
		p.closeMessagesLocked()
	}
	var rel []buffer.Buf
	for i := range p.sq {
		if p.sq[i].buf.Valid() {
			rel = append(rel, p.sq[i].buf)
		}
		// A send still posted holds its peer: an evicted peer's address
		// handle waits for it, and no completion comes now (the QP is
		// gone), so the PD would stay busy and the device's teardown fail.
		p.putPeerLocked(p.sq[i].peer)
		p.sq[i] = sendEntry{}
	}
	if p.peers != nil {
		p.peers.Each(func(_ netip.AddrPort, e *peerEntry) {
			e.inflight = 0
			p.evictLocked(e.addr, e)
		})
		p.peers = NewPeerCache(p.maxPeers, p.evictLocked)
	}
	p.mu.Unlock()
	// Datagrams delivered and never read go back now (Messages is closed,
	// so this ends).
	if p.msgs != nil {
		for d := range p.msgs {
			Datagram(d).Buf.Release()
		}
	}
	for _, b := range rel {
		b.Release()
	}
	p.mu.Lock()
	p.ringFreed = true
	for i, b := range p.recv {
		if !p.lent[i] {
			b.Free()
		}
	}
	if p.recvHdr.Valid() {
		p.recvHdr.Release()
	}
	for _, b := range p.sendBufs {
		b.Release()
	}
	p.sendBufs = nil
	p.mu.Unlock()
	p.ch.Stop() // eventLoop reads the last events (destroying their ids) and exits
	<-p.eventsDone
	errs = append(errs, p.ch.Close())
	if p.dev != nil {
		p.dev.Release()
		p.dev.BufReturned()
	}
	if p.clock {
		coarseclock.Release()
	}
	return errors.Join(errs...)
}

func (p *Endpoint[D]) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// The PacketConn's operations on the endpoint (the root package's
// packet.go writes each public method once over them).

// Messages delivers received datagrams as they arrive; it is closed when
// the endpoint closes or fails. Its first call has the device's poller
// cover the CQ (a reader of the channel drives none).
func (p *Endpoint[D]) Messages() <-chan D {
	if !p.chanUser.Load() && p.chanUser.CompareAndSwap(false, true) {
		p.poller.AddChannelUser()
	}
	return p.msgs
}

// Alloc returns a registered buffer of n bytes from the device's pool.
func (p *Endpoint[D]) Alloc(n int) (buffer.Buf, error) {
	if p.isClosed() {
		return buffer.Buf{}, net.ErrClosed
	}
	return p.dev.Pool.Get(n)
}

// SendTo sends b by reference; b is the endpoint's whatever the outcome.
func (p *Endpoint[D]) SendTo(ctx context.Context, b buffer.Buf, addr netip.AddrPort) error {
	if !b.Valid() {
		return buffer.ErrReleased
	}
	if err := p.Send(ctx, nil, b, addr); err != nil {
		b.Release()
		return err
	}
	return nil
}

// MaxDatagramSize is the largest payload sent and received.
func (p *Endpoint[D]) MaxDatagramSize() int { return p.maxPayload }

// Close closes the endpoint: blocked calls return net.ErrClosed, then
// everything is released (teardown). The first call does it; every call
// returns its outcome.
func (p *Endpoint[D]) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		close(p.closing)
		p.broadcast()
		p.mu.Unlock()
		p.closeErr = p.teardown()
	})
	return p.closeErr
}

// LocalAddrPort is the address the endpoint is bound to.
func (p *Endpoint[D]) LocalAddrPort() netip.AddrPort { return p.ap }

// SetDeadline sets the read (rd) and write (wr) deadlines to t.
func (p *Endpoint[D]) SetDeadline(t time.Time, rd, wr bool) error {
	if p.isClosed() {
		return net.ErrClosed
	}
	deadline.SetRW(&p.rdDeadline, &p.wrDeadline, t, rd, wr)
	return nil
}

// Stats returns the endpoint's counters and its poller's.
func (p *Endpoint[D]) Stats() Stats {
	pc := p.qp.PostCounts()
	ps := p.poller.Stats()
	p.mu.Lock()
	peers := p.peers.Len()
	p.mu.Unlock()
	return Stats{Sent: p.nSent.Load(), Received: p.nReceived.Load(), Dropped: p.dropped.Load(),
		Resolutions: p.resolutions.Load(), Peers: peers,
		SendPosts: pc.SendPosts, SendWRs: pc.SendWRs, Signaled: pc.Signaled, Inlined: pc.Inlined,
		RecvPosts: pc.RecvPosts, RecvWRs: pc.RecvWRs,
		PollCalls: ps.Polls, Completions: ps.Completions, PollerSleeps: ps.Sleeps, PollerWakeups: ps.Wakeups,
		InlinePolls: ps.InlinePolls, EmptyPolls: ps.EmptyPolls, Parks: ps.Parks, Arms: ps.Arms}
}
