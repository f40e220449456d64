//go:build linux && cgo

package device

import (
	"errors"
	"sync"

	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/verbs"
)

// The QP pool: creating a QP is one of the costly steps of a connection's
// set-up (a kernel call that allocates and maps the work queues), so the
// QPs of closed connections are kept, reset, for new connections on the
// same device. The rules:
//
//   - A QP goes back only from a connection that was established and
//     closed: it is moved to RESET (from RTS or ERR alike: a QP that reached
//     ERR is reusable only through a full reset) and the device must confirm
//     RESET; else it is destroyed.
//   - It becomes available only after its old connection's rdma_cm id
//     reported TIMEWAIT_EXIT: until then packets of the old connection may
//     still arrive for its QP number. The id is kept until then (for a
//     bounded time; past that the QP is destroyed instead), on the
//     process's timewait channel: the connection's own channel closes at
//     Close.
//   - A QP on which a memory window failed to deallocate is destroyed,
//     never pooled: the window might still reach memory through it.
//   - It keeps its CQ (a poller's shared CQ): a new connection takes it only
//     together with that poller. Stale completions of the old connection in
//     that CQ carry the old connection's token and are dropped.
//   - The new owner gets a fresh *verbs.QP (Handoff): the old connection's
//     endpoint can no longer reach the QP.
//   - At most Config.QPPool QPs per device (Device.QPMax, from its first
//     connection's Config); the pool is drained (every QP destroyed) when
//     the device is torn down, which happens Config.DeviceLinger after its
//     last connection closed, so sequential dials find it.

// The pool below is the storage; parking a closed connection's QP, its
// timewait and taking a QP for a new connection are the connection's side
// (the root package's endpoint).

// QPShape is what a pooled QP must match: its queue sizes and the inline
// room asked for at creation.
type QPShape struct{ SendWR, RecvWR, Inline int }

// PooledQP is a QP in RESET with the poller whose CQ it completes into.
type PooledQP struct {
	QP     *verbs.QP
	Poller *poller.Poller
}

// QPPool is a device's pool of QPs in RESET, past their TIMEWAIT_EXIT.
type QPPool struct {
	state func(*verbs.QP) verbs.QPState // (*verbs.QP).State; the tests' fake

	mu     sync.Mutex // guards the fields below
	free   map[QPShape][]PooledQP
	n      int
	closed bool
	stats  QPPoolStats
}

// QPPoolStats counts what the pool did (for tests and diagnostics).
type QPPoolStats struct {
	Created   int // QPs created because the pool had none of the shape
	Reused    int // QPs taken from the pool
	Returned  int // QPs put in the pool
	Destroyed int // QPs destroyed instead of pooled (pool full or closed, no TIMEWAIT_EXIT, reset failed)
	Drained   int // QPs destroyed when the pool closed
}

// Get takes a QP of shape s, with the poller whose CQ it completes into.
func (pl *QPPool) Get(s QPShape) (PooledQP, bool) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	l := pl.free[s]
	if len(l) == 0 {
		return PooledQP{}, false
	}
	q := l[len(l)-1]
	pl.free[s] = l[:len(l)-1]
	pl.n--
	pl.stats.Reused++
	return q, true
}

// Put keeps q (in RESET, handed off) if the pool is open and has room
// (fewer than max QPs); else the caller destroys it.
func (pl *QPPool) Put(s QPShape, q PooledQP, max int) bool {
	state := (*verbs.QP).State
	if pl.state != nil {
		state = pl.state
	}
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.closed || pl.n >= max || state(q.QP) != verbs.StateReset {
		pl.stats.Destroyed++
		return false
	}
	if pl.free == nil {
		pl.free = make(map[QPShape][]PooledQP)
	}
	pl.free[s] = append(pl.free[s], q)
	pl.n++
	pl.stats.Returned++
	return true
}

// Count lets f update the pool's counters (a QP created, or destroyed by
// its would-be owner).
func (pl *QPPool) Count(f func(*QPPoolStats)) {
	pl.mu.Lock()
	f(&pl.stats)
	pl.mu.Unlock()
}

// Stats returns the pool's counters and how many QPs it holds.
func (pl *QPPool) Stats() (QPPoolStats, int) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.stats, pl.n
}

// Len is how many QPs the pool holds.
func (pl *QPPool) Len() int {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.n
}

// Closed reports whether the pool was drained.
func (pl *QPPool) Closed() bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.closed
}

// Each calls f for every pooled QP, with the pool locked (tests).
func (pl *QPPool) Each(f func(PooledQP)) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for _, l := range pl.free {
		for _, q := range l {
			f(q)
		}
	}
}

// Empty destroys the pooled QPs and keeps the pool open (tests).
func (pl *QPPool) Empty() error {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.emptyLocked(false)
}

// Drain closes the pool and destroys its QPs (before the device's CQs and
// PD go).
func (pl *QPPool) Drain() error {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.closed = true
	return pl.emptyLocked(true)
}

func (pl *QPPool) emptyLocked(drained bool) error {
	var errs []error
	for s, l := range pl.free {
		for _, q := range l {
			errs = append(errs, q.QP.Close())
			if drained {
				pl.stats.Drained++
			}
		}
		delete(pl.free, s)
	}
	pl.n = 0
	return errors.Join(errs...)
}
