//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/deadline"
	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/errs"
	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wait"
	"github.com/verbline/rdma/internal/wire"
)

// engine is the RC connection engine behind a Conn: the queue pair and its
// rdma_cm id, the rings, the views (stream, messages, rendezvous,
// one-sided, keepalive) and their shared lock. Conn embeds it and writes
// each public method once over it (conn.go); builds without RDMA embed the
// stub of engine_stub.go instead.
type engine struct {
	// Immutable after the handshake (set before the Conn is handed out).
	cfg          Config
	laddr, raddr *Addr
	ch           *rdmacm.Channel // the connection's own event channel
	id           *rdmacm.ID
	ep           *endpoint
	dev          *device.Device
	port         uint8 // the device port the connection runs on
	peerBufSize  int   // payload room of a send: the peer's receive buffer size, capped by ours (less a trailer)
	inlineMax    int   // the largest payload sent inline (the QP's inline room, less a trailer)
	trailers     bool  // headers travel in trailers, not immediate data (trailer.go)
	// windows: large messages and exports are lent through type 2 memory
	// windows (the device has them, and no test turned them off:
	// forceNoWindows); else through registrations of exactly their bytes.
	windows bool
	// features are the optional protocol features both sides announced
	// (docs/protocol.md): only these may be used.
	features   wire.Features
	rdSig      chan struct{} // capacity 1: wakes the (single, readMu) blocked reader
	wrSig      chan struct{} // capacity 1: wakes the (single, writeMu) blocked writer
	closing    chan struct{} // closed by Close
	eventsDone chan struct{} // closed when the CM event loop exits
	eventsStop func()        // ends the CM event loop without closing the channel (set by start)

	// Synchronized by themselves.
	readMu                 sync.Mutex // one Read at a time; held while it waits
	writeMu                sync.Mutex // one Write at a time, so writes are not interleaved
	rdDeadline, wrDeadline deadline.Deadline
	// Spin budgets learnt from recent waits (poller.SpinBudget): readers
	// (Read, Recv, RecvNotification) and writers (Write, Send, one-sided).
	rdSpin, wrSpin poller.SpinBudget
	chanUser       atomic.Bool // the user took a delivery channel (channelUser)
	starvedHint    atomic.Bool // mirrors peerStarved (window.go), read without c.mu
	closeOnce      sync.Once
	closeErr       error // set inside closeOnce

	sendWRs    []verbs.SendWR // guarded by writeMu: scratch for Write
	writeSlots []int          // guarded by writeMu: the send buffers a Write reserved

	counts connCounters // metrics_conn.go: atomics (noCredit: mu)

	mu           sync.Mutex      // guards every field below, the components' too
	stream       streamState     // stream.go: received bytes, credits, end of stream
	win          windowState     // window.go: how far the rings have grown, the peer's credits
	sendq        sendQueue       // sendqueue.go: posted send-queue requests in order
	msgs         messageState    // message.go: received messages lent to the user, zero-copy sends
	rma          oneSidedState   // onesided.go: operations in flight, exports
	rdv          rendezvousState // rendezvous.go: messages larger than the peer's receive buffers
	ka           keepaliveState  // keepalive.go: idle probes
	recvPosted   int             // receives posted and not completed
	arrived      arrivedCounts   // payload counted in the batch being handled, added to counts at its end
	closed       bool            // Close was called
	qpDown       bool            // the QP was moved to ERR
	released     bool            // the endpoint is gone: completions are ignored
	disconnected bool            // a disconnect request went to the peer (disconnectLocked)
	ringFreed    bool            // the receive ring went back to the pool (after release)
	wake         wait.Wakeup     // the parked waiters but Read's and Write's
	recvWRs      []verbs.RecvWR  // scratch for reposting
	// recvReady are receives taken back whose credits are counted (in
	// pending) but whose post waits for this side's next send, to go in
	// the same call into C (stream.go, repostLocked).
	recvReady    []verbs.RecvWR
	recvDeferred atomic.Bool  // recvReady is not empty: a waiter posts it first
	toRelease    []buffer.Buf // released after c.mu is dropped (a release may recycle into another connection)
	// firstHeard, on the passive side until the handshake ends, is called
	// by the first receive completion: a message means the dialer is
	// established even if its RTU was lost (awaitEstablished); a flush
	// (firstEnded) that the connection ended first.
	firstHeard context.CancelFunc
	// firstEnded: the first receive completion firstHeard reported was a
	// flush (the connection ended before the dialer sent anything).
	firstEnded bool
	// peerHeard: a message from the peer has arrived (it ends the dialer's
	// repeated first message where the connecting side sends first).
	peerHeard bool
}

