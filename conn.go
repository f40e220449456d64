package rdma

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// Conn is an RDMA reliable connection with the semantics of a TCP stream. It
// implements net.Conn; many goroutines may call its methods at once.
type Conn struct {
	cfg          Config
	laddr, raddr *Addr
	ch           *rdmacm.Channel // the connection's own event channel
	id           *rdmacm.ID
	ep           *endpoint
	peerBufSize  int // chunk size for sends: the peer's receive buffer size, capped by ours
	// features are the optional protocol features both sides announced
	// (internal/wire/PROTOCOL.md): only these may be used.
	features wire.Features

	readMu  sync.Mutex // one Read at a time; held while it waits
	writeMu sync.Mutex // one Write at a time, so writes are not interleaved

	mu sync.Mutex // guards everything below
	// Receive side: completed receives in arrival order, a ring of buffer indices.
	rq      []rxMsg
	rqHead  int
	rqLen   int
	pending int // receives reposted but not yet granted back to the peer
	// uncredited counts the receives in recvWRs that are not credits (they
	// took a rendezvous done, which the peer sends without one).
	uncredited int
	eof        bool // the peer sent end-of-stream
	rerr       error
	// Send side.
	credits    int    // peer receive buffers we may still fill
	sendSeq    uint64 // data sends posted
	sendDone   uint64 // data sends completed (RC completes in order)
	sqInFlight int    // send-queue entries posted and not retired (sendqueue.go)
	sqReserved int    // send-queue entries a writer reserved and has not posted yet
	sq         []sqEntry
	sqHead     int // the oldest entry not retired
	sqUnsig    int // requests posted since the last signaled one
	recvPosted int // receives posted and not completed
	finSent    bool
	werr       error
	closed     bool
	qpDown     bool          // the QP was moved to ERR
	wake       chan struct{} // closed and replaced on a state change when wakers > 0
	wakers     int           // goroutines waiting on wake
	ringFreed  bool          // the receive ring went back to the pool (after release)
	rdSig      chan struct{} // capacity 1: wakes the (single, readMu) blocked reader
	wrSig      chan struct{} // capacity 1: wakes the (single, writeMu) blocked writer
	closing    chan struct{} // closed by Close
	released   bool          // the endpoint is gone: completions are ignored
	eventsDone chan struct{} // closed when the CM event loop exits

	rdDeadline, wrDeadline deadline
	// Spin budgets learnt from recent waits (poller.SpinBudget): readers
	// (Read, Recv, RecvNotification) and writers (Write, Send, one-sided).
	rdSpin, wrSpin poller.SpinBudget
	chanUser       atomic.Bool // the user took a delivery channel (channelUser)
	closeOnce      sync.Once
	closeErr       error

	// The message view and one-sided operations (message.go, onesided.go).
	dev        *device
	msgs       chan buffer.Buf
	notes      chan Notification
	msgsClosed bool
	slots      []recvSlot
	lent       []bool       // receive buffer i is with the user (message or notification)
	msgSend    []buffer.Buf // messages in flight, by send slot
	msgFree    []int
	msgAsync   []bool   // the send slot's outcome goes to Completions()
	msgID      []uint64 // ... with this id
	ops        []opSlot
	opFree     []int
	opDone     chan OpCompletion
	asyncOut   int // asynchronous operations posted whose completion is not yet on opDone
	exports    map[*Export]struct{}
	toRelease  []buffer.Buf // released after c.mu is dropped (a release may recycle into another connection)

	// Rendezvous (rendezvous.go): messages larger than the peer's receive buffers.
	peerMaxMsg int         // largest message Send takes: peerBufSize, or more by rendezvous
	rvMW       []*verbs.MW // by send slot: the window lending that slot's buffer, allocated on first use
	rvSending  []bool      // by send slot: lent to the peer, waiting for its done
	rvOut      int         // send slots in a rendezvous (until the window is revoked)
	rvIn       []rvRecv    // by receive buffer: an incoming rendezvous
	bigSlots   []bigSlot   // by receive buffer: recyclers of delivered large messages
	bigRefs    []*buffer.RecyclerRef
	inbox      []int // receive buffers of messages not yet delivered, in order (a ring)
	inHead     int
	inLen      int
	rvStalled  int             // incoming rendezvous without a buffer or a posted READ
	rvReads    int             // READs in flight
	rvDone     []uint32        // done answers waiting for send-queue room
	rvInval    []int           // send slots whose window waits to be invalidated
	rvCtx      context.Context // ends at release: stops waits for pool buffers
	rvCancel   context.CancelFunc

	sendWRs []verbs.SendWR  // scratch for Write, guarded by writeMu
	ctlWR   [1]verbs.SendWR // scratch for control messages, guarded by mu (a local would escape to the heap)
	recvWRs []verbs.RecvWR  // scratch for reposting, guarded by mu
}

