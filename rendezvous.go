//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/hints"
	"github.com/verbline/rdma/internal/testhooks"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// Rendezvous: a message larger than the peer's receive buffers moves by one
// RDMA READ, still without a copy on either side.
//
//	sender                                   receiver
//	bind a window to b (remote read, this QP)
//	SEND KindRendezvous {id, addr, len, rkey}  -> takes a receive buffer (a credit)
//	                                            Get a pool buffer of len
//	                         <- RDMA READ ---   read b into it
//	                                            deliver it on Messages() in order
//	               <- SEND KindRendezvousDone id (no credit: a reserved receive)
//	invalidate the window, release b
//
// The sender's memory is reachable only through a type 2 memory window:
// bound to exactly b, valid on this connection's QP alone, and revoked as
// soon as the receiver says it is done (or the connection ends). On a
// device without windows (iWARP, and many RoCE NICs) b gets a registration
// of exactly its bytes with remote read, announced with the
// registration's own key and deregistered at the done: the key reaches b
// and nothing else, but through any QP of the device's protection domain
// (every connection on the device) while the peer reads, not through this
// connection's alone (docs/limits-and-security.md). Where the
// device bounds a window's accesses by its window (hardware NICs), the
// window is bound over the arena's MR and the data path registers nothing.
// Soft-RoCE checks an access against the MR the window is bound over, not
// against the window, so a window over the arena's MR would let the peer
// read the whole arena, which other connections' rings and messages share:
// there b gets an MR of exactly its bytes (no remote rights of its own)
// for the window to be bound over, registered before Send takes the
// connection's lock and deregistered once the window is revoked
// (lendRegistration). Exports do the same on every device (onesided.go).
//
// The announcement holds its receive buffer until the user releases the
// delivered message, so a receiver lends out no more than its receive
// buffers' worth of messages, as for small ones. Messages keep their order:
// one that arrives behind a rendezvous still being read waits in the inbox.

// rendezvousState is the state of large messages in both directions,
// guarded by Conn.mu. The slices are nil until the direction's first large
// message (initRendezvousIn, initRendezvousOut).
type rendezvousState struct {
	peerMaxMsg int         // largest message Send takes: peerBufSize, or more by rendezvous
	mw         []*verbs.MW // by send slot: the window lending that slot's buffer, allocated on first use
	mr         []*verbs.MR // by send slot: the registration of exactly its buffer (lendExact devices), until revoked
	sending    []bool      // by send slot: lent to the peer, waiting for its done
	out        int         // send slots in a rendezvous (until the window is revoked)
	in         []rvRecv    // by receive buffer: an incoming rendezvous
	bigSlots   []bigSlot   // by receive buffer: recyclers of delivered large messages
	bigRefs    []buffer.RecyclerRef
	inbox      []int // receive buffers of messages not yet delivered, in order (a ring)
	inHead     int
	inLen      int
	stalled    int             // incoming rendezvous with bytes not yet asked for (no buffer, or READ pieces to post)
	reads      int             // incoming rendezvous being read (READs posted, not all done)
	pieces     int             // READs in flight (pieces of the messages being read)
	ahead      int64           // bytes they ask for
	unsigBytes int64           // bytes of the pieces posted since the last that asked for a completion
	held       int64           // bytes of pool buffers taken for incoming large messages, until released (MaxUnreadBytes)
	doneQ      []uint32        // done answers waiting for send-queue room
	inval      []int           // send slots whose window waits to be invalidated
	ctx        context.Context // ends at release: stops waits for pool buffers
	cancel     context.CancelFunc
}

// rvState is where an incoming rendezvous is.
type rvState uint8

const (
	rvNone     rvState = iota // a small message (or nothing)
	rvNeedBuf                 // announced; no buffer yet
	rvWaitPool                // the pool is exhausted (or the sink needs a registration); a goroutine waits for a buffer
	rvNeedPost                // has a buffer; the READs wait for send-queue room
	rvReading                 // READs posted (pieces: some may still wait for room)
	rvReady                   // read; deliverable in order
)

// rvRecv is one incoming rendezvous, by the receive buffer that carried it.
type rvRecv struct {
	state  rvState
	desc   wire.Rendezvous
	posted uint32 // bytes the READs posted ask for
	read   uint32 // bytes the READs completed have landed
	buf    buffer.Buf
	sink   *verbs.MR // a registration of exactly buf with remote write, where READ sinks need one, until the READs end
}

