//go:build linux && cgo

package rdma

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
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
// Connections on one device share a protection domain, so an rkey is valid
// on all of them: treat descriptors as secrets shared with one peer.

// asyncRoomLocked reports whether one more asynchronous operation's
// completion is sure to fit Completions(). Only the poller sends on it
// (under c.mu, held here) and the user only takes from it, so the check
// stays true until the operation is posted.
func (c *Conn) asyncRoomLocked() bool { return c.asyncOut+len(c.opDone) < cap(c.opDone) }

// Access is what the peer may do to an exported buffer.
type Access int

const (
	RemoteWrite Access = 1 << iota
	RemoteRead
)

// RemoteBuf describes a buffer the peer exported: pass it in a message.
type RemoteBuf = wire.Region

// ParseRemoteBuf decodes a descriptor received from the peer.
func ParseRemoteBuf(b []byte) (RemoteBuf, error) { return wire.ParseRegion(b) }

// Export is a buffer the peer may access.
type Export struct {
	c      *Conn
	buf    buffer.Buf
	mr     *verbs.MR
	remote RemoteBuf
	once   sync.Once
	err    error
}

// Export makes b (a Buf from Alloc) accessible to the peer with the given
// rights until the Export is closed or the connection ends. It registers b
// once (the pool's registration is local-only); the Export holds a
// reference to b.
func (c *Conn) Export(b buffer.Buf, access Access) (*Export, error) {
	if access&^(RemoteWrite|RemoteRead) != 0 || access == 0 {
		return nil, c.opError("export", fmt.Errorf("invalid access %d", access))
	}
	if err := b.Retain(); err != nil {
		return nil, c.opError("export", err)
	}
	flags := verbs.AccessLocalWrite
	if access&RemoteWrite != 0 {
		flags |= verbs.AccessRemoteWrite
	}
	if access&RemoteRead != 0 {
		flags |= verbs.AccessRemoteRead
	}
	mr, err := c.dev.pd.RegMR(b.Bytes(), flags)
	if err != nil {
		b.Release()
		return nil, c.opError("export", err)
	}
	e := &Export{c: c, buf: b, mr: mr, remote: RemoteBuf{Addr: mr.Addr(), Len: uint32(b.Len()), RKey: mr.RKey}}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		e.close()
		return nil, c.opError("export", net.ErrClosed)
	}
	c.exports[e] = struct{}{}
	c.mu.Unlock()
	return e, nil
}

// Remote is the descriptor to hand to the peer.
func (e *Export) Remote() RemoteBuf { return e.remote }

// Close ends remote access and releases the Export's reference to the Buf.
func (e *Export) Close() error {
	e.c.mu.Lock()
	delete(e.c.exports, e)
	e.c.mu.Unlock()
	return e.close()
}

func (e *Export) close() error {
	e.once.Do(func() {
		e.err = e.mr.Close()
		e.buf.Release()
	})
	return e.err
}

// oneSidedState is the one-sided operations' state, guarded by Conn.mu.
type oneSidedState struct {
	ops      []opSlot
	opFree   []int
	opDone   chan OpCompletion
	asyncOut int // asynchronous operations posted whose completion is not yet on opDone
	exports  map[*Export]struct{}
}

// opSlot tracks one one-sided operation in flight.
type opSlot struct {
	done  chan error // for the blocking forms; capacity 1
	async bool
	id    uint64
	local buffer.Buf
}

// OpCompletion reports the end of an asynchronous operation.
type OpCompletion struct {
	ID  uint64 // as given to PostSend, PostWriteRemote or PostReadRemote
	Err error
}

// Notification is a WriteRemoteImm the peer completed into our memory.
// Release it when handled: it holds a receive buffer (and the peer's credit).
type Notification struct {
	Imm uint32 // the peer's immediate value
	Len int    // bytes the peer wrote
	buf buffer.Buf
}

// Release returns the notification's receive buffer to the connection.
func (n Notification) Release() error { return n.buf.Release() }

func (c *Conn) initOneSided() {
	c.ops = make([]opSlot, c.ep.maxOps)
	c.opFree = make([]int, 0, c.ep.maxOps)
	for i := len(c.ops) - 1; i >= 0; i-- {
		c.ops[i].done = make(chan error, 1)
		c.opFree = append(c.opFree, i)
	}
	// Room for every operation and asynchronous send that can be in flight,
	// so the poller never blocks on it.
	c.opDone = make(chan OpCompletion, c.ep.maxOps+c.ep.maxMsgs)
	c.exports = make(map[*Export]struct{})
}

// Notifications delivers the peer's WriteRemoteImm notifications.
func (c *Conn) Notifications() <-chan Notification {
	c.channelUser()
	return c.notes
}

// RecvNotification waits for the next notification (bounded by ctx and the
// read deadline), polling for it meanwhile as Recv does: lower latency than
// a receive from Notifications(), which waits for the poller's thread. At
// the end it returns io.EOF, or the connection's error.
func (c *Conn) RecvNotification(ctx context.Context) (Notification, error) {
	return receive(c, ctx, c.notes, "recv notification")
}

// Completions delivers the ends of PostSend, PostWriteRemote and
// PostReadRemote operations; it has room for every one that can be in flight.
func (c *Conn) Completions() <-chan OpCompletion {
	c.channelUser()
	return c.opDone
}

// WriteRemote writes local's bytes into the peer's exported buffer at
// offset, and returns when the NIC reports them placed.
func (c *Conn) WriteRemote(ctx context.Context, local buffer.Buf, remote RemoteBuf, offset uint64) error {
	return c.oneSided(ctx, "write remote", verbs.OpRDMAWrite, local, remote, offset, 0, false, 0)
}