type rxMsg struct {
	buf int // receive buffer index
	off int // bytes already read
	n   int // bytes received
}

// newConn makes the connection object and its endpoint (the endpoint's
// poller delivers completions to the Conn, so the Conn comes first).
func newConn(cfg *Config, ch *rdmacm.Channel, id *rdmacm.ID) (*Conn, error) {
	c := &Conn{
		cfg: *cfg, ch: ch, id: id,
		wake:       make(chan struct{}),
		rdSig:      make(chan struct{}, 1),
		wrSig:      make(chan struct{}, 1),
		closing:    make(chan struct{}),
		eventsDone: make(chan struct{}),
		rdDeadline: makeDeadline(),
		wrDeadline: makeDeadline(),
		rq:         make([]rxMsg, cfg.RecvBuffers+maxRendezvous), // every receive posted
		sendWRs:    make([]verbs.SendWR, 0, cfg.SendBuffers),
		recvWRs:    make([]verbs.RecvWR, 0, cfg.RecvBuffers+maxRendezvous),
	}
	ep, err := newEndpoint(id, cfg, c)
	if err != nil {
		return nil, err
	}
	c.ep = ep
	c.sq = make([]sqEntry, ep.sqDepth)
	// Counted before the handshake posts them: a receive may complete (the
	// peer's first message) before start runs, and its completion must
	// find the count (else Close waits its whole flush timeout).
	c.recvPosted = ep.nRecv
	c.dev = ep.dev
	c.initMessages()
	return c, nil
}

// setPeer records the peer's half of the handshake.
func (c *Conn) setPeer(peer wire.Hello) {
	c.mu.Lock()
	c.peerBufSize = min(int(peer.RecvBufSize), c.ep.bufSize)
	c.features = peer.Features
	c.credits = int(peer.Credits)
	c.peerMaxMsg = c.peerBufSize
	if c.dev.windows && int(peer.MaxMsgSize) > c.peerBufSize {
		c.peerMaxMsg = min(int(peer.MaxMsgSize), c.dev.pool.MaxSize()) // larger ones go by rendezvous
	}
	c.mu.Unlock()
}

// start runs once the connection is established.
func (c *Conn) start() {
	c.mu.Lock()
	c.laddr = &Addr{c.id.LocalAddr()}
	c.raddr = &Addr{c.id.PeerAddr()}
	c.mu.Unlock()
	go c.eventLoop()
}

// abort frees a connection that never got established.
func (c *Conn) abort() {
	c.mu.Lock()
	c.released = true
	c.mu.Unlock()
	c.ep.close() // the QP first: receives may be posted
	c.mu.Lock()
	c.freeRecvRingLocked()
	c.mu.Unlock()
	c.dev.bufReturned()
}

// freeRecvRingLocked returns the receive buffers to the pool; those lent to
// the user go back when the user releases them (recycleRecv).
func (c *Conn) freeRecvRingLocked() {
	c.ringFreed = true
	for i, b := range c.ep.recv {
		if !c.lent[i] {
			b.Free()
		}
	}
}

