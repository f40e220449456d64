package rdma

import (
	"context"
	"sync"
)

// unreadBudget bounds the bytes of received large messages that all the
// connections on one device hold in pool buffers until the application
// releases them (Config.MaxUnreadBytes bounds each connection's share).
// What a peer announces is read only once it is charged here, so the
// peers of one device, however many connections they open, can make it
// hold at most max bytes of their messages: the rest of the pool stays
// for rings, handshakes and the application's Alloc.
type unreadBudget struct {
	mu      sync.Mutex
	max     int64         // 0: unbounded
	held    int64         // charged and not yet released
	changed chan struct{} // closed and replaced at each release, for waiters
}

// tryCharge charges n bytes if they fit, or if nothing is held (so a
// message larger than the budget is still read, alone).
func (u *unreadBudget) tryCharge(n int64) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.max > 0 && u.held > 0 && u.held+n > u.max {
		return false
	}
	u.held += n
	return true
}

// charge waits until n bytes fit, then charges them; it fails only when
// ctx ends.
func (u *unreadBudget) charge(ctx context.Context, n int64) error {
	for {
		u.mu.Lock()
		if u.max <= 0 || u.held == 0 || u.held+n <= u.max {
			u.held += n
			u.mu.Unlock()
			return nil
		}
		if u.changed == nil {
			u.changed = make(chan struct{})
		}
		ch := u.changed
		u.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// release returns n charged bytes and wakes the waiters.
func (u *unreadBudget) release(n int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.held -= n
	if u.changed != nil {
		close(u.changed)
		u.changed = nil
	}
}

// inUse reports the bytes charged.
func (u *unreadBudget) inUse() int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.held
}
