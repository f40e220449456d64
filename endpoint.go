//go:build linux && cgo

package rdma

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/cmsetup"
	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// endpoint holds one connection's verbs objects: its QP (on the shared CQ of
// the poller it is attached to) and its send and receive rings (Bufs from the
// device's registered pool, so setting up a connection registers no memory
// once the pool is warm). The rings start small and grow with traffic
// (window.go) up to the Config's sizes, which the QP, the CQ entries and
// the connection's bookkeeping are sized for from the start.
type endpoint struct {
	dev     *device.Device
	poller  *poller.Poller
	token   uint64 // the connection's token, already shifted into wr_id position
	entries int    // CQ entries reserved on the poller
	qp      *verbs.QP
	lim     verbs.PortLimits
	recv    []buffer.Buf // receive buffers so far (grown up to maxRecv)
	send    []buffer.Buf // send buffers so far (grown up to maxSend)
	rvDesc  buffer.Buf   // rendezvous announcements: RendezvousLen bytes per message send slot
	// needTrailers: this side requires trailers (its device has no
	// immediate data); rvDesc then has room for the trailer ring after the
	// descriptors. trailers is the buffer holding the ring, a slot per
	// send-queue position, from trailerOff, on connections with trailers
	// only (trailer.go): rvDesc, or where only the peer required them a
	// buffer of its own (ownTrailers).
	needTrailers bool
	trailers     buffer.Buf
	trailerOff   int
	ownTrailers  bool

	bufSize          int
	maxRecv, maxSend int // the rings' largest sizes
	maxMsgs, maxOps  int // zero-copy messages and one-sided operations in flight
	maxInline        int // largest payload sent inline (copied into the work request)
	sqDepth          int
	ackTimeout       uint8 // the QP's local ACK timeout exponent (0: rdma_cm's)
	retryCnt         uint8
	rnrRetry         uint8
	minRNRTimer      uint8        // the RNR NAK timer code (with minRNRSet; else rdma_cm's)
	minRNRSet        bool         // Config.MinRNRTimer was given
	mtuCap           verbs.MTU    // the largest path MTU (0: the path's)
	sl, tc           uint8        // service level and traffic class (0: rdma_cm's)
	ackTimeoutSet    uint8        // what the QP got at RTS (for the detection bound)
	avSet            verbs.AHAttr // the address vector the QP got at RTR (its SL, which a device may not keep)
	// The READ/atomic depths the listener's side sets itself (0: rdma_cm's,
	// as the dialer's side takes them from the listener's answer).
	rdAtomic, destRdAtomic uint8
	remoteAtomic           bool // the QP accepts the peer's atomics (both sides have them)
	closed                 bool

	// The QP pool (qpreuse.go; the pool is the device's).
	shape       device.QPShape  // the QP's queue sizes and inline request
	reused      bool            // the QP came from the pool
	established bool            // the connection was established: its QP may go back to the pool
	parked      device.PooledQP // the QP, reset and handed off, waiting for TIMEWAIT_EXIT
	parkDev     *device.Device  // the device reference the parked QP holds
	twExit      chan struct{}   // closed at the id's TIMEWAIT_EXIT (or when it can no longer come)
	twOnce      sync.Once
	twLost      atomic.Bool // twExit was closed without a TIMEWAIT_EXIT
	// noReuse: a memory window bound on the QP failed to deallocate, so
	// the QP is destroyed at close, never pooled for another connection.
	noReuse atomic.Bool
}

// mwCloseFault, when set (by tests), is the error closeMW reports after
// deallocating a window.
var mwCloseFault atomic.Pointer[error]

// closeMW deallocates a memory window bound on the endpoint's QP. If that
// fails the window may still grant access through the QP, which then must
// not serve another connection: it is destroyed at close, not pooled.
func (e *endpoint) closeMW(mw *verbs.MW) error {
	err := mw.Close()
	if f := mwCloseFault.Load(); err == nil && f != nil {
		err = *f
	}
	if err != nil {
		e.noReuse.Store(true)
	}
	return err
}

// ctlReserve is the send-queue room kept for control messages (credit
// updates, end of stream).
const ctlReserve = 8

// maxOneSided is how many one-sided operations a connection keeps in flight.
const maxOneSided = 16