// broadcast wakes every waiter. Called with c.mu held.
// Read and Write, the hot paths, each have one waiter at most (they hold
// readMu / writeMu while they wait) and a signal channel that costs no
// allocation; other waiters (Send, one-sided operations, close) share a
// broadcast channel that is replaced only when someone waited on it.
func (c *Conn) broadcast() {
	select {
	case c.rdSig <- struct{}{}:
	default:
	}
	select {
	case c.wrSig <- struct{}{}:
	default:
	}
	if c.wakers > 0 {
		close(c.wake)
		c.wake = make(chan struct{})
		c.wakers = 0
	}
}

// wakeChan returns a channel closed at the next state change. Called with c.mu held.
func (c *Conn) wakeChan() chan struct{} {
	c.wakers++
	return c.wake
}

// creditThreshold is how many reposted receives we collect before returning
// them in a message of their own (they also ride on every data message).
func (c *Conn) creditThreshold() int { return max(1, c.cfg.RecvBuffers/4) }

// Read reads data from the connection. It returns io.EOF once the peer has
// closed (or half-closed) and every byte it wrote has been read.
func (c *Conn) Read(b []byte) (int, error) {
	n, err := c.read(b)
	if err != nil && err != io.EOF {
		err = c.opError("read", err)
	}
	return n, err
}

func (c *Conn) read(b []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	var w poller.Waiter
	defer w.End()
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return 0, net.ErrClosed
		}
		if c.rdDeadline.expired() {
			c.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		}
		if c.rqLen > 0 {
			if len(b) == 0 {
				c.mu.Unlock()
				return 0, nil
			}
			n := c.copyOut(b)
			c.mu.Unlock()
			return n, nil
		}
		if c.eof {
			c.mu.Unlock()
			return 0, io.EOF
		}
		if c.rerr != nil {
			err := c.rerr
			c.mu.Unlock()
			return 0, err
		}
		if len(b) == 0 {
			c.mu.Unlock()
			return 0, nil
		}
		c.mu.Unlock()
		if c.spinWait(&w, &c.rdSpin) {
			continue
		}
		select {
		case <-c.rdSig:
		case <-c.rdDeadline.wait():
		case <-c.closing:
		}
	}
}

// spinWait drives the connection's CQ for a caller whose condition does not
// hold yet (see poller.Waiter): it starts the wait on first use and reports
// whether the caller should check its condition again (true) or sleep on
// its wake-up channel (false: the waiter is registered as parked and the
// CQ armed, so the completion it waits for wakes the poller's goroutine,
// which dispatches it).
func (c *Conn) spinWait(w *poller.Waiter, est *poller.SpinBudget) bool {
	if !w.Started() {
		var budget time.Duration
		if c.cfg.PollMode != PollEvent {
			budget = est.Budget(c.cfg.PollSpin)
		}
		w.Start(c.ep.poller, est, budget)
	}
	return w.Spin()
}

// copyOut copies queued received bytes into b, reposting every buffer it
// empties in one batch. Called with c.mu held.
func (c *Conn) copyOut(b []byte) int {
	n := 0
	c.recvWRs = c.recvWRs[:0]
	for c.rqLen > 0 && n < len(b) {
		m := &c.rq[c.rqHead]
		k := copy(b[n:], c.ep.recv[m.buf].Full()[m.off:m.n])
		n += k
		m.off += k
		if m.off == m.n {
			c.recvWRs = append(c.recvWRs, c.ep.recvWR(m.buf))
			c.rqHead = (c.rqHead + 1) % len(c.rq)
			c.rqLen--
		}
	}
	c.repostLocked()
	return n
}

// repostLocked posts the receives collected in c.recvWRs and returns credits
// if enough have piled up. Called with c.mu held.
func (c *Conn) repostLocked() {
	if len(c.recvWRs) == 0 || c.qpDown {
		return
	}
	if err := c.ep.qp.PostRecv(c.recvWRs); err != nil {
		c.failLocked(err)
		return
	}
	c.recvPosted += len(c.recvWRs)
	c.pending += len(c.recvWRs) - c.uncredited
	c.uncredited = 0
	c.recvWRs = c.recvWRs[:0]
	c.maybeSendCreditsLocked()
}

