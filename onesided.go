//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/lendq"
	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/verbs"
)

// One-sided operations: a connection exports a registered buffer with the
// rights it chooses; the peer, given the descriptor (RemoteBuf, sent in a
// message), writes into it or reads from it without the exporter's CPU.
// WriteRemoteImm also tells the exporter, on Notifications().
//
// Nothing is remotely accessible unless exported, and an export ends when it
// is closed or its connection ends. An access outside the exported range is
// refused by the NIC: the initiator's operation fails with ErrRemoteAccess
// and, as for any RC transport error, the connection then fails. The
// operations check the range against the descriptor first, so only a forged
// descriptor reaches the NIC.
//
// An export's key is a memory window bound to its connection's QP (on
// devices with type 2 windows): another connection's peer that learns it
// still cannot use it.

// asyncRoomLocked reports whether one more asynchronous operation's
// completion is sure to fit Completions(). Only the poller sends on it
// (under c.mu, held here) and the user only takes from it, so the check
// stays true until the operation is posted.
func (c *engine) asyncRoomLocked() bool { return c.rma.asyncOut+c.rma.oq.Queued() < c.rma.oq.Size() }

// exported is what grants the peer access to an Export's buffer: the
// registration and, where the device has them, the window bound to the
// connection's QP.
type exported struct {
	c    *engine
	buf  buffer.Buf
	mr   *verbs.MR
	mw   *verbs.MW // nil on a device without type 2 memory windows
	once sync.Once
	err  error
}

// open registers the export's bytes and grants the rights: through a
// window bound on this connection's QP, or (without windows) on the MR.
func (e *Export) open(rights verbs.AccessFlags) error {
	c, b := e.c, e.buf
	var err error
	if !c.windows {
		if e.mr, err = c.dev.PD.RegMR(b.Bytes(), verbs.AccessLocalWrite|rights); err != nil {
			return err
		}
		e.remote = RemoteBuf{Addr: e.mr.Addr(), Len: uint32(b.Len()), RKey: e.mr.RKey}
		return nil
	}
	// A registration of exactly these bytes (with no remote rights of its
	// own): some providers (Soft-RoCE) bound a window's accesses by its
	// MR rather than the window, so the MR must not reach further.
	if e.mr, err = c.dev.PD.RegMR(b.Bytes(), verbs.AccessLocalWrite|verbs.AccessMWBind); err != nil {
		return err
	}
	if e.mw, err = c.dev.PD.AllocMW(); err != nil {
		return err
	}
	rkey, err := c.bindWindow(e.mw, e.mr, b, rights)
	if err != nil {
		return err
	}
	e.remote = RemoteBuf{Addr: e.mr.Addr(), Len: uint32(b.Len()), RKey: rkey}
	return nil
}

// bindWindow binds mw over b (registered as mr) with rights, through this
// connection's send queue, and waits for the bind to complete: from then
// on the window's key works for this connection's peer alone.
func (c *engine) bindWindow(mw *verbs.MW, mr *verbs.MR, b buffer.Buf, rights verbs.AccessFlags) (uint32, error) {
	var w poller.Waiter
	defer w.End()
	ctx := context.Background()
	c.mu.Lock()
	idx, err := c.takeOpSlotLocked(ctx, &w, false, false)
	if err != nil {
		c.mu.Unlock()
		return 0, err
	}
	for !c.bindReadyLocked() { // bindReadyLocked: Soft-RoCE re-executes binds on retry
		if err := c.waitLocked(ctx, &c.wrDeadline, &w); err != nil {
			c.giveBackOpSlotLocked(idx)
			c.mu.Unlock()
			return 0, err
		}
	}
	s := &c.rma.ops[idx]
	b.Retain()
	s.async, s.atomic, s.local, s.name = false, false, b, "memory window bind (export)"
	var bind verbs.SendWR
	c.sqPushLocked(&bind, wrOneSided, idx, true)
	rkey, err := c.ep.qp.PostBindMW(bind.WRID, mw, mr, b.Addr(), uint64(b.Len()), rights)
	if err != nil {
		c.sqPopLocked(1)
		c.failLocked(err)
		ref := c.giveBackOpSlotLocked(idx)
		c.mu.Unlock()
		ref.Release()
		return 0, err
	}
	c.mu.Unlock()
	w.End()
	if _, err := c.awaitOp(ctx, &w, s); err != nil {
		return 0, fmt.Errorf("binding a memory window for the export: %w", err)
	}
	return rkey, nil
}