// maxRendezvous is how many messages larger than the peer's receive buffers
// a connection has in flight in each direction (rendezvous.go). Each side
// posts a receive beyond its credits per rendezvous it may have
// outstanding (the reserve grows with use, up to this), so the peer's
// "done" answers never need a credit; and the send queue has room for a
// window bind or invalidate, an RDMA READ and a done per rendezvous.
const maxRendezvous = 8

func newEndpoint(id *rdmacm.ID, cfg *Config, h poller.Handler) (_ *endpoint, err error) {
	e := &endpoint{twExit: make(chan struct{}), bufSize: cfg.BufferSize, maxRecv: cfg.RecvBuffers + maxRendezvous + ctlRecvReserve, maxSend: cfg.SendBuffers,
		maxMsgs: cfg.SendBuffers, maxOps: maxOneSided}
	e.setTransport(cfg)
	e.sqDepth = e.maxSend + e.maxMsgs + e.maxOps + ctlReserve + 3*maxRendezvous
	defer func() {
		if err != nil {
			// No Conn owns the receive ring yet: free it here (the QP, which
			// has posted nothing, goes first in close).
			e.close()
			for _, b := range e.recv {
				b.Free()
			}
			e.recv = nil
		}
	}()
	st := cmsetup.StartSteps("endpoint")
	ctx, err := id.Context()
	if err != nil {
		return nil, err
	}
	if e.dev, err = acquireDevice(ctx, cfg); err != nil {
		return nil, err
	}
	e.needTrailers = !e.dev.Caps.Immediates || forceTrailers.Load()
	if err = e.dev.Usable(id.PortNum()); err != nil {
		return nil, err // fail fast: the port is down, or the device failed
	}
	st.Step("acquire device")
	// The device's attributes do not change (queried once per device); the
	// port's may, and are cached a short while (internal/device).
	if e.lim, err = e.dev.Ports.Limits(id.PortNum(), false); err != nil {
		return nil, err
	}
	st.Step("port limits")
	e.entries = e.maxRecv + e.sqDepth
	if err = e.takeQP(h, &st); err != nil {
		return nil, err
	}
	e.maxInline = e.qp.MaxInline
	if err = e.allocRings(cfg); err != nil {
		return nil, err
	}
	st.Step("ring buffers")
	return e, nil
}

// takeQP gives the endpoint a reset QP of its shape from the device's
// pool, with its poller; else a new one on the least-loaded poller. A
// device that refused the inline request gave QPs without inline room:
// the pool is searched for those too.
func (e *endpoint) takeQP(h poller.Handler, st *cmsetup.Steps) error {
	shape := device.QPShape{SendWR: e.sqDepth, RecvWR: e.maxRecv, Inline: device.InlineRequest}
	noInline := device.QPShape{SendWR: e.sqDepth, RecvWR: e.maxRecv}
	if e.reused = e.takePooledQP(shape, h) || e.takePooledQP(noInline, h); e.reused {
		st.Step("QP from pool")
		return nil
	}
	p, tok, err := e.dev.Pollers.Attach(h, e.entries)
	if err != nil {
		return err
	}
	e.poller, e.token = p, uint64(tok)<<poller.TokenShift
	st.Step("attach poller")
	qpc := verbs.QPConfig{Type: verbs.QPTypeRC, SendCQ: p.CQ(), RecvCQ: p.CQ(),
		SendWR: shape.SendWR, RecvWR: shape.RecvWR, InlineData: shape.Inline, IWARP: e.dev.Caps.CMConnectsQP}
	if e.qp, qpc, err = device.CreateQP(e.dev.PD.CreateQP, qpc, &e.dev.InlineGranted); err != nil {
		return err
	}
	e.shape = device.QPShape{SendWR: qpc.SendWR, RecvWR: qpc.RecvWR, Inline: qpc.InlineData}
	e.dev.QPs.Count(func(st *device.QPPoolStats) { st.Created++ })
	st.Step("create QP")
	return nil
}

