//go:build linux && cgo

package rdma

// Growing the rings (the decisions are window.go's): the rings grow from
// buffers the pool has free (buffer.Pool.TryGet), since registering a new
// arena is slow (the kernel pins and maps each of its pages) and growth
// happens with c.mu held, on the path of the connection's completions and
// of the poller's other connections. When the pool has none, a goroutine
// registers an arena (growPoolLocked, on the device's low-priority worker:
// internal/device's lowprio.go) and the growth is tried again.

import (
	"errors"
	"time"

	"github.com/verbline/rdma/buffer"
)

// addRecvsLocked takes n free buffers from the pool and posts them as
// receives; it returns how many it posted: n, or 0 if the pool has fewer
// free (it grows meanwhile, or at its limit the rings stay as they are).
func (c *engine) addRecvsLocked(n int) int {
	first := len(c.ep.recv)
	if !c.takeFreeLocked(&c.ep.recv, n) {
		return 0
	}
	wrs := c.recvWRs[len(c.recvWRs):] // scratch beyond what is being reposted (normally empty)
	for idx := first; idx < len(c.ep.recv); idx++ {
		c.ep.recv[idx].SetRecyclerRef(&c.msgs.slotRefs[idx])
		wrs = append(wrs, c.ep.recvWR(idx))
	}
	if len(wrs) == 0 {
		return 0
	}
	if err := c.ep.qp.PostRecv(wrs); err != nil {
		c.failLocked(err) // the buffers are in the ring: freed with it
		return 0
	}
	c.recvPosted += len(wrs)
	return len(wrs)
}

// growSendRingLocked doubles the send ring (up to Config.SendBuffers).
// Called with c.mu and writeMu held, by a writer with credits and no free
// send buffer.
func (c *engine) growSendRingLocked() {
	first := len(c.ep.send)
	if !c.takeFreeLocked(&c.ep.send, min(first, c.ep.maxSend-first)) {
		return
	}
	for idx := first; idx < len(c.ep.send); idx++ {
		c.stream.sendFree = append(c.stream.sendFree, idx)
	}
}

// takeFreeLocked appends n free buffers of the rings' size to *ring, all
// or none (the rings keep their doubling sizes): if the pool has fewer
// free, those taken go back and growPoolLocked registers an arena.
func (c *engine) takeFreeLocked(ring *[]buffer.Buf, n int) bool {
	if c.win.poolGrowing || c.poolFullLocked() {
		return false // tried again once the pool has grown, or after poolRetry
	}
	first := len(*ring)
	for range n {
		b, err := c.dev.Pool.TryGet(c.ep.bufSize)
		if err != nil {
			for _, b := range (*ring)[first:] {
				b.Free()
			}
			clear((*ring)[first:])
			*ring = (*ring)[:first]
			c.growPoolLocked(err, n)
			return false
		}
		*ring = append(*ring, b)
	}
	return true
}

// growPoolLocked starts a goroutine that registers arenas of the rings'
// buffer size when a ring could not grow by need buffers because the pool
// had fewer free (err is TryGet's), then tries the receive window's growth
// again and wakes the writers, which retry theirs.
// Called with c.mu held, by takeFreeLocked, which makes no attempt while
// one is under way.
//
// At the pool's limit (Config.PoolMaxBytes) the rings stay as they are, and
// for poolRetry no new attempt is made: each costs the pool a search for
// arenas to take back from other sizes.
func (c *engine) growPoolLocked(err error, need int) {
	if !errors.Is(err, buffer.ErrNoFree) || c.released {
		return
	}
	c.win.poolGrowing = true
	go func() {
		err := c.dev.RunLowPriority(func() error { return c.dev.Pool.Grow(c.ep.bufSize, need) })
		c.mu.Lock()
		defer c.mu.Unlock()
		c.win.poolGrowing = false
		// A writer or Send waiting for its ring tries again (a Send that
		// needs the rendezvous reserve's first buffer fails if the pool is
		// at its limit).
		defer c.broadcast()
		if err != nil {
			c.win.poolFullAt = time.Now()
			return
		}
		if !c.released && !c.qpDown {
			c.maybeGrowWindowLocked()
			c.maybeSendCreditsLocked()
		}
	}()
}

// poolFullLocked reports whether growPoolLocked found the pool at its
// limit less than poolRetry ago.
func (c *engine) poolFullLocked() bool {
	return !c.win.poolFullAt.IsZero() && time.Since(c.win.poolFullAt) < poolRetry
}

// ringBytes is the registered memory the connection's rings hold now.
func (c *engine) ringBytes() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := uint64(len(c.ep.recv)+len(c.ep.send)) * uint64(c.ep.bufSize)
	if c.ep.rvDesc.Valid() {
		n += uint64(len(c.ep.rvDesc.Full()))
	}
	return n
}