// maybeSendCreditsLocked returns pending credits in a control message when
// enough have accumulated. A control message may use the last credit: data
// never does, so one is always left for this (otherwise both sides could sit
// on credits neither can send).
func (c *Conn) maybeSendCreditsLocked() {
	if c.pending >= c.creditThreshold() && c.credits >= 1 {
		c.sendCtlLocked(wire.KindCredit)
	}
}

// postLocked posts one send-queue work request of the given kind and
// index (through ctlWR: a local would escape to the heap); force asks for
// its completion. A failed post ends the connection. Called with c.mu held;
// the caller checked that the send queue has room.
func (c *Conn) postLocked(wr verbs.SendWR, kind uint64, idx int, force bool) error {
	c.sqPushLocked(&wr, kind, idx, force)
	c.ctlWR[0] = wr
	if err := c.ep.qp.PostSend(c.ctlWR[:]); err != nil {
		c.sqPopLocked(1)
		c.failLocked(err)
		return err
	}
	return nil
}

// sendCtlLocked posts a zero-length control message carrying all pending
// credits. Called with c.mu held; the caller checked c.credits >= 1. End of
// stream asks for its completion: Close waits for every send to retire.
func (c *Conn) sendCtlLocked(kind wire.Kind) bool {
	if c.qpDown || c.sqUsedLocked() >= c.ep.sqDepth {
		return false
	}
	if c.postLocked(verbs.SendWR{Opcode: verbs.OpSendWithImm, Imm: wire.EncodeImm(kind, uint32(c.pending))},
		wrSendCtl, 0, kind == wire.KindFIN) != nil {
		return false
	}
	c.credits--
	c.pending = 0
	return true
}

// Write writes b to the connection, split into chunks of at most the peer's
// receive buffer size and pipelined over the send buffers. It returns once
// every byte is in a posted send buffer (as TCP's returns once the bytes are
// in the socket buffer).
func (c *Conn) Write(b []byte) (int, error) {
	n, err := c.write(b)
	if err != nil {
		err = c.opError("write", err)
	}
	return n, err
}

func (c *Conn) write(b []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	written := 0
	var w poller.Waiter
	defer w.End()
	for {
		c.mu.Lock()
		if err := c.writeErrLocked(); err != nil {
			c.mu.Unlock()
			return written, err
		}
		if len(b) == 0 {
			c.mu.Unlock()
			return written, nil
		}
		// Reserve send buffers and credits for as many chunks as we can.
		free := c.ep.nSend - int(c.sendSeq-c.sendDone)
		room := c.ep.sqDepth - ctlReserve/2 - c.sqUsedLocked()
		k := min(free, room, c.credits-1)
		if k <= 0 {
			c.mu.Unlock()
			if c.spinWait(&w, &c.wrSpin) {
				continue
			}
			select {
			case <-c.wrSig:
			case <-c.wrDeadline.wait():
			case <-c.closing:
			}
			continue
		}
		first := c.sendSeq
		c.sendSeq += uint64(k) // reserved: only this writer (writeMu) posts data
		c.credits -= k
		c.sqReserved += k // queue positions are taken at the post, in posting order
		c.mu.Unlock()

		// Copy outside the lock; the completion loop keeps running.
		wrs := c.sendWRs[:0]
		for i := 0; i < k && len(b) > 0; i++ {
			slot := int((first + uint64(i)) % uint64(c.ep.nSend))
			sb := c.ep.send[slot]
			m := copy(sb.Full()[:c.peerBufSize], b)
			b = b[m:]
			written += m
			wr := verbs.SendWR{Addr: sb.Addr(), Len: uint32(m), LKey: sb.LKey(), Opcode: verbs.OpSendWithImm}
			if m <= c.ep.maxInline {
				wr.Flags = verbs.SendInline // copied into the request: no DMA read of the buffer
			}
			wrs = append(wrs, wr)
		}
		c.mu.Lock()
		unused := k - len(wrs)
		c.sendSeq -= uint64(unused)
		c.credits += unused
		c.sqReserved -= k
		// Every data message carries the credits pending so far.
		wrs[0].Imm = wire.EncodeImm(wire.KindData, uint32(c.pending))
		c.pending = 0
		for i := 1; i < len(wrs); i++ {
			wrs[i].Imm = wire.EncodeImm(wire.KindData, 0)
		}
		var err error
		if c.qpDown {
			err = c.writeErrLocked()
			if err == nil {
				err = net.ErrClosed
			}
		} else {
			for i := range wrs {
				c.sqPushLocked(&wrs[i], wrSendData, 0, false)
			}
			err = c.ep.qp.PostSend(wrs)
			if err != nil {
				c.sqPopLocked(len(wrs))
				c.failLocked(err)
			}
		}
		c.mu.Unlock()
		if err != nil {
			return written, err
		}
	}
}