// newConn makes the connection object and its endpoint (the endpoint's
// poller delivers completions to the Conn, so the Conn comes first).
func newConn(cfg *Config, ch *rdmacm.Channel, id *rdmacm.ID) (*Conn, error) {
	conn := &Conn{engine: engine{
		cfg: *cfg, ch: ch, id: id,
		rdSig:      make(chan struct{}, 1),
		wrSig:      make(chan struct{}, 1),
		closing:    make(chan struct{}),
		eventsDone: make(chan struct{}),
		rdDeadline: deadline.New(),
		wrDeadline: deadline.New(),
	}}
	c := &conn.engine
	ep, err := newEndpoint(id, cfg, c.handleCompletions)
	if err != nil {
		return nil, err
	}
	// The poller may run handleCompletions from here on (the flushes of a
	// dial that fails before the handshake reaches setPeer): what it reads
	// is written under the lock it takes.
	c.mu.Lock()
	c.ep = ep
	c.port = id.PortNum()
	c.stream.rq = make([]rxMsg, ep.maxRecv) // every receive posted
	c.win.size, c.win.peerCredits = initialWindow(cfg), initialWindow(cfg)
	c.stream.sendFree = make([]int, 0, cfg.SendBuffers)
	for i := range ep.send {
		c.stream.sendFree = append(c.stream.sendFree, i)
	}
	c.sendq.entries = make([]sqEntry, ep.sqDepth)
	// Counted before the handshake posts them: a receive may complete (the
	// peer's first message) before start runs, and its completion must
	// find the count (else Close waits its whole flush timeout).
	c.recvPosted = len(ep.recv)
	c.dev = ep.dev
	c.windows = c.dev.Caps.MemoryWindows && !forceNoWindows.Load()
	c.initMessages()
	c.mu.Unlock()
	c.dev.Add(c.member())
	return conn, nil
}

// setPeer records the peer's half of the handshake (agreed's).
func (c *engine) setPeer(peer wire.Hello) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.peerBufSize = min(int(peer.RecvBufSize), c.ep.bufSize)
	c.inlineMax = c.ep.maxInline
	if peer.Features&wire.FeatureTrailersRequired != 0 {
		if err := c.startTrailers(); err != nil {
			return err
		}
	}
	c.features = peer.Features
	// The QP accepts the peer's atomics only where both sides have them
	// (endpoint.configure grants the right at RTR).
	c.ep.remoteAtomic = peer.Features&wire.FeatureAtomics != 0
	c.stream.credits = int(peer.Credits)
	c.rdv.peerMaxMsg = c.peerBufSize
	if int(peer.MaxMsgSize) > c.peerBufSize {
		c.rdv.peerMaxMsg = min(int(peer.MaxMsgSize), c.dev.Pool.MaxSize()) // larger ones go by rendezvous
	}
	return nil
}

// start runs once the connection is established.
func (c *engine) start() {
	c.mu.Lock()
	c.laddr = &Addr{c.id.LocalAddr()}
	c.raddr = &Addr{c.id.PeerAddr()}
	c.mu.Unlock()
	c.startKeepalive()
	registerConn(c) // metrics
	ctx, stop := context.WithCancel(context.Background())
	c.eventsStop = stop
	go c.eventLoop(ctx)
}

// abort frees a connection that never got established.
func (c *engine) abort() {
	c.mu.Lock()
	c.released = true
	c.mu.Unlock()
	c.dev.Remove(c.member())
	c.ep.close() // the QP first: receives may be posted
	c.mu.Lock()
	c.freeRecvRingLocked()
	c.mu.Unlock()
	c.dev.BufReturned()
}

// freeRecvRingLocked returns the receive buffers to the pool; those lent to
// the user go back when the user releases them (recycleRecv).
func (c *engine) freeRecvRingLocked() {
	c.ringFreed = true
	for i, b := range c.ep.recv {
		if !c.msgs.lent[i] {
			b.Free()
		}
	}
}