// allocRings takes the first receive and send buffers and the rendezvous
// descriptors' buffer from the device's pool (the rings grow with use,
// rings.go). On failure newEndpoint's cleanup frees what was taken.
func (e *endpoint) allocRings(cfg *Config) error {
	for range initialWindow(cfg) + ctlRecvReserve {
		b, err := e.dev.Pool.Get(e.bufSize)
		if err != nil {
			return err
		}
		e.recv = append(e.recv, b)
	}
	for range min(initialSendBuffers, e.maxSend) {
		b, err := e.dev.Pool.Get(e.bufSize)
		if err != nil {
			return err
		}
		e.send = append(e.send, b)
	}
	n := e.maxMsgs * wire.RendezvousLen
	if e.needTrailers {
		n = e.trailerRingOff() + e.sqDepth*trailerSlot // one buffer, one size class: no arena of its own
	}
	var err error
	e.rvDesc, err = e.dev.Pool.Get(n)
	return err
}

// trailerRingOff is where the trailer ring starts in rvDesc when it
// shares it: after the descriptors, aligned to a slot.
func (e *endpoint) trailerRingOff() int {
	return (e.maxMsgs*wire.RendezvousLen + trailerSlot - 1) / trailerSlot * trailerSlot
}

// setTransport takes the transport settings of cfg (checked, with
// defaults) in the units of the QP attributes.
func (e *endpoint) setTransport(cfg *Config) {
	e.retryCnt, e.rnrRetry = uint8(cfg.RetryCount), uint8(cfg.RNRRetry)
	e.sl, e.tc = uint8(cfg.ServiceLevel), uint8(cfg.TrafficClass)
	if cfg.AckTimeout > 0 {
		e.ackTimeout = ackTimeoutExp(cfg.AckTimeout)
	}
	if cfg.MinRNRTimer > 0 {
		e.minRNRTimer, e.minRNRSet = rnrTimerCode(cfg.MinRNRTimer), true
	}
	if cfg.MaxPathMTU > 0 {
		e.mtuCap = verbs.MTU(mtuCode(cfg.MaxPathMTU))
	}
}

// wrid builds a work-request id for this connection.
func (e *endpoint) wrid(kind uint64, idx int) uint64 { return e.token | kind | uint64(idx) }

// moveQP asks rdma_cm for the attributes of the next state, applies this
// side's Config on top (each side sets its own QP: rdma_cm would give a
// side some of the peer's settings) and applies them through the validated
// state table.
func (e *endpoint) moveQP(id *rdmacm.ID, states ...verbs.QPState) error {
	for _, s := range states {
		attr, mask, err := id.InitQPAttr(s)
		if err != nil {
			return fmt.Errorf("QP 0x%x: %w", e.qp.Num, err)
		}
		mask = e.configure(s, &attr, mask)
		if mask&verbs.AttrPathMTU != 0 && e.lim.ActiveMTU != 0 && attr.PathMTU > e.lim.ActiveMTU {
			// rdma_cm's path follows the netdev's MTU; the cached port may
			// predate a raise of it (internal/device): ask the device again.
			if lim, err := e.dev.Ports.Limits(id.PortNum(), true); err == nil {
				e.lim = lim
			}
		}
		if err := e.qp.Modify(&attr, mask, e.lim); err != nil {
			return err
		}
	}
	return nil
}