// writeErrLocked reports why writing is impossible now, or nil.
func (c *Conn) writeErrLocked() error {
	switch {
	case c.closed:
		return net.ErrClosed
	case c.finSent:
		return syscall.EPIPE // after CloseWrite, as for TCP
	case c.werr != nil:
		return c.werr
	case c.wrDeadline.expired():
		return os.ErrDeadlineExceeded
	}
	return nil
}

// CloseWrite shuts down the writing side: the peer reads every byte written
// before it and then io.EOF, and can still write back.
func (c *Conn) CloseWrite() error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if err := c.sendFIN(c.cfg.CloseTimeout); err != nil {
		return c.opError("close", err)
	}
	return nil
}

// sendFIN queues the end-of-stream mark after all data, waiting for a credit
// for at most timeout. The caller holds writeMu.
func (c *Conn) sendFIN(timeout time.Duration) error {
	until := time.Now().Add(timeout)
	var w poller.Waiter
	defer w.End()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.finSent {
			return nil
		}
		if c.werr != nil {
			return c.werr
		}
		if c.qpDown {
			return net.ErrClosed
		}
		if c.credits >= 1 && c.sendCtlLocked(wire.KindFIN) {
			c.finSent = true
			c.broadcast()
			return nil
		}
		if !c.closeWaitLocked(&w, until) {
			return errors.New("timed out waiting for the peer to grant a receive buffer for end-of-stream")
		}
	}
}

// closeWaitLocked waits, driving the CQ, for the connection's state to
// change or until passes (then it reports false). For the waits of
// CloseWrite and Close, which go on after c.closing is closed. Called with
// c.mu held; returns with it held.
func (c *Conn) closeWaitLocked(w *poller.Waiter, until time.Time) bool {
	if !time.Now().Before(until) {
		return false
	}
	if !w.Started() || w.Spinning() {
		c.mu.Unlock()
		c.spinWait(w, &c.wrSpin)
		c.mu.Lock()
		return true
	}
	wake := c.wakeChan()
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

// Close closes the connection: blocked Reads and Writes return net.ErrClosed,
// data already written is delivered (within Config.CloseTimeout) followed by
// end-of-stream, and every RDMA resource is released.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		close(c.closing)
		c.broadcast()
		c.mu.Unlock()
		c.closeErr = c.shutdown()
	})
	if c.closeErr != nil {
		return c.opError("close", c.closeErr)
	}
	return nil
}

func (c *Conn) shutdown() error {
	// Writers saw c.closing and left; take writeMu so the FIN follows their data.
	c.writeMu.Lock()
	deadline := time.Now().Add(c.cfg.CloseTimeout)
	c.sendFIN(c.cfg.CloseTimeout)
	c.writeMu.Unlock()

	// Wait until every send is acknowledged (delivered into the peer's
	// buffers) and the peer has read every message lent to it.
	var w poller.Waiter
	c.mu.Lock()
	for (c.sqInFlight > 0 || c.rvOut > 0) && !c.qpDown && c.closeWaitLocked(&w, deadline) {
	}
	c.qpDownLocked()
	c.mu.Unlock()
	c.id.Disconnect()

	// Let the completion loop collect the flushed work requests, then stop it.
	flushDeadline := time.Now().Add(time.Second)
	c.mu.Lock()
	for (c.sqInFlight > 0 || c.recvPosted > 0) && c.closeWaitLocked(&w, flushDeadline) {
	}
	c.mu.Unlock()
	w.End()
	return c.release()
}