// bigSlot takes back a delivered large message: the buffer returns to the
// pool and the announcement's receive buffer is reposted (its credit goes
// back to the peer).
type bigSlot struct {
	c    *engine
	idx  int
	held int64 // the delivered message's charge (MaxUnreadBytes, the device's unread budget)
}

func (r *bigSlot) Recycle(b buffer.Buf) {
	b.Free()
	c := r.c
	c.mu.Lock()
	rb := c.ep.recv[r.idx]
	c.unchargeLocked(r.held)
	r.held = 0
	c.pumpRendezvousLocked() // a large message may wait for the bytes
	c.mu.Unlock()
	c.recycleRecv(r.idx, rb)
}

// unchargeLocked gives back n bytes of incoming large messages: the
// connection's share and the device's.
func (c *engine) unchargeLocked(n int64) {
	if n == 0 {
		return
	}
	c.rdv.held -= n
	c.dev.Unread.Release(n)
}

// maxRecvMessage is the largest message this side accepts (Config.MaxMessageSize).
func (c *engine) maxRecvMessage() int {
	limit := c.dev.Pool.MaxSize()
	if m := c.cfg.MaxMessageSize; m > 0 {
		limit = min(limit, m)
	}
	return max(limit, c.cfg.BufferSize)
}

// The rendezvous state is made at a connection's first large message,
// each direction's at its own first use (under c.mu): most connections
// never send or receive one, and need not carry its Go memory from
// set-up on.

// initRendezvousIn makes the state of incoming large messages, indexed by
// the receive buffer that carried the announcement.
func (c *engine) initRendezvousIn() {
	if c.rdv.in != nil {
		return
	}
	c.rdv.in = make([]rvRecv, c.ep.maxRecv)
	c.rdv.bigSlots = make([]bigSlot, c.ep.maxRecv)
	for i := range c.rdv.bigSlots {
		c.rdv.bigSlots[i] = bigSlot{c: c, idx: i}
	}
	c.rdv.bigRefs = buffer.NewRecyclerRefs(len(c.rdv.bigSlots), func(i int) buffer.Recycler { return &c.rdv.bigSlots[i] })
	c.rdv.inbox = make([]int, c.ep.maxRecv)
	c.rdv.doneQ = make([]uint32, 0, c.ep.maxRecv)
	c.rdv.ctx, c.rdv.cancel = context.WithCancel(context.Background())
}

// initRendezvousOut makes the state of outgoing large messages, indexed
// by send slot.
func (c *engine) initRendezvousOut() {
	if c.rdv.mw != nil {
		return
	}
	c.rdv.inval = make([]int, 0, c.ep.maxMsgs)
	c.rdv.mw = make([]*verbs.MW, c.ep.maxMsgs)
	c.rdv.mr = make([]*verbs.MR, c.ep.maxMsgs)
	c.rdv.sending = make([]bool, c.ep.maxMsgs)
}

// forceNoWindows, set by tests, makes new connections lend large messages
// and exports through registrations of exactly their bytes, as on a device
// without memory windows, so that path runs on devices that have them.
var forceNoWindows atomic.Bool

// lendRegistration registers exactly b's bytes: on a device without
// memory windows with remote read, as what the peer reads through; on
// devices that bound a window's accesses by its MR (LendExact) for a
// window to be bound over, with no remote access of its own. Elsewhere it
// returns nil and the window is bound over b's arena.
func (c *engine) lendRegistration(b buffer.Buf) (*verbs.MR, error) {
	access := verbs.AccessLocalWrite | verbs.AccessMWBind
	switch {
	case !c.windows:
		access = verbs.AccessLocalWrite | verbs.AccessRemoteRead
	case !c.dev.LendExact:
		return nil, nil
	}
	mr := c.dev.LendMR()
	if err := c.dev.PD.RegMRInto(mr, b.Bytes(), access); err != nil {
		c.dev.PutLendMR(mr)
		return nil, hints.RegistrationError(err, b.Len(), fmt.Sprintf("registering a %d-byte message to lend it", b.Len()))
	}
	return mr, nil
}

