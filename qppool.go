//go:build linux && cgo

package rdma

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/settle"
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
//     still arrive for its QP number. The id is kept until then (bounded by
//     qpTimewaitMax; past that the QP is destroyed instead).
//   - It keeps its CQ (a poller's shared CQ): a new connection takes it only
//     together with that poller. Stale completions of the old connection in
//     that CQ carry the old connection's token and are dropped.
//   - The new owner gets a fresh *verbs.QP (Handoff): the old connection's
//     endpoint can no longer reach the QP.
//   - At most Config.QPPool QPs per device (of its first connection's
//     Config); the pool is drained (every QP destroyed) when the device is
//     torn down, which happens Config.DeviceLinger after its last
//     connection closed, so sequential dials find it.

// qpTimewaitMax bounds the wait for a closed connection's TIMEWAIT_EXIT;
// a QP whose connection did not report it by then is destroyed (an
// atomic: the tests shorten it).
var qpTimewaitMax atomic.Int64

func init() {
	qpTimewaitMax.Store(int64(10 * time.Second))
	settle.Register(settleDevices) // the tests' resource checks, in any package
}

// qpShape is what a pooled QP must match: its queue sizes and the inline
// room asked for at creation.
type qpShape struct{ sendWR, recvWR, inline int }

type pooledQP struct {
	qp *verbs.QP
	p  *poller.Poller
}

// qpPool is a device's pool of QPs in RESET, past their TIMEWAIT_EXIT.
type qpPool struct {
	mu     sync.Mutex
	free   map[qpShape][]pooledQP
	n      int
	closed bool
	stats  qpPoolStats
}

// qpPoolStats counts what the pool did (for tests and diagnostics).
type qpPoolStats struct {
	Created   int // QPs created because the pool had none of the shape
	Reused    int // QPs taken from the pool
	Returned  int // QPs put in the pool
	Destroyed int // QPs destroyed instead of pooled (pool full or closed, no TIMEWAIT_EXIT, reset failed)
	Drained   int // QPs destroyed when the pool closed
}

// get takes a QP of shape s, with the poller whose CQ it completes into.
func (pl *qpPool) get(s qpShape) (pooledQP, bool) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	l := pl.free[s]
	if len(l) == 0 {
		return pooledQP{}, false
	}
	q := l[len(l)-1]
	pl.free[s] = l[:len(l)-1]
	pl.n--
	pl.stats.Reused++
	return q, true
}

// put keeps q (in RESET, handed off) if the pool is open and has room
// (fewer than max QPs); else the caller destroys it.
func (pl *qpPool) put(s qpShape, q pooledQP, max int) bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.closed || pl.n >= max || q.qp.State() != verbs.StateReset {
		pl.stats.Destroyed++
		return false
	}
	if pl.free == nil {
		pl.free = make(map[qpShape][]pooledQP)
	}
	pl.free[s] = append(pl.free[s], q)
	pl.n++
	pl.stats.Returned++
	return true
}

func (pl *qpPool) count(f func(*qpPoolStats)) {
	pl.mu.Lock()
	f(&pl.stats)
	pl.mu.Unlock()
}

// len is how many QPs the pool holds.
func (pl *qpPool) len() int {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.n
}

// drain closes the pool and destroys its QPs (before the device's CQs and
// PD go).
func (pl *qpPool) drain() error {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.closed = true
	var errs []error
	for s, l := range pl.free {
		for _, q := range l {
			errs = append(errs, q.qp.Close())
			pl.stats.Drained++
		}
		delete(pl.free, s)
	}
	pl.n = 0
	return errors.Join(errs...)
}

// takePooledQP gives e a QP from its device's pool, attached to the QP's
// poller, if one of the shape is there.
func (e *endpoint) takePooledQP(s qpShape, h poller.Handler) bool {
	for {
		q, ok := e.dev.qps.get(s)
		if !ok {
			return false
		}
		tok, err := e.dev.pollers.AttachTo(q.p, h, e.entries)
		if err != nil {
			// Its poller failed or its CQ is full: this QP is of no use now.
			q.qp.Close()
			e.dev.qps.count(func(st *qpPoolStats) { st.Destroyed++ })
			continue
		}
		e.qp, e.poller, e.token, e.shape = q.qp, q.p, uint64(tok)<<poller.TokenShift, s
		return true
	}
}

// parkQP is the first half of giving an established connection's QP back:
// reset it and take it from the connection (Handoff). It reports whether
// the QP was parked; if not, the caller destroys it. The device reference
// passes to the parked QP (retire drops it).
func (e *endpoint) parkQP() bool {
	if !e.established || e.dev == nil || e.dev.qpMax.Load() <= 0 {
		return false
	}
	if err := e.qp.Reset(e.lim); err != nil {
		return false
	}
	q, err := e.qp.Handoff()
	if err != nil {
		return false
	}
	e.parked = pooledQP{qp: q, p: e.poller}
	e.parkDev = e.dev
	retiring.Add(1)
	return true
}

// timewaitExit records the connection's RDMA_CM_EVENT_TIMEWAIT_EXIT (from
// the Conn's event loop).
func (e *endpoint) timewaitExit() {
	e.twOnce.Do(func() { close(e.twExit) })
}

// retire is the second half, after the connection released everything
// else: it waits for TIMEWAIT_EXIT on the connection's id (at most
// qpTimewaitMax), destroys the id and its channel, waits for the event
// loop to end, then pools the QP (or destroys it) and drops the device
// reference the parked QP held. It runs on its own goroutine: Close does
// not wait for the timewait.
func (e *endpoint) retire(id *rdmacm.ID, ch *rdmacm.Channel, eventsDone <-chan struct{}) {
	defer retiring.Add(-1)
	t := time.NewTimer(time.Duration(qpTimewaitMax.Load()))
	defer t.Stop()
	exited := false
	select {
	case <-e.twExit:
		exited = true
	case <-t.C:
	}
	id.Destroy()
	ch.Close()
	<-eventsDone
	d, q := e.parkDev, e.parked
	if !exited {
		d.qps.count(func(st *qpPoolStats) { st.Destroyed++ })
	}
	if !exited || !d.qps.put(e.shape, q, int(d.qpMax.Load())) {
		if err := q.qp.Close(); err != nil {
			teardownErr.Store(&err)
		}
	}
	d.release()
}

// retiring counts parked QPs not yet pooled or destroyed.
var retiring atomic.Int64

// settleDevices waits (up to limit) until no QP is parked, tears down the
// devices that only linger and waits for their teardown: afterwards the
// process holds RDMA objects only for live connections (and lent
// buffers). The tests' leak checks run it before counting objects, since
// pooled QPs and lingering devices are owned, not leaked.
func settleDevices(limit time.Duration) {
	deadline := time.Now().Add(limit)
	for retiring.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	flushLingeringDevices()
	for tearingDown.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}