// release detaches from the poller and destroys every object in reverse order.
func (c *Conn) release() error {
	c.mu.Lock()
	c.released = true // from here on the poller's completions for us are ignored
	c.closeMessagesLocked()
	exports := c.exports
	c.exports = nil
	// Buffers the NIC may still read or write (a send, a one-sided
	// operation or a READ whose flush was not seen) are released only once
	// the QP is destroyed, and outside c.mu: a received Buf sent on recycles
	// into its connection, which takes c.mu.
	var rel []buffer.Buf
	rel = c.releaseRendezvousLocked(rel)
	for i, b := range c.msgSend {
		if b.Valid() {
			if c.msgAsync[i] {
				c.asyncOut--
				c.opDone <- OpCompletion{ID: c.msgID[i], Err: net.ErrClosed}
			}
			rel = append(rel, b)
			c.msgSend[i] = buffer.Buf{}
		}
	}
	for i := range c.ops {
		s := &c.ops[i]
		if s.local.Valid() {
			if s.async {
				c.asyncOut--
				c.opDone <- OpCompletion{ID: s.id, Err: net.ErrClosed}
			} else {
				select {
				case s.done <- net.ErrClosed:
				default:
				}
			}
			rel = append(rel, s.local)
			s.local = buffer.Buf{}
		}
	}
	c.mu.Unlock()
	for e := range exports {
		e.close()
	}
	if c.chanUser.Load() {
		c.ep.poller.RemoveChannelUser()
	}
	err := c.ep.close() // destroys the QP: nothing touches our memory after this
	c.mu.Lock()
	c.freeRecvRingLocked()
	c.mu.Unlock()
	for _, b := range rel {
		b.Release()
	}
	c.dev.bufReturned() // the device may have been waiting for these
	if derr := c.id.Destroy(); derr != nil && err == nil {
		err = derr
	}
	c.ch.Close() // ends eventLoop
	<-c.eventsDone
	return err
}

// qpDownLocked moves the QP to ERR once, so outstanding work flushes.
func (c *Conn) qpDownLocked() {
	if c.qpDown {
		return
	}
	c.qpDown = true
	c.ep.toError()
	c.broadcast()
}

// failLocked records a fatal error for both directions and takes the QP down.
func (c *Conn) failLocked(err error) {
	if c.rerr == nil {
		c.rerr = err
	}
	if c.werr == nil {
		c.werr = err
	}
	c.qpDownLocked()
}

// eventLoop handles CM events after the connection is up: the peer's
// disconnect (a close, or its process dying) ends the connection.
func (c *Conn) eventLoop() {
	defer close(c.eventsDone)
	for ev := range c.ch.Events() {
		switch ev.Type {
		case rdmacm.EventDisconnected, rdmacm.EventDeviceRemoval:
			c.mu.Lock()
			if c.werr == nil {
				c.werr = syscall.ECONNRESET
			}
			// Receives completed before the disconnect stay readable; the
			// flush marks the end (io.EOF if the peer sent end-of-stream).
			c.qpDownLocked()
			c.mu.Unlock()
			if ev.Type == rdmacm.EventDisconnected {
				c.id.Disconnect() // answer the peer's DREQ
			}
		}
	}
}

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.checkOpen("set deadline"); err != nil {
		return err
	}
	c.rdDeadline.set(t)
	c.wrDeadline.set(t)
	return nil
}

// SetReadDeadline sets the deadline for Read calls, pending and future.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if err := c.checkOpen("set read deadline"); err != nil {
		return err
	}
	c.rdDeadline.set(t)
	return nil
}

// SetWriteDeadline sets the deadline for Write calls, pending and future.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if err := c.checkOpen("set write deadline"); err != nil {
		return err
	}
	c.wrDeadline.set(t)
	return nil
}

func (c *Conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *Conn) checkOpen(op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.opError(op, net.ErrClosed)
	}
	return nil
}

// LocalAddr returns the local address.
func (c *Conn) LocalAddr() net.Addr { return c.laddr }

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.raddr }

func (c *Conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "rdma", Source: c.laddr, Addr: c.raddr, Err: err}
}