// sendRendezvousLocked lends b to the peer through send slot slot's window
// and announces it. The caller reserved the slot, a credit and two
// send-queue entries; exact is b's own registration (lendRegistration) or
// nil, and belongs to the slot from here on whatever the outcome.
func (c *engine) sendRendezvousLocked(b buffer.Buf, slot int, exact *verbs.MR) error {
	c.initRendezvousOut()
	c.closeLendMRLocked(slot) // a failed send's, if one is left
	c.rdv.mr[slot] = exact
	if !c.windows {
		return c.announceRendezvousLocked(b, slot, exact.RKey, false)
	}
	mw := c.rdv.mw[slot]
	if mw == nil {
		var err error
		if mw, err = c.dev.PD.AllocMW(); err != nil {
			c.closeLendMRLocked(slot)
			return err
		}
		c.rdv.mw[slot] = mw
	}
	mr := exact
	if mr == nil {
		if mr = c.dev.ArenaMR(b); mr == nil {
			return errors.New("rendezvous: the buffer's memory registration is gone")
		}
	}
	// The bind and the announcement go in one post list: one doorbell. The
	// bind asks for no completion of its own: the announcement's, or a later
	// one's, retires it (RC completes in order, and a failed bind still
	// produces one). Where windows are bound only into an empty send queue
	// (bindReadyLocked, post.go), the announcement asks for its completion,
	// so the next large message finds the queue retired without a
	// zero-length write posted to flush it.
	var bind verbs.SendWR
	c.sqPushLocked(&bind, wrBind, slot, false)
	rkey := mw.NextRKey()
	c.sendq.bind = verbs.BindWR{WRID: bind.WRID, Flags: bind.Flags, MW: mw, MR: mr,
		Addr: b.Addr(), Len: uint64(b.Len()), Access: verbs.AccessRemoteRead, RKey: rkey}
	return c.announceRendezvousLocked(b, slot, rkey, true)
}

// announceRendezvousLocked posts the announcement of b, lent in send slot
// slot under rkey: behind the window bind in sendq.bind, in one post list
// (withBind), or alone (a registration of its own, without windows).
func (c *engine) announceRendezvousLocked(b buffer.Buf, slot int, rkey uint32, withBind bool) error {
	off := slot * wire.RendezvousLen
	wire.Rendezvous{ID: uint32(slot), Region: wire.Region{Addr: b.Addr(), Len: uint32(b.Len()), RKey: rkey}}.
		AppendTo(c.ep.rvDesc.Full()[off:off])
	ann := verbs.SendWR{Addr: c.ep.rvDesc.Addr() + uint64(off), Len: wire.RendezvousLen, LKey: c.ep.rvDesc.LKey(),
		Opcode: verbs.OpSendWithImm, Imm: wire.EncodeImm(wire.KindRendezvous, uint32(c.stream.pending))}
	c.sqPushLocked(&ann, wrSendRv, slot, withBind && c.dev.QuietBind())
	c.sendq.ctlWR[0] = ann
	pushed := 1
	var err error
	if withBind {
		pushed = 2
		err = c.postBindSendLocked(&c.sendq.bind, c.sendq.ctlWR[:])
	} else {
		err = c.postSendsLocked(c.sendq.ctlWR[:])
	}
	if err != nil {
		c.sqPopLocked(pushed)
		c.failLocked(err)
		return err // a window may be bound: it stays so until release deallocates it
	}
	c.rdv.sending[slot] = true
	c.rdv.out++
	c.grantedLocked()
	c.stream.credits--
	return nil
}

// closeLendMRLocked deregisters send slot slot's own registration, if it
// has one, once no window is bound over it.
func (c *engine) closeLendMRLocked(slot int) {
	if mr := c.rdv.mr[slot]; mr != nil {
		c.rdv.mr[slot] = nil
		c.dev.CloseLendMR(mr)
	}
}

