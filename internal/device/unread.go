package device

import (
	"sync"
)

// Unread bounds the bytes of received large messages that all the
// connections on one device hold in pool buffers until the application
// releases them (Config.MaxUnreadBytes bounds each connection's share).
// What a peer announces is read only once it is charged here, so the
// peers of one device, however many connections they open, can make it
// hold at most max bytes of their messages: the rest of the pool stays
// for rings, handshakes and the application's Alloc.
//
// One exception keeps every connection able to make progress: a
// connection that holds no large message may always take one, past max.
// Without it, an application reading its connections one after another
// would wait forever on a connection whose next message finds the budget
// taken by the unread messages of connections it will read later. So the
// device holds at most max, plus one message (MaxMessageSize) per
// connection that would otherwise hold none; the pool's own limit
// (PoolMaxBytes) bounds everything.
type Unread struct {
	mu      sync.Mutex
	max     int64         // 0: unbounded
	held    int64         // charged and not yet released
	changed chan struct{} // closed and replaced at each release, for waiters
}

// TryCharge charges n bytes if they fit, if nothing is held (so a
// message larger than the budget is still read, alone), or if alone (the
// charging connection holds no large message). Otherwise it returns a
// channel closed at the next release, to wait on before trying again.
func (u *Unread) TryCharge(n int64, alone bool) (ok bool, changed <-chan struct{}) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if alone || u.max <= 0 || u.held == 0 || u.held+n <= u.max {
		u.held += n
		return true, nil
	}
	if u.changed == nil {
		u.changed = make(chan struct{})
	}
	return false, u.changed
}

// Release returns n charged bytes and wakes the waiters.
func (u *Unread) Release(n int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.held -= n
	if u.changed != nil {
		close(u.changed)
		u.changed = nil
	}
}

// InUse reports the bytes charged.
func (u *Unread) InUse() int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.held
}

// Max is the bound (0: unbounded).
func (u *Unread) Max() int64 { return u.max }