// revoke is Export.Close: the Export leaves its connection's set, then
// closes.
func (e *Export) revoke() error {
	e.c.mu.Lock()
	delete(e.c.rma.exports, e)
	e.c.mu.Unlock()
	return e.close()
}

// close revokes the window (deallocating a bound type 2 window ends every
// access through it), then deregisters the bytes and drops the reference.
func (e *Export) close() error {
	e.once.Do(func() {
		var errs []error
		if e.mw != nil {
			errs = append(errs, e.c.ep.closeMW(e.mw)) // on failure the QP is destroyed, not pooled
		}
		if e.mr != nil {
			errs = append(errs, e.mr.Close())
		}
		e.buf.Release()
		e.err = errors.Join(errs...)
	})
	return e.err
}

// oneSidedState is the one-sided operations' state, guarded by Conn.mu.
type oneSidedState struct {
	ops      []opSlot
	free     []int
	oq       lendq.Queue[OpCompletion] // internal/lendq: ends of asynchronous operations until RecvCompletion or Completions() takes them
	asyncOut int                       // asynchronous operations posted whose completion is not yet queued
	exports  map[*Export]struct{}
	// atomicRes holds the atomics' old values, 8 bytes per operation
	// slot (atomics.go); made at the first atomic.
	atomicRes buffer.Buf
}

// opSlot tracks one one-sided operation in flight.
type opSlot struct {
	done   chan opResult // for the blocking forms; capacity 1, made at the slot's first use (under mu)
	async  bool
	atomic bool // the NIC writes the word's old value into the slot's 8 bytes of c.rma.atomicRes
	id     uint64
	local  buffer.Buf // the local buffer (for an atomic, c.rma.atomicRes), referenced until the end
	name   string     // the operation, for its error (a failed completion's opcode is not valid)
}

// opResult is a blocking operation's end: an atomic's old value, or the error.
type opResult struct {
	value uint64
	err   error
}

func (c *engine) initOneSided() {
	// Room for every operation and asynchronous send that can be in flight,
	// so the poller never blocks on it.
	c.rma.oq = lendq.New[OpCompletion](c.ep.maxOps + c.ep.maxMsgs)
	c.rma.exports = make(map[*Export]struct{})
}

// export is Conn.Export on the engine.
func (c *engine) export(b buffer.Buf, access Access) (*Export, error) {
	if access&^(RemoteWrite|RemoteRead|RemoteAtomic) != 0 || access == 0 {
		return nil, fmt.Errorf("invalid access %d", access)
	}
	if access&RemoteAtomic != 0 {
		if err := c.atomicsUnsupported(); err != nil {
			return nil, err
		}
		if b.Addr()%atomicWordSize != 0 {
			return nil, fmt.Errorf("RemoteAtomic needs an 8-byte aligned buffer (one from Alloc), not 0x%x", b.Addr())
		}
	}
	if err := b.Retain(); err != nil {
		return nil, err
	}
	var rights verbs.AccessFlags
	if access&RemoteWrite != 0 {
		rights |= verbs.AccessRemoteWrite
	}
	if access&RemoteRead != 0 {
		rights |= verbs.AccessRemoteRead
	}
	if access&RemoteAtomic != 0 {
		rights |= verbs.AccessRemoteAtomic
	}
	e := &Export{exported: exported{c: c, buf: b}}
	if err := e.open(rights); err != nil {
		e.close()
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		e.close()
		return nil, net.ErrClosed
	}
	c.rma.exports[e] = struct{}{}
	c.mu.Unlock()
	return e, nil
}

func (c *engine) notifications() <-chan Notification { return userChan(c, &c.msgs.nq) }

func (c *engine) recvNotification(ctx context.Context) (Notification, error) {
	return receive(c, ctx, &c.msgs.nq)
}

func (c *engine) completions() <-chan OpCompletion { return userChan(c, &c.rma.oq) }

func (c *engine) recvCompletion(ctx context.Context) (OpCompletion, error) {
	return receive(c, ctx, &c.rma.oq)
}

// writeRemote is WriteRemote (withImm: WriteRemoteImm); async: its Post form.
func (c *engine) writeRemote(ctx context.Context, local buffer.Buf, remote RemoteBuf, offset uint64, imm uint32,
	withImm, async bool, id uint64) error {
	opcode := uint32(verbs.OpRDMAWrite)
	if withImm {
		opcode = verbs.OpRDMAWriteWithImm
	}
	return c.oneSided(ctx, opcode, local, remote, offset, imm, async, id)
}

