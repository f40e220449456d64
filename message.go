//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/lendq"
	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// The message view: whole messages, no copies. A sender fills a registered
// Buf from Alloc and Sends it; the NIC reads it in place. A receiver gets the
// Buf the NIC wrote into (one of the connection's receive buffers) on
// Messages(); releasing it reposts that receive and returns its credit to
// the sender. The stream view (Read/Write) and the message view share the
// connection's credits: a receiver that holds messages without releasing
// them stops its peer's writes too, as a full TCP window would.
//
// A message larger than the peer's receive buffers (up to MaxMessageSize)
// is not split: the peer reads it from the sender's Buf with RDMA READs
// into one pool buffer of its size (rendezvous.go) and delivers that, in
// order; releasing it returns the buffer to the pool and the credit.
//
// How long bytes stay valid: a Buf from Alloc is the caller's until Send
// (Send takes it over, in every case, and releases it once the NIC, or for a
// large message the peer, has read it). A received Buf's bytes are valid
// until its Release; after that the handle is stale (Bytes returns nil) and
// the memory receives new data.

// messageState is the message view's state, guarded by Conn.mu.
type messageState struct {
	mq       lendq.Queue[buffer.Buf]   // internal/lendq: received messages until Recv or Messages() takes them
	nq       lendq.Queue[Notification] // ... notifications, until RecvNotification or Notifications()
	closed   bool
	slots    []recvSlot
	slotRefs []buffer.RecyclerRef // slots[i], prepared for SetRecyclerRef
	lent     []bool               // receive buffer i is with the user (message or notification)
	inFlight []buffer.Buf         // messages in flight, by send slot
	free     []int
	async    []bool   // the send slot's outcome goes to Completions()
	id       []uint64 // ... with this id
}

// recvSlot returns a receive buffer lent to the user to the connection.
type recvSlot struct {
	c   *engine
	idx int
}

func (r *recvSlot) Recycle(b buffer.Buf) { r.c.recycleRecv(r.idx, b) }

func (c *engine) initMessages() {
	n := c.ep.maxRecv
	c.msgs.mq = lendq.New[buffer.Buf](n)   // at most n receive buffers can be lent at once
	c.msgs.nq = lendq.New[Notification](n) // likewise
	c.msgs.slots = make([]recvSlot, n)
	c.msgs.lent = make([]bool, n)
	for i := range c.msgs.slots {
		c.msgs.slots[i] = recvSlot{c, i}
	}
	c.msgs.slotRefs = buffer.NewRecyclerRefs(n, func(i int) buffer.Recycler { return &c.msgs.slots[i] })
	for i := range c.ep.recv {
		c.ep.recv[i].SetRecyclerRef(&c.msgs.slotRefs[i])
	}
	c.initOneSided()
}

// initSendSlotsLocked makes the message view's send slots at the first
// Send (or PostSend): a connection that only streams never needs them.
// Called with c.mu held.
func (c *engine) initSendSlotsLocked() {
	if c.msgs.inFlight != nil {
		return
	}
	c.msgs.inFlight = make([]buffer.Buf, c.ep.maxMsgs)
	c.msgs.async = make([]bool, c.ep.maxMsgs)
	c.msgs.id = make([]uint64, c.ep.maxMsgs)
	c.msgs.free = make([]int, 0, c.ep.maxMsgs)
	for i := c.ep.maxMsgs - 1; i >= 0; i-- {
		c.msgs.free = append(c.msgs.free, i)
	}
}

// maxMessageSize is Conn.MaxMessageSize on the engine.
func (c *engine) maxMessageSize() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rdv.peerMaxMsg
}

// alloc is Conn.Alloc on the engine.
func (c *engine) alloc(n int) (buffer.Buf, error) {
	if c.isClosed() {
		return buffer.Buf{}, net.ErrClosed
	}
	b, err := c.dev.Pool.Get(n)
	if errors.Is(err, buffer.ErrExhausted) {
		err = fmt.Errorf("%w; the limit is Config.PoolMaxBytes of the device's first connection", err)
	}
	if err != nil {
		return buffer.Buf{}, err
	}
	return b, nil
}