// broadcast wakes every waiter. Called with c.mu held.
// Read and Write, the hot paths, each have one waiter at most (they hold
// readMu / writeMu while they wait) and a signal channel that costs no
// allocation; other waiters (Send, one-sided operations, close) share a
// broadcast channel that is replaced only when someone waited on it.
func (c *engine) broadcast() {
	select {
	case c.rdSig <- struct{}{}:
	default:
	}
	select {
	case c.wrSig <- struct{}{}:
	default:
	}
	c.wake.Broadcast()
}

func (c *engine) shutdown() error {
	// Writers saw c.closing and left; take writeMu so the FIN follows their data.
	c.writeMu.Lock()
	deadline := time.Now().Add(c.cfg.CloseTimeout)
	finErr := c.sendFIN(c.cfg.CloseTimeout)
	c.writeMu.Unlock()

	// Wait until every send is acknowledged (delivered into the peer's
	// buffers) and the peer has read every message lent to it.
	var w poller.Waiter
	c.mu.Lock()
	for (c.sendq.inFlight > 0 || c.rdv.out > 0) && !c.qpDown && c.closeWaitLocked(&w, deadline) {
	}
	deliveryErr := c.undeliveredLocked(finErr)
	c.qpDownLocked()
	c.disconnectLocked()
	c.mu.Unlock()

	// Let the completion loop collect the flushed work requests, then stop it.
	flushDeadline := time.Now().Add(time.Second)
	c.mu.Lock()
	for (c.sendq.inFlight > 0 || c.recvPosted > 0) && c.closeWaitLocked(&w, flushDeadline) {
	}
	c.mu.Unlock()
	w.End()
	if err := c.release(); err != nil && deliveryErr == nil {
		return err
	}
	return deliveryErr
}

// undeliveredLocked is Close's report on what it could not deliver: the
// end of stream or data still unacknowledged when Config.CloseTimeout ran
// out (a timeout), or lost to a peer that became unreachable. A peer that
// closed or reset the connection itself is not an error (as for TCP).
// Called with c.mu held, after the wait for acknowledgements.
func (c *engine) undeliveredLocked(finErr error) error {
	var ct *errs.CloseTimeout
	var tt *transportTimeout
	switch {
	case errors.As(finErr, &ct):
		return finErr
	case errors.As(c.stream.werr, &tt):
		return c.stream.werr
	case !c.qpDown && c.sendq.inFlight > 0:
		return &errs.CloseTimeout{What: "data written before Close was not acknowledged by the peer"}
	case !c.qpDown && c.rdv.out > 0:
		return &errs.CloseTimeout{What: "the peer did not read every large message sent before Close"}
	}
	return nil
}

// release detaches from the poller and destroys every object in reverse order.
func (c *engine) release() error {
	c.mu.Lock()
	c.released = true // from here on the poller's completions for us are ignored
	c.stopKeepaliveLocked()
	c.closeMessagesLocked()
	exports := c.rma.exports
	c.rma.exports = nil
	// Buffers the NIC may still read or write (a send, a one-sided
	// operation or a READ whose flush was not seen) are released only once
	// the QP is destroyed, and outside c.mu: a received Buf sent on recycles
	// into its connection, which takes c.mu.
	var rel []buffer.Buf
	rel = c.releaseRendezvousLocked(rel)
	rel = c.releaseMessageSendsLocked(rel)
	rel = c.releaseOpsLocked(rel)
	c.mu.Unlock()
	// Messages and notifications delivered but never received go back now
	// (Messages() and Notifications() are closed, so this ends): a peer
	// that sends and disconnects must not pin this side's memory.
	for b := range c.msgs.mq.Chan() { // made and closed by closeMessagesLocked
		b.Release()
	}
	for n := range c.msgs.nq.Chan() {
		n.Release()
	}
	for e := range exports {
		e.close()
	}
	if c.chanUser.Load() {
		c.ep.poller.RemoveChannelUser()
	}
	c.dev.Remove(c.member())
	err := c.ep.close() // destroys the QP: nothing touches our memory after this
	c.mu.Lock()
	c.freeRecvRingLocked()
	c.mu.Unlock()
	for _, b := range rel {
		b.Release()
	}
	c.dev.BufReturned() // the device may have been waiting for these
	if c.ep.parkDev != nil {
		// The QP, reset, goes to the device's pool at the id's
		// TIMEWAIT_EXIT (qpreuse.go): the event loop ends here, and the id
		// waits for it on the timewait channel, not on the Conn's own.
		c.eventsStop()
		<-c.eventsDone
		c.ep.awaitTimewait(c.id, c.ch)
	} else {
		if derr := c.id.Destroy(); derr != nil && err == nil {
			err = derr
		}
		c.ch.Close() // ends eventLoop
		<-c.eventsDone
	}
	unregisterConn(c) // metrics: its counts join its device's totals
	return err
}