// readRemote is ReadRemote; async: its Post form.
func (c *engine) readRemote(ctx context.Context, local buffer.Buf, remote RemoteBuf, offset uint64, async bool,
	id uint64) error {
	return c.oneSided(ctx, verbs.OpRDMARead, local, remote, offset, 0, async, id)
}

func (c *engine) oneSided(ctx context.Context, opcode uint32, local buffer.Buf, remote RemoteBuf,
	offset uint64, imm uint32, async bool, id uint64) error {
	n := uint64(local.Len())
	if !local.Valid() {
		return buffer.ErrReleased
	}
	if offset+n > uint64(remote.Len) || offset+n < offset {
		return fmt.Errorf("%w: %d bytes at offset %d of a %d-byte export", ErrRemoteAccess, n, offset, remote.Len)
	}
	_, err := c.postOneSided(ctx, oneSidedOpName(opcode), verbs.SendWR{Addr: local.Addr(), Len: uint32(n),
		LKey: local.LKey(), Opcode: opcode, Imm: imm, RemoteAddr: remote.Addr + offset, RKey: remote.RKey}, local, async, id)
	return err
}

// postOneSided takes an operation slot (waiting as takeOpSlotLocked does),
// posts wr on it with a reference to local, and for a blocking call waits
// for the end; it returns an atomic's old value. An atomic (local unused)
// takes the slot's 8 bytes of c.rma.atomicRes as its local buffer. A write
// with immediate spends a credit.
func (c *engine) postOneSided(ctx context.Context, name string, wr verbs.SendWR, local buffer.Buf,
	async bool, id uint64) (uint64, error) {
	needCredit := wr.Opcode == verbs.OpRDMAWriteWithImm
	var w poller.Waiter
	defer w.End()
	c.mu.Lock()
	idx, err := c.takeOpSlotLocked(ctx, &w, async, needCredit)
	if err != nil {
		c.mu.Unlock()
		return 0, err
	}
	atomic := wr.Opcode == verbs.OpAtomicCompareSwap || wr.Opcode == verbs.OpAtomicFetchAdd
	if atomic {
		local = c.rma.atomicRes
		if err := local.Retain(); err != nil { // released with the connection while we waited for a slot
			c.giveBackOpSlotLocked(idx)
			c.mu.Unlock()
			return 0, net.ErrClosed
		}
		wr.Addr, wr.Len, wr.LKey = local.Addr()+uint64(idx)*atomicWordSize, atomicWordSize, local.LKey()
	} else {
		local.Retain()
	}
	s := &c.rma.ops[idx]
	s.async, s.atomic, s.id, s.local, s.name = async, atomic, id, local, name
	// A blocking call waits for its own completion; an asynchronous one's
	// may come with a later request's (asyncForceLocked).
	force := !async || c.asyncForceLocked(len(c.rma.free)%max(c.ep.maxOps/2, 1) == 0)
	post := c.postLocked
	if needCredit && c.trailers {
		post = c.postWriteNotifyLocked // a write, then a notify carrying the immediate (trailer.go)
	}
	if err := post(wr, wrOneSided, idx, force); err != nil {
		b := c.giveBackOpSlotLocked(idx)
		c.mu.Unlock()
		b.Release()
		return 0, err
	}
	if needCredit {
		c.stream.credits--
	}
	if async {
		c.rma.asyncOut++
	}
	c.mu.Unlock()
	if async {
		return 0, nil
	}
	w.End() // the wait for a slot is over; the wait for the completion starts afresh
	old, err := c.awaitOp(ctx, &w, s)
	if err != nil {
		return 0, err
	}
	return old, nil
}

// takeOpSlotLocked waits (driving the CQ, bounded by ctx, the write
// deadline for blocking calls, and Close) for a free operation slot, and a
// credit to spare when needCredit, and takes the slot. Called with c.mu
// held; returns with it held.
func (c *engine) takeOpSlotLocked(ctx context.Context, w *poller.Waiter, async, needCredit bool) (int, error) {
	if c.rma.ops == nil { // the first one-sided operation: most connections never make one
		c.rma.ops = make([]opSlot, c.ep.maxOps)
		c.rma.free = make([]int, 0, c.ep.maxOps)
		for i := len(c.rma.ops) - 1; i >= 0; i-- {
			c.rma.free = append(c.rma.free, i) // each slot's done channel is made at its first use
		}
	}
	for {
		if err := c.writeErrLocked(); err != nil && !(async && err == os.ErrDeadlineExceeded) {
			return 0, err
		}
		if async && !c.asyncRoomLocked() {
			return 0, ErrCompletionsFull
		}
		// A write with immediate on a connection with trailers takes two
		// send-queue entries: the write and its notify.
		pair := 0
		if needCredit && c.trailers {
			pair = 1
		}
		if len(c.rma.free) > 0 && (!needCredit || c.stream.credits >= 2) && c.sqUsedLocked()+pair < c.ep.sqDepth-ctlReserve/2 {
			break
		}
		if err := c.waitLocked(ctx, &c.wrDeadline, w); err != nil {
			return 0, err
		}
	}
	idx := c.rma.free[len(c.rma.free)-1]
	c.rma.free = c.rma.free[:len(c.rma.free)-1]
	if c.rma.ops[idx].done == nil {
		c.rma.ops[idx].done = make(chan opResult, 1)
	} else {
		select {
		case <-c.rma.ops[idx].done: // a result nobody waited for (the waiter's ctx ended)
		default:
		}
	}
	return idx, nil
}