// sendMessage is Send (async: PostSend with id) on the engine: b belongs
// to the connection from here on, whatever the outcome.
func (c *engine) sendMessage(ctx context.Context, b buffer.Buf, async bool, id uint64) error {
	n := b.Len()
	b, err := c.ownBuf(b)
	if err != nil {
		return err
	}
	if err := c.send(ctx, b, async, id); err != nil {
		b.Release()
		return err
	}
	c.counts.sent(n)
	return nil
}

func (c *engine) messages() <-chan buffer.Buf { return userChan(c, &c.msgs.mq) }

func (c *engine) recv(ctx context.Context) (buffer.Buf, error) { return receive(c, ctx, &c.msgs.mq) }

// ownBuf returns b if it is a buffer of this connection's device pool, or
// else a copy of it in one (b is then released): the NIC can only send
// memory registered with the connection's protection domain, and a Buf
// from another pool (another device's connection, a TCP-backed Conn's, a
// buffer.Pool of the application's) has no keys here. Zero-copy only for
// the connection's own buffers (Alloc). On error b is released.
func (c *engine) ownBuf(b buffer.Buf) (buffer.Buf, error) {
	if !b.Valid() || c.dev.Pool.Owns(b) {
		return b, nil
	}
	nb, err := c.dev.Pool.Get(b.Len())
	if err != nil {
		b.Release()
		return buffer.Buf{}, fmt.Errorf("copying a buffer from another pool into this connection's: %w", err)
	}
	copy(nb.Full(), b.Bytes())
	nb.SetLen(b.Len())
	b.Release()
	return nb, nil
}