// configure puts this side's Config on the attributes rdma_cm gave for the
// transition to state to, and returns the mask with what it added.
func (e *endpoint) configure(to verbs.QPState, attr *verbs.QPAttr, mask verbs.AttrMask) verbs.AttrMask {
	if to == verbs.StateInit {
		// rdma_cm gives the active side's QP remote write only, and the
		// passive side's remote atomics too whatever the devices have:
		// this side sets the rights itself (qpAccess).
		attr.AccessFlags = e.qpAccess()
		mask |= verbs.AttrAccessFlags
	}
	if to == verbs.StateRTR {
		// The dialer's QP went to INIT before the listener's Hello said
		// whether both sides have atomics: the rights again, now known.
		if e.remoteAtomic {
			attr.AccessFlags = e.qpAccess()
			mask |= verbs.AttrAccessFlags
		}
		if e.destRdAtomic != 0 {
			attr.MaxDestRdAtomic = e.destRdAtomic
			mask |= verbs.AttrMaxDestRdAtomic
		}
		// The receive side and the path: the RNR NAK timer this
		// side advertises, the path MTU cap, and the service level
		// and traffic class of what this side sends.
		if e.minRNRSet {
			attr.MinRNRTimer = e.minRNRTimer
			mask |= verbs.AttrMinRNRTimer
		}
		if e.mtuCap != 0 && mask&verbs.AttrPathMTU != 0 && attr.PathMTU > e.mtuCap {
			attr.PathMTU = e.mtuCap
		}
		if mask&verbs.AttrAV != 0 {
			if e.sl != 0 {
				attr.AH.SL = e.sl
			}
			if e.tc != 0 && attr.AH.IsGlobal {
				attr.AH.TrafficClass = e.tc
			}
			e.avSet = attr.AH
		}
	}
	if to == verbs.StateRTS {
		// Each side's own Config sets its transport timeout and
		// retries (rdma_cm would give the passive side the dialer's).
		attr.RetryCnt, attr.RNRRetry = e.retryCnt, e.rnrRetry
		mask |= verbs.AttrRetryCnt | verbs.AttrRNRRetry
		if e.rdAtomic != 0 {
			attr.MaxRdAtomic = e.rdAtomic
			mask |= verbs.AttrMaxQPRdAtomic
		}
		if e.ackTimeout > 0 {
			attr.Timeout = e.ackTimeout
			mask |= verbs.AttrTimeout
		}
		e.ackTimeoutSet = attr.Timeout
	}
	return mask
}

// qpAccess is the QP's remote rights: both sides accept one-sided writes
// and reads into exported memory, and atomics where both devices have them
// (remoteAtomic). What is reachable stays decided by the keys: only
// exports have rkeys with remote rights, each with the rights it was given.
func (e *endpoint) qpAccess() verbs.AccessFlags {
	a := verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead
	if e.remoteAtomic {
		a |= verbs.AccessRemoteAtomic
	}
	return a
}

// connectedByCM records that the CM took the QP to RTS, where it connects
// the QP itself (Caps.CMConnectsQP: iWARP), at ESTABLISHED.
func (e *endpoint) connectedByCM() { e.qp.ConnectedByCM() }

// toError moves the QP to ERR so every outstanding work request flushes.
func (e *endpoint) toError() error {
	if s := e.qp.State(); s == verbs.StateErr || s == verbs.StateReset {
		return nil
	}
	return e.qp.Modify(&verbs.QPAttr{State: verbs.StateErr}, verbs.AttrState, e.lim)
}

func (e *endpoint) recvWR(i int) verbs.RecvWR {
	b := e.recv[i]
	return verbs.RecvWR{WRID: e.wrid(wrRecv, i), Addr: b.Addr(), Len: uint32(e.bufSize), LKey: b.LKey()}
}

// postInitialRecvs posts every receive buffer; it must happen before the
// peer learns our credits (before accept / establish).
func (e *endpoint) postInitialRecvs() error {
	wrs := make([]verbs.RecvWR, len(e.recv))
	for i := range wrs {
		wrs[i] = e.recvWR(i)
	}
	return e.qp.PostRecv(wrs)
}

// close destroys the QP (or, for an established connection, resets it and
// parks it for the device's QP pool: retire finishes that), leaves the
// poller and gives the send ring back to the pool, then drops the device
// reference (a parked QP keeps it). Idempotent. The receive ring
// belongs to the Conn (some of it may be lent to the user) and is freed there.
// The qp and poller pointers stay set (Stats reads their counters); closed
// makes the teardown happen once.
func (e *endpoint) close() error {
	if e.closed {
		return nil
	}
	e.closed = true
	var errs []error
	if e.qp != nil && !e.parkQP() {
		errs = append(errs, e.qp.Close())
	}
	if e.poller != nil {
		e.poller.Detach(uint32(e.token>>poller.TokenShift), e.entries)
	}
	for _, b := range e.send {
		b.Release()
	}
	e.send = nil
	if e.rvDesc.Valid() {
		e.rvDesc.Release()
	}
	if e.ownTrailers && e.trailers.Valid() {
		e.trailers.Release()
	}
	if e.dev != nil {
		if e.parkDev == nil {
			e.dev.Release()
		}
		e.dev = nil
	}
	return errors.Join(errs...)
}