// giveBackOpSlotLocked undoes a slot whose post failed: the slot is free
// again; the caller releases the returned reference after c.mu.
func (c *engine) giveBackOpSlotLocked(idx int) buffer.Buf {
	s := &c.rma.ops[idx]
	b := s.local
	s.local = buffer.Buf{}
	c.rma.free = append(c.rma.free, idx)
	return b
}

// awaitOp waits for the completion of the blocking operation in slot s,
// driving the CQ meanwhile, and returns an atomic's old value. If ctx ends
// first the operation still completes; its slot is reclaimed then.
func (c *engine) awaitOp(ctx context.Context, w *poller.Waiter, s *opSlot) (uint64, error) {
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	for {
		select {
		case r := <-s.done:
			return r.value, r.err
		default:
		}
		if done != nil && ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if c.isClosed() {
			return 0, net.ErrClosed
		}
		if !c.spinWait(w, &c.wrSpin) {
			break
		}
	}
	select {
	case r := <-s.done:
		return r.value, r.err
	case <-done:
		return 0, ctx.Err()
	case <-c.closing:
		return 0, net.ErrClosed
	}
}

// oneSidedDoneLocked finishes operation idx. Called by the poller under c.mu;
// the local buffer's reference is returned through *release.
func (c *engine) oneSidedDoneLocked(idx int, wc *verbs.WC, release *[]buffer.Buf) {
	s := &c.rma.ops[idx]
	var err error
	if wc.Status != verbs.WCSuccess {
		err = wc.ErrOp(s.name)
		switch wc.Status {
		case verbs.WCRemAccessErr, verbs.WCRemInvReqErr:
			err = fmt.Errorf("%w: %w", ErrRemoteAccess, err)
		case verbs.WCWRFlushErr:
			err = fmt.Errorf("connection failed before the operation completed: %w", err)
		}
		// An RC transport error takes the QP to ERR: the connection fails.
		c.failLocked(err)
	}
	var value uint64
	if s.atomic && err == nil {
		value = atomicResult(s.local.Bytes(), idx)
	}
	*release = append(*release, s.local)
	s.local = buffer.Buf{}
	if s.async {
		c.rma.asyncOut--
		c.rma.oq.Push(OpCompletion{ID: s.id, Err: err, Value: value})
	} else {
		s.done <- opResult{value: value, err: err}
	}
	c.rma.free = append(c.rma.free, idx)
}

// deliverNotificationLocked lends receive buffer idx as the notification
// of a write of n bytes with immediate value imm.
func (c *engine) deliverNotificationLocked(idx int, imm, n uint32) {
	c.msgs.lent[idx] = true
	c.msgs.nq.Push(Notification{Imm: imm, Len: int(n), buf: c.ep.recv[idx]})
}

// releaseOpsLocked ends the one-sided operations and atomics in flight at
// release with net.ErrClosed (on Completions() or to the blocked caller)
// and adds their local buffers, and the atomics' result buffer, to rel,
// released once the QP is destroyed (the NIC may still use them).
func (c *engine) releaseOpsLocked(rel []buffer.Buf) []buffer.Buf {
	for i := range c.rma.ops {
		s := &c.rma.ops[i]
		if s.local.Valid() {
			if s.async {
				c.rma.asyncOut--
				c.rma.oq.Push(OpCompletion{ID: s.id, Err: net.ErrClosed})
			} else {
				select {
				case s.done <- opResult{err: net.ErrClosed}:
				default:
				}
			}
			rel = append(rel, s.local)
			s.local = buffer.Buf{}
		}
	}
	if c.rma.atomicRes.Valid() { // operations in flight hold references of their own
		rel = append(rel, c.rma.atomicRes)
		c.rma.atomicRes = buffer.Buf{}
	}
	return rel
}