func (c *engine) send(ctx context.Context, b buffer.Buf, async bool, id uint64) error {
	if !b.Valid() {
		return buffer.ErrReleased
	}
	// End runs after the unlock (defers run last-in first-out): ending a
	// wait may poll the CQ and dispatch completions, which takes c.mu.
	var w poller.Waiter
	defer w.End()
	// A large message's own registration (lendRegistration), made before
	// the lock: registering takes a system call and pins pages, and the
	// connection's completions need the lock meanwhile. It is handed to
	// the send slot, or deregistered (after the unlock) if the send fails
	// before.
	var exact *verbs.MR
	if b.Len() > c.peerBufSize && b.Len() <= c.rdv.peerMaxMsg {
		var err error
		if exact, err = c.lendRegistration(b); err != nil {
			return err
		}
		defer func() {
			if exact != nil {
				c.dev.CloseLendMR(exact)
			}
		}()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkMessageSizeLocked(b.Len()); err != nil {
		return err
	}
	large := b.Len() > c.peerBufSize
	if err := c.awaitSendSlotLocked(ctx, &w, large, async); err != nil {
		return err
	}
	slot := c.msgs.free[len(c.msgs.free)-1]
	c.msgs.free = c.msgs.free[:len(c.msgs.free)-1]
	c.msgs.inFlight[slot] = b
	c.msgs.async[slot] = async
	c.msgs.id[slot] = id
	var err error
	if large {
		mr := exact
		exact = nil // the slot's now
		err = c.sendRendezvousLocked(b, slot, mr)
	} else {
		err = c.postMessageLocked(b, slot, async)
	}
	if err != nil {
		c.msgs.inFlight[slot] = buffer.Buf{}
		c.msgs.free = append(c.msgs.free, slot)
		return err
	}
	if async {
		c.rma.asyncOut++
	}
	return nil
}

// checkMessageSizeLocked refuses a message larger than the peer accepts.
func (c *engine) checkMessageSizeLocked(n int) error {
	if n <= c.rdv.peerMaxMsg {
		return nil
	}
	return fmt.Errorf("%w: %d bytes, limit %d", ErrMessageTooLarge, n, c.rdv.peerMaxMsg)
}

// awaitSendSlotLocked waits, within ctx and the write deadline, until a
// message can be posted: two credits (the last is for control messages), a
// free send slot, room in the send queue, and for a large message a
// receive buffer reserved for the peer's answer and a send queue the
// device lets a window be bound into. An asynchronous send that might not
// find room in Completions() fails at once with ErrCompletionsFull.
func (c *engine) awaitSendSlotLocked(ctx context.Context, w *poller.Waiter, large, async bool) error {
	c.initSendSlotsLocked()
	for {
		if err := c.writeErrLocked(); err != nil {
			return err
		}
		if async && !c.asyncRoomLocked() {
			return ErrCompletionsFull
		}
		c.counts.creditCheck(c.stream.credits < 2) // metrics
		if c.stream.credits >= 2 && len(c.msgs.free) > 0 && c.sqUsedLocked() < c.ep.sqDepth-ctlReserve/2-1 &&
			(!large || c.rdv.out < c.win.rvReserve || c.growReserveLocked()) &&
			(!large || c.bindReadyLocked()) { // bindReadyLocked: Soft-RoCE re-executes binds on retry
			return nil
		}
		if large && c.win.rvReserve == 0 && !c.qpDown && !c.win.poolGrowing { // growing: woken when it is done
			return fmt.Errorf("%w: no receive buffer for the peer's answer to a large message", buffer.ErrExhausted)
		}
		if err := c.waitLocked(ctx, &c.wrDeadline, w); err != nil {
			return err
		}
	}
}

// postMessageLocked posts a message that fits the peer's receive buffer
// from its send slot, with the credits pending so far.
func (c *engine) postMessageLocked(b buffer.Buf, slot int, async bool) error {
	wr := verbs.SendWR{Addr: b.Addr(), Len: uint32(b.Len()), LKey: b.LKey(),
		Opcode: verbs.OpSendWithImm, Imm: wire.EncodeImm(wire.KindMessage, uint32(c.stream.pending))}
	if b.Len() <= c.inlineMax {
		wr.Flags = verbs.SendInline
	}
	// An asynchronous send's end goes to Completions() or RecvCompletion,
	// with its own completion or a later request's (asyncForceLocked).
	if err := c.postLocked(wr, wrSendMsg, slot, async && c.asyncForceLocked(false)); err != nil {
		return err
	}
	c.grantedLocked()
	c.stream.credits--
	return nil
}

// channelUser records that the user may wait on one of the connection's
// delivery channels without calling into the library, so the poller must
// keep delivering even while other callers drive the CQ (see poller.Poller.
// AddChannelUser). Recv and RecvNotification drive the CQ themselves and
// do not count.
func (c *engine) channelUser() {
	if !c.chanUser.Load() && c.chanUser.CompareAndSwap(false, true) {
		c.ep.poller.AddChannelUser()
	}
}

// receive takes the next value from q, one of the queues the poller
// delivers into (messages, notifications): from its ring under c.mu, or,
// once the user took its channel, from the channel. While it waits it
// polls the completion queue itself, as Read does: a completion handled on
// the waiting goroutine needs no wake-up of the poller's thread and no
// handoff.
func receive[T any](c *engine, ctx context.Context, q *lendq.Queue[T]) (T, error) {
	var w poller.Waiter
	defer w.End()
	var zero T
again:
	var wake <-chan struct{}
	for {
		c.mu.Lock()
		if v, ok := q.Pop(); ok {
			c.mu.Unlock()
			c.windowTaken()
			return v, nil
		}
		if c.sendq.asyncUnsig && any(q) == any(&c.rma.oq) {
			c.flushAsyncLocked() // the end waited for may come with no completion of its own
		}
		viaChan := q.ViaChan()
		switch {
		case c.closed:
			c.mu.Unlock()
			return zero, net.ErrClosed
		case !viaChan && q.Ended():
			c.mu.Unlock()
			return received(c, zero, false)
		}
		if !viaChan && w.Started() && !w.Spinning() {
			// About to park: the wake channel is taken in the critical
			// section that found the ring empty, so no delivery is missed.
			wake = c.wake.Wait()
		}
		c.mu.Unlock()
		if viaChan {
			select {
			case v, ok := <-q.Chan():
				return received(c, v, ok)
			default:
			}
		}
		if ctx != nil && ctx.Err() != nil {
			return zero, ctx.Err()
		}
		if c.rdDeadline.Expired() {
			return zero, os.ErrDeadlineExceeded
		}
		if wake != nil || viaChan && w.Started() && !w.Spinning() {
			break
		}
		c.spinWait(&w, &c.rdSpin) // false (park) is seen above, after one more look
	}
	c.flushCredits()
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	var ch chan T // ring mode: woken by any state change (a delivery, the user taking the channel, the end); receive looks again
	if wake == nil {
		ch = q.Chan() // the user took it (viaChan), so it is made
	}
	select {
	case v, ok := <-ch:
		return received(c, v, ok)
	case <-wake:
		w.End() // a new wait, with a new spin budget
		goto again
	case <-c.rdDeadline.Wait():
		return zero, os.ErrDeadlineExceeded
	case <-c.closing:
		return zero, net.ErrClosed
	case <-done:
		return zero, ctx.Err()
	}
}

// received is the outcome of a receive from ch: v, or, if ch was closed,
// why (Messages() and Notifications() close at the end of the connection).
func received[T any](c *engine, v T, ok bool) (T, error) {
	if ok {
		c.windowTaken()
		return v, nil
	}
	var zero T
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return zero, net.ErrClosed
	case c.stream.eof:
		return zero, io.EOF
	case c.stream.rerr != nil:
		return zero, c.stream.rerr
	}
	return zero, io.EOF
}