// rendezvousDoneLocked: the peer has read the message of send slot id, so
// revoke its window; the buffer is released when the invalidate completes.
func (c *engine) rendezvousDoneLocked(id uint32) {
	if int(id) >= len(c.rdv.sending) || !c.rdv.sending[id] {
		c.failLocked(fmt.Errorf("%w: peer finished rendezvous %d, which is not outstanding", ErrProtocol, id))
		return
	}
	c.rdv.sending[id] = false
	if !c.windows {
		// Lent through a registration of its own (no windows): revoked by
		// deregistering it, and the send is over.
		c.rdv.out--
		c.closeLendMRLocked(int(id))
		c.msgDoneLocked(int(id), nil)
		return
	}
	c.rdv.inval = append(c.rdv.inval, int(id))
	c.pumpRendezvousLocked()
}

// rendezvousInLocked handles an announcement received in receive buffer idx.
func (c *engine) rendezvousInLocked(idx, n int) {
	d, err := wire.ParseRendezvous(c.ep.recv[idx].Full()[:n])
	if err != nil {
		c.failLocked(fmt.Errorf("%w: %w", ErrProtocol, err))
		return
	}
	if limit := c.maxRecvMessage(); int(d.Region.Len) > limit {
		c.failLocked(fmt.Errorf("%w: peer announced a %d-byte message; this side accepts %d", ErrProtocol, d.Region.Len, limit))
		return
	}
	c.msgs.lent[idx] = true // held until the message is released
	c.initRendezvousIn()
	c.rdv.in[idx] = rvRecv{state: rvNeedBuf, desc: d}
	c.inboxPushLocked(idx)
	c.rdv.stalled++
	if holdRendezvous != nil && holdRendezvous(d) {
		c.rdv.in[idx].state = rvWaitPool // the pump waits at it, as for a pool buffer
		return
	}
	c.pumpRendezvousLocked()
}

// holdRendezvous, set by tests before their connections exist, sees each
// incoming announcement and, by returning true, leaves the message unread
// (its window bound) until the test resumes it.
var holdRendezvous func(wire.Rendezvous) bool

// pumpRendezvousLocked posts what rendezvous wait for, as send-queue room
// allows: the invalidates of our windows the peer is done with, the done
// answers, and the READs of incoming rendezvous (taking a pool buffer only
// for a READ about to be posted, so a peer announcing many large messages
// holds no more than maxRendezvous of them at a time).
func (c *engine) pumpRendezvousLocked() {
	if c.qpDown {
		return // release revokes the windows and frees the buffers
	}
	for len(c.rdv.inval) > 0 && c.sqUsedLocked() < c.ep.sqDepth {
		id := c.rdv.inval[0]
		if c.postLocked(verbs.SendWR{Opcode: verbs.OpLocalInv, RKey: c.rdv.mw[id].RKey()}, wrInval, id, true) != nil {
			return
		}
		c.rdv.inval = append(c.rdv.inval[:0], c.rdv.inval[1:]...)
	}
	for len(c.rdv.doneQ) > 0 && c.sqUsedLocked() < c.ep.sqDepth {
		if c.postLocked(verbs.SendWR{Opcode: verbs.OpSendWithImm,
			Imm: wire.EncodeImm(wire.KindRendezvousDone, c.rdv.doneQ[0])}, wrSendCtl, 0, false) != nil {
			return
		}
		c.rdv.doneQ = append(c.rdv.doneQ[:0], c.rdv.doneQ[1:]...)
	}
	for i := 0; i < c.rdv.inLen && c.rdv.stalled > 0 && c.sqUsedLocked() < c.ep.sqDepth; i++ {
		idx := c.rdv.inbox[(c.rdv.inHead+i)%len(c.rdv.inbox)]
		r := &c.rdv.in[idx]
		switch r.state {
		case rvNone, rvReady:
			continue // a small message, or read
		case rvReading:
			if r.posted == r.desc.Region.Len {
				continue // every piece asked for
			}
		case rvWaitPool:
			return // first in line for the pool: later ones wait behind it
		}
		if r.state == rvNeedBuf {
			if c.rdv.reads >= maxRendezvous {
				return
			}
			// What a peer makes this side hold is bounded before any
			// buffer is taken: the connection's share (MaxUnreadBytes; a
			// release pumps again) and the device's (a goroutine waits for
			// it, as for the pool).
			n := int64(r.desc.Region.Len)
			if c.rdv.held > 0 && c.rdv.held+n > c.cfg.MaxUnreadBytes {
				return
			}
			if ok, _ := c.dev.Unread.TryCharge(n, c.rdv.held == 0); !ok {
				r.state = rvWaitPool
				go c.awaitBuffer(idx, int(n), false)
				return
			}
			c.rdv.held += n
			if c.dev.Caps.ReadSinkRemoteWrite {
				// The READ's sink needs a registration with remote write
				// (iWARP: the response arrives as tagged writes), of
				// exactly the buffer: made off the poller, as a pool wait.
				r.state = rvWaitPool
				c.rdv.held -= n // charged again when the buffer comes
				go c.awaitBuffer(idx, int(n), true)
				return
			}
			b, err := c.dev.Pool.TryGet(int(r.desc.Region.Len))
			switch {
			case errors.Is(err, buffer.ErrNoFree) || errors.Is(err, buffer.ErrExhausted):
				// Wait off the poller, for a new arena (whose registration
				// takes milliseconds, too long to hold up the completions of
				// every connection on this poller) or, with the pool at its
				// limit, for a release. The message stays in order meanwhile,
				// and the ones behind it (which could not be delivered before
				// it anyway) take no buffer that it needs.
				r.state = rvWaitPool
				c.rdv.held -= n // charged again when the buffer comes
				go c.awaitBuffer(idx, int(n), true)
				return
			case err != nil:
				c.unchargeLocked(n)
				c.failLocked(fmt.Errorf("receiving a %d-byte message: %w", r.desc.Region.Len, err))
				return
			}
			r.buf, r.state = b, rvNeedPost
		}
		if !c.postReadPiecesLocked(idx) {
			return // later messages wait behind this one's pieces
		}
	}
}