// WriteRemoteImm is WriteRemote that also delivers imm on the peer's
// Notifications() (it uses one of the peer's receive buffers, like a message).
func (c *Conn) WriteRemoteImm(ctx context.Context, local buffer.Buf, remote RemoteBuf, offset uint64, imm uint32) error {
	return c.oneSided(ctx, "write remote", verbs.OpRDMAWriteWithImm, local, remote, offset, imm, false, 0)
}

// ReadRemote fills local from the peer's exported buffer at offset.
func (c *Conn) ReadRemote(ctx context.Context, local buffer.Buf, remote RemoteBuf, offset uint64) error {
	return c.oneSided(ctx, "read remote", verbs.OpRDMARead, local, remote, offset, 0, false, 0)
}

// PostWriteRemote starts WriteRemote and returns; its end arrives on
// Completions() with id. local must stay unreleased until then (the
// connection holds a reference meanwhile).
func (c *Conn) PostWriteRemote(local buffer.Buf, remote RemoteBuf, offset, id uint64) error {
	return c.oneSided(context.Background(), "write remote", verbs.OpRDMAWrite, local, remote, offset, 0, true, id)
}

// PostReadRemote starts ReadRemote; its end arrives on Completions() with id.
func (c *Conn) PostReadRemote(local buffer.Buf, remote RemoteBuf, offset, id uint64) error {
	return c.oneSided(context.Background(), "read remote", verbs.OpRDMARead, local, remote, offset, 0, true, id)
}

func (c *Conn) oneSided(ctx context.Context, op string, opcode uint32, local buffer.Buf, remote RemoteBuf,
	offset uint64, imm uint32, async bool, id uint64) error {
	n := uint64(local.Len())
	if !local.Valid() {
		return c.opError(op, buffer.ErrReleased)
	}
	if offset+n > uint64(remote.Len) || offset+n < offset {
		return c.opError(op, fmt.Errorf("%w: %d bytes at offset %d of a %d-byte export", ErrRemoteAccess, n, offset, remote.Len))
	}
	c.mu.Lock()
	needCredit := opcode == verbs.OpRDMAWriteWithImm
	var w poller.Waiter
	defer w.End()
	for {
		if err := c.writeErrLocked(); err != nil && !(async && err == os.ErrDeadlineExceeded) {
			c.mu.Unlock()
			return c.opError(op, err)
		}
		if async && !c.asyncRoomLocked() {
			c.mu.Unlock()
			return c.opError(op, ErrCompletionsFull)
		}
		if len(c.opFree) > 0 && (!needCredit || c.credits >= 2) {
			break
		}
		if err := c.waitLocked(ctx, &c.wrDeadline, &w); err != nil {
			c.mu.Unlock()
			return c.opError(op, err)
		}
	}
	idx := c.opFree[len(c.opFree)-1]
	c.opFree = c.opFree[:len(c.opFree)-1]
	s := &c.ops[idx]
	select {
	case <-s.done: // a result nobody waited for (the waiter's ctx ended)
	default:
	}
	local.Retain()
	s.async, s.id, s.local = async, id, local
	if err := c.postLocked(verbs.SendWR{Addr: local.Addr(), Len: uint32(n), LKey: local.LKey(),
		Opcode: opcode, Imm: imm, RemoteAddr: remote.Addr + offset, RKey: remote.RKey}, wrOneSided, idx, true); err != nil {
		s.local = buffer.Buf{}
		c.opFree = append(c.opFree, idx)
		c.mu.Unlock()
		local.Release()
		return c.opError(op, err)
	}
	if needCredit {
		c.credits--
	}
	if async {
		c.asyncOut++
	}
	c.mu.Unlock()
	if async {
		return nil
	}
	w.End() // the wait for a slot is over; the wait for the completion starts afresh
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	for {
		select {
		case err := <-s.done:
			if err != nil {
				return c.opError(op, err)
			}
			return nil
		default:
		}
		if done != nil && ctx.Err() != nil {
			return c.opError(op, ctx.Err()) // the operation itself still completes
		}
		if c.isClosed() {
			return c.opError(op, net.ErrClosed)
		}
		if !c.spinWait(&w, &c.wrSpin) {
			break
		}
	}
	select {
	case err := <-s.done:
		if err != nil {
			return c.opError(op, err)
		}
		return nil
	case <-done:
		return c.opError(op, ctx.Err()) // the operation itself still completes
	case <-c.closing:
		return c.opError(op, net.ErrClosed)
	}
}

// oneSidedDoneLocked finishes operation idx. Called by the poller under c.mu;
// the local buffer's reference is returned through *release.
func (c *Conn) oneSidedDoneLocked(idx int, wc *verbs.WC, release *[]buffer.Buf) {
	s := &c.ops[idx]
	var err error
	if wc.Status != verbs.WCSuccess {
		err = wc.Err()
		switch wc.Status {
		case verbs.WCRemAccessErr, verbs.WCRemInvReqErr:
			err = fmt.Errorf("%w: %v", ErrRemoteAccess, err)
		case verbs.WCWRFlushErr:
			err = fmt.Errorf("connection failed before the operation ran: %w", err)
		}
		// An RC transport error takes the QP to ERR: the connection fails.
		c.failLocked(err)
	}
	*release = append(*release, s.local)
	s.local = buffer.Buf{}
	if s.async {
		c.asyncOut--
		c.opDone <- OpCompletion{ID: s.id, Err: err}
	} else {
		s.done <- err
	}
	c.opFree = append(c.opFree, idx)
}

// deliverNotificationLocked lends receive buffer idx as a notification.
func (c *Conn) deliverNotificationLocked(idx int, wc *verbs.WC) {
	c.lent[idx] = true
	c.notes <- Notification{Imm: wc.Imm, Len: int(wc.ByteLen), buf: c.ep.recv[idx]}
}