// deliverMessageLocked lends receive buffer idx to the user, or queues it
// behind a large message still being read. The channel has room for every
// receive buffer, so this never blocks the poller.
func (c *engine) deliverMessageLocked(idx, n int) {
	b := c.ep.recv[idx]
	b.SetLen(n)
	c.msgs.lent[idx] = true
	if c.rdv.inLen > 0 {
		c.inboxPushLocked(idx)
		return
	}
	c.msgs.mq.Push(b)
}

// recycleRecv takes back a lent receive buffer (the user released it) and
// reposts it, which returns its credit to the peer.
func (c *engine) recycleRecv(idx int, b buffer.Buf) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs.lent[idx] = false
	c.ep.recv[idx] = b
	if c.released {
		if c.ringFreed { // else release frees it with the ring
			b.Free() // the connection is gone: back to the pool
			c.dev.BufReturned()
		}
		return
	}
	if c.qpDown {
		return
	}
	c.recvWRs = append(c.recvWRs[:0], c.ep.recvWR(idx))
	c.repostLocked()
	c.broadcast()
}

// closeMessagesLocked ends Messages() and Notifications(): after end of
// stream, a receive error, or release. Only the poller (under c.mu) sends on
// them, so closing under c.mu is safe.
// What waits in a ring closes the channel later (lendq.Queue.End); release
// hands it to the channel, which it drains.
func (c *engine) closeMessagesLocked() {
	if !c.msgs.closed {
		c.msgs.closed = true
		c.msgs.mq.End()
		c.msgs.nq.End()
		c.broadcast() // a Recv parked on the ring's wake-up
	}
	if c.released {
		c.msgs.mq.ToChan()
		c.msgs.nq.ToChan()
	}
}

// releaseMessageSendsLocked ends the sends in flight at release: an
// asynchronous one's completion reports net.ErrClosed, and its buffer joins
// rel, released once the QP is destroyed (the NIC may still read it).
func (c *engine) releaseMessageSendsLocked(rel []buffer.Buf) []buffer.Buf {
	for i, b := range c.msgs.inFlight {
		if b.Valid() {
			if c.msgs.async[i] {
				c.rma.asyncOut--
				c.rma.oq.Push(OpCompletion{ID: c.msgs.id[i], Err: net.ErrClosed})
			}
			rel = append(rel, b)
			c.msgs.inFlight[i] = buffer.Buf{}
		}
	}
	return rel
}

// userChan hands q's channel to the user (Messages, Notifications,
// Completions): the poller keeps delivering for a user who may wait on it
// without calling into the library, and what waits in the ring goes first.
func userChan[T any](c *engine, q *lendq.Queue[T]) <-chan T {
	c.channelUser()
	if !q.ViaChan() {
		c.mu.Lock()
		q.ToChan()
		if any(q) == any(&c.rma.oq) {
			// Ends of operations posted unsignaled before the channel was
			// taken must not wait for a later completion: from now on
			// every asynchronous request is signaled (asyncForceLocked).
			c.flushAsyncLocked()
		}
		c.mu.Unlock()
	}
	return q.Chan()
}