// readChunk is about the most one RDMA READ of a large message asks for,
// and readTail the size of its last READ (readPieceLen): a large message is
// read in pieces, at most readAheadBytes of them in flight on a connection
// (or one piece, if larger): the bytes of maxRendezvous 64 KiB messages,
// which a clean wire's pipeline needs. Over a lossy wire a READ pays for
// all it asks for at once: Soft-RoCE ignores a read response beyond the
// one it expects, so a lost packet is noticed only when a response to a
// later READ arrives (the requester then retries at once) or, with none to
// come, when the retransmission timer fires (AckTimeout); and the retry
// asks again for everything after the gap. Pieces bound what a retry
// repeats, and the small last piece lets a loss anywhere before it be
// noticed by its response rather than by the timer.
const (
	readChunk      = 64 << 10
	readTail       = 256 // one packet at any MTU
	readAheadBytes = 8 * readChunk
)

// readPieceLen is the length of the READ that starts at offset off of an
// n-byte message: pieces of readChunk (the last of them up to readTail
// longer, rather than a sliver), then readTail bytes; a message of at most
// 2*readTail bytes in one.
func readPieceLen(off, n uint32) uint32 {
	if n <= 2*readTail {
		return n - off
	}
	body := n - readTail
	if off >= body {
		return n - off
	}
	if rest := body - off; rest < readChunk+readTail {
		return rest
	}
	return readChunk
}

// postReadPiecesLocked posts the READs of the rendezvous in receive buffer
// idx (which has its buffer) that the send queue and readAheadBytes allow, and
// reports whether every piece is now asked for.
func (c *engine) postReadPiecesLocked(idx int) bool {
	r := &c.rdv.in[idx]
	n := r.desc.Region.Len
	lkey := r.buf.LKey()
	if r.sink != nil {
		lkey = r.sink.LKey
	}
	ahead := min(2*maxRendezvous, c.cfg.ReadDepth) // pieces: the NIC holds further READs, and every request behind them
	whole := testhooks.WholeReads.Load()
	for r.posted < n && c.rdv.pieces < ahead && c.sqUsedLocked() < c.ep.sqDepth {
		l := readPieceLen(r.posted, n)
		if whole {
			l = n - r.posted
		}
		if !whole && c.rdv.pieces > 0 && c.rdv.ahead+int64(l) > readAheadBytes {
			break
		}
		// A piece asks for a completion if it is its message's last, or
		// if the pieces since the last one that did reach half the
		// read-ahead: RC completes a send queue's requests in order, so a
		// completion retires the pieces before it, and the window always
		// holds one whose completion will free it (where sends complete
		// locally, iWARP, every READ asks for its own: sqPushLocked).
		signal := r.posted+l == n || c.rdv.unsigBytes+int64(l) >= readAheadBytes/2
		if c.postLocked(verbs.SendWR{Addr: r.buf.Addr() + uint64(r.posted), Len: l,
			LKey: lkey, Opcode: verbs.OpRDMARead,
			RemoteAddr: r.desc.Region.Addr + uint64(r.posted), RKey: r.desc.Region.RKey}, wrReadRv, idx, signal) != nil {
			return false
		}
		if r.state == rvNeedPost {
			r.state = rvReading
			c.rdv.reads++
		}
		r.posted += l
		c.rdv.pieces++
		c.rdv.ahead += int64(l)
		if signal {
			c.rdv.unsigBytes = 0
		} else {
			c.rdv.unsigBytes += int64(l)
		}
		if r.posted == n {
			c.rdv.stalled--
		}
	}
	return r.posted == n
}