// qpDownLocked moves the QP to ERR once, so outstanding work flushes.
func (c *engine) qpDownLocked() {
	if c.qpDown {
		return
	}
	c.qpDown = true
	c.ep.toError()
	c.broadcast()
}

// failLocked records a fatal error for both directions and takes the QP
// down. A protocol violation is this side's verdict, which the peer's
// healthy QP knows nothing of: the peer is told at once by a disconnect
// request, since a QP in ERR answers nothing and the peer would otherwise
// learn only when its sends ran out of retries, or wait in Close for
// acknowledgements that never come. Other failures come from the device
// or the transport, which the peer sees for itself; a disconnect request
// sent through a port that is down also leaves Soft-RoCE's CM unable to
// connect on that port after it comes back up (TestPortDown).
func (c *engine) failLocked(err error) {
	if c.stream.rerr == nil {
		c.stream.rerr = err
	}
	if c.stream.werr == nil {
		c.stream.werr = err
	}
	c.qpDownLocked()
	if errors.Is(err, ErrProtocol) {
		c.disconnectLocked()
	}
}

// brokenErrLocked is why a connection that the peer or the transport ended
// (a disconnect, a flush) ended: ECONNRESET, or the port's error if its
// port is down (the connection's end may come before the port's event).
func (c *engine) brokenErrLocked() error {
	if c.dev != nil && !c.closed { // after this side's Close no call sees it: no query
		if err := c.dev.PortDown(c.port); err != nil {
			return err
		}
	}
	return syscall.ECONNRESET
}

// disconnectLocked sends the peer a disconnect request, once, while the
// rdma_cm id exists (release destroys it after setting c.released). The
// peer's connection ends with ECONNRESET, or with end-of-stream if ours
// sent one. An unreachable peer's disconnect times out in the kernel's
// CM; the connection does not wait for it.
func (c *engine) disconnectLocked() {
	if c.disconnected || c.released || c.id == nil { // nil: a Conn the fuzz targets build, with no rdma_cm id
		return
	}
	c.disconnected = true
	c.id.Disconnect()
}

// answerDisconnectLocked answers the peer's disconnect request with a
// disconnect reply, even when this side sent its own request first: when
// both sides' requests cross, the CM cancels ours and waits for this reply
// (IB_CM_DREQ_RCVD), and without it neither id reaches timewait, so
// neither reports TIMEWAIT_EXIT and the QP cannot return to the pool. After
// a reply to our own request the call does nothing (the id is in timewait).
func (c *engine) answerDisconnectLocked() {
	if c.released || c.id == nil {
		return
	}
	c.disconnected = true
	c.id.Disconnect()
}

// eventLoop handles CM events after the connection is up, until ctx is
// done or the channel closed: the peer's disconnect (a close, or its
// process dying) ends the connection.
func (c *engine) eventLoop(ctx context.Context) {
	defer close(c.eventsDone)
	for {
		ev, err := c.ch.Next(ctx)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, rdmacm.ErrChannelClosed) { // not our Close: the channel failed
				c.mu.Lock()
				c.failLocked(err)
				c.mu.Unlock()
			}
			return
		}
		switch ev.Type {
		case rdmacm.EventDisconnected, rdmacm.EventDeviceRemoval:
			c.mu.Lock()
			if ev.Type == rdmacm.EventDeviceRemoval {
				c.failLocked(&errs.DeviceFailed{Msg: "the connection's RDMA device was removed (rdma link delete, driver unload " +
					"or a fatal device error): dial again once a device serves the address"})
			}
			if c.stream.werr == nil {
				c.stream.werr = c.brokenErrLocked()
			}
			// Receives completed before the disconnect stay readable; the
			// flush marks the end (io.EOF if the peer sent end-of-stream).
			c.qpDownLocked()
			c.broadcast() // werr may be new though the QP was down already (a flush came first)
			if ev.Type == rdmacm.EventDisconnected {
				c.answerDisconnectLocked()
			}
			c.mu.Unlock()
		case rdmacm.EventTimewaitExit:
			c.ep.timewaitExit() // the QP may be reused (qpreuse.go)
		}
	}
}