// awaitBuffer waits for the device's unread budget (unless charged) and
// the pool to have room for the rendezvous in receive buffer idx; nothing
// is lost meanwhile, the peer's buffer stays lent to us.
func (c *engine) awaitBuffer(idx, n int, charged bool) {
	if !charged && !c.awaitUnread(int64(n)) {
		return // the connection is being released
	}
	// An arena, if the pool needs one, is registered at low priority
	// (internal/device's lowprio.go); with the pool at its limit, GetWait
	// waits for a release.
	_ = c.dev.RunLowPriority(func() error { return c.dev.Pool.Grow(n, 1) })
	b, err := c.dev.Pool.GetWait(c.rdv.ctx, n)
	var sink *verbs.MR
	if err == nil && c.dev.Caps.ReadSinkRemoteWrite {
		sink = c.dev.LendMR()
		if rerr := c.dev.PD.RegMRInto(sink, b.Full()[:n], verbs.AccessLocalWrite|verbs.AccessRemoteWrite); rerr != nil {
			c.dev.PutLendMR(sink)
			sink = nil
			b.Free()
			c.dev.BufReturned() // the device may be waiting for its last buffer
			err = hints.RegistrationError(rerr, n, fmt.Sprintf("registering a %d-byte message's landing buffer", n))
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released || c.rdv.in[idx].state != rvWaitPool {
		if err == nil {
			if sink != nil {
				c.dev.CloseLendMR(sink)
			}
			b.Free()
			c.dev.BufReturned() // the device may be waiting for its last buffer
		}
		c.dev.Unread.Release(int64(n))
		return
	}
	if err != nil {
		c.dev.Unread.Release(int64(n))
		if c.rdv.ctx.Err() == nil {
			c.failLocked(fmt.Errorf("receiving a %d-byte message: %w", n, err))
		}
		return
	}
	c.rdv.held += int64(n)
	c.rdv.in[idx].buf, c.rdv.in[idx].sink, c.rdv.in[idx].state = b, sink, rvNeedPost
	c.pumpRendezvousLocked()
}

// awaitUnread waits until the device's unread budget takes n more bytes
// for c, or until c is released (false). Each try is made under c.mu, so
// that c's own releases, which may leave it alone (holding no large
// message) and so entitled to one past the budget, cannot slip between
// the check and the wait.
func (c *engine) awaitUnread(n int64) bool {
	for {
		c.mu.Lock()
		ok, changed := c.dev.Unread.TryCharge(n, c.rdv.held == 0)
		c.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-changed:
		case <-c.rdv.ctx.Done():
			return false
		}
	}
}

// readDoneLocked: a READ of the rendezvous in receive buffer idx ended.
// Its READs complete in the order they were posted (RC), so each completion
// lands the next piece; the message is read when the last one has.
func (c *engine) readDoneLocked(idx int, wc *verbs.WC) {
	c.rdv.pieces--
	r := &c.rdv.in[idx]
	l := readPieceLen(r.read, r.desc.Region.Len)
	if testhooks.WholeReads.Load() {
		l = r.posted - r.read
	}
	c.rdv.ahead -= int64(l)
	switch wc.Status {
	case verbs.WCSuccess:
	case verbs.WCRemAccessErr, verbs.WCRemInvReqErr:
		// The peer's NIC refused: its announcement named memory it had not
		// lent us. The RC error has taken the QP down.
		c.failLocked(fmt.Errorf("%w: reading a %d-byte message the peer announced: %w",
			ErrRemoteAccess, r.desc.Region.Len, wcErr(wc)))
		return
	default:
		c.sendFailedLocked(wc)
		return
	}
	if r.state != rvReading {
		return // released meanwhile
	}
	r.read += l
	if r.read < r.desc.Region.Len {
		c.pumpRendezvousLocked() // the next piece may go now
		return
	}
	c.rdv.reads--
	if r.sink != nil {
		c.dev.CloseLendMR(r.sink) // on failure release closes it, once the QP is gone
		r.sink = nil
	}
	r.state = rvReady
	c.arrived.bytes += uint64(r.desc.Region.Len) // a large message's bytes count when its last READ completes
	c.rdv.doneQ = append(c.rdv.doneQ, r.desc.ID)
	c.pumpRendezvousLocked()
	c.drainInboxLocked()
}

// inboxPushLocked queues receive buffer idx's message behind the ones not
// yet delivered.
func (c *engine) inboxPushLocked(idx int) {
	c.rdv.inbox[(c.rdv.inHead+c.rdv.inLen)%len(c.rdv.inbox)] = idx
	c.rdv.inLen++
}

// drainInboxLocked delivers the messages at the head of the inbox that are
// complete. Messages() has room for every receive buffer, and each queued
// message holds one, so this never blocks.
func (c *engine) drainInboxLocked() {
	for c.rdv.inLen > 0 && !c.msgs.closed {
		idx := c.rdv.inbox[c.rdv.inHead]
		r := &c.rdv.in[idx]
		switch r.state {
		case rvNone:
			c.msgs.mq.Push(c.ep.recv[idx])
		case rvReady:
			c.rdv.bigSlots[idx].held = int64(r.desc.Region.Len)
			r.buf.SetRecyclerRef(&c.rdv.bigRefs[idx])
			c.msgs.mq.Push(r.buf)
			*r = rvRecv{}
		default:
			return // still being read: everything behind it waits
		}
		c.rdv.inHead = (c.rdv.inHead + 1) % len(c.rdv.inbox)
		c.rdv.inLen--
	}
}

// releaseRendezvousLocked takes apart the rendezvous of a connection being
// released: it deallocates our windows (which revokes them) and appends to
// rel the buffers of undelivered large messages (a READ may still write into
// them until the QP is destroyed); undelivered messages' receive buffers go
// back with the receive ring.
func (c *engine) releaseRendezvousLocked(rel []buffer.Buf) []buffer.Buf {
	if c.rdv.cancel != nil {
		c.rdv.cancel()
	}
	for ; c.rdv.inLen > 0; c.rdv.inLen-- {
		idx := c.rdv.inbox[c.rdv.inHead]
		c.rdv.inHead = (c.rdv.inHead + 1) % len(c.rdv.inbox)
		if c.rdv.in[idx].buf.Valid() {
			rel = append(rel, c.rdv.in[idx].buf)
			c.unchargeLocked(int64(c.rdv.in[idx].desc.Region.Len))
		}
		if sink := c.rdv.in[idx].sink; sink != nil {
			// The QP is down: a READ cut short lands nothing more. The
			// buffer itself waits for the QP's destruction (rel).
			c.dev.CloseLendMR(sink)
		}
		c.rdv.in[idx] = rvRecv{}
		c.msgs.lent[idx] = false
	}
	for i, mw := range c.rdv.mw {
		if mw != nil {
			c.ep.closeMW(mw) // on failure the QP is destroyed, not pooled: its destruction ends the window (type 2 windows live on one QP)
			c.rdv.mw[i] = nil
		}
	}
	for i := range c.rdv.mr {
		c.closeLendMRLocked(i) // after the windows: an MR with a window bound over it cannot be deregistered
	}
	return rel
}

// invalidatedLocked retires the local invalidation that revoked a large
// message's window once the peer read it (wrInval): the message's send is
// over.
func (c *engine) invalidatedLocked(idx int, wc *verbs.WC) {
	c.sendFailedLocked(wc)
	c.rdv.out--
	if wc.Status == verbs.WCSuccess {
		c.closeLendMRLocked(idx) // else the window may still be bound: release deregisters it
	}
	c.msgDoneLocked(idx, wcErr(wc))
}