func (c *engine) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// close is Conn.Close on the engine: the first call shuts the connection
// down, every call returns its outcome.
func (c *engine) close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		close(c.closing)
		c.broadcast()
		c.mu.Unlock()
		c.closeErr = c.shutdown()
	})
	return c.closeErr
}

// setDeadline sets the read (rd) and write (wr) deadlines to t.
func (c *engine) setDeadline(t time.Time, rd, wr bool) error {
	if c.isClosed() {
		return net.ErrClosed
	}
	deadline.SetRW(&c.rdDeadline, &c.wrDeadline, t, rd, wr)
	return nil
}

func (c *engine) localAddr() net.Addr  { return c.laddr }
func (c *engine) remoteAddr() net.Addr { return c.raddr }

// writeErrLocked reports why writing is impossible now, or nil.
func (c *engine) writeErrLocked() error {
	switch {
	case c.closed:
		return net.ErrClosed
	case c.stream.finSent:
		return syscall.EPIPE // after CloseWrite, as for TCP
	case c.stream.werr != nil:
		return c.stream.werr
	case c.wrDeadline.Expired():
		return os.ErrDeadlineExceeded
	}
	return nil
}

// How a blocked call waits: it drives the device's shared CQ itself
// (poller.Waiter: polls, watches others' progress, spends a spin budget
// learnt from its recent waits), then parks on its wake-up channel once the
// CQ is armed. The three forms differ in what they park on: Read and Write
// have a capacity-1 signal channel each (one waiter at most, held by
// readMu / writeMu), the others the connection's broadcast channel
// (wait.Wakeup, which PacketConn's endpoint shares).

// spinWait drives the connection's CQ for a caller whose condition does not
// hold yet (see poller.Waiter): it starts the wait on first use and reports
// whether the caller should check its condition again (true) or sleep on
// its wake-up channel (false: the waiter is registered as parked and the
// CQ armed, so the completion it waits for wakes the poller's goroutine,
// which dispatches it).
func (c *engine) spinWait(w *poller.Waiter, est *poller.SpinBudget) bool {
	c.postReady() // receives taken back are posted before this side waits (an atomic load when none)
	if !w.Started() {
		wait.Start(w, c.ep.poller, est, c.cfg.PollMode == PollEvent, c.cfg.PollSpin)
	}
	return w.Spin()
}

// closeWaitLocked waits, driving the CQ, for the connection's state to
// change or until passes (then it reports false). For the waits of
// CloseWrite and Close, which go on after c.closing is closed. Called with
// c.mu held; returns with it held.
func (c *engine) closeWaitLocked(w *poller.Waiter, until time.Time) bool {
	if !time.Now().Before(until) {
		return false
	}
	if !w.Started() || w.Spinning() {
		c.mu.Unlock()
		c.spinWait(w, &c.wrSpin)
		c.mu.Lock()
		return true
	}
	wake := c.wake.Wait()
	c.mu.Unlock()
	t := time.NewTimer(time.Until(until))
	select {
	case <-wake:
	case <-t.C:
	}
	t.Stop()
	c.mu.Lock()
	return true
}

// waitLocked waits for the connection's state to change, ctx to end or the
// deadline to pass, driving the CQ meanwhile (spinWait). Called with c.mu
// held, right after the caller's condition failed; returns with it held,
// and the caller checks its condition again. w is the caller's wait (its
// End is the caller's to defer).
func (c *engine) waitLocked(ctx context.Context, d *deadline.Deadline, w *poller.Waiter) error {
	if !w.Started() || w.Spinning() {
		c.mu.Unlock()
		c.spinWait(w, &c.wrSpin)
		c.mu.Lock()
		if c.closed {
			return net.ErrClosed
		}
		return nil
	}
	// Parked: the wake channel is taken in the critical section that
	// checked the condition, so no change after that check is missed.
	wake := c.wake.Wait()
	c.mu.Unlock()
	defer c.mu.Lock()
	return wait.Park(ctx, wake, d, c.closing)
}
