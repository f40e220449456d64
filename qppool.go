//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/testhooks"
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
//     qpTimewaitMax; past that the QP is destroyed instead), on the
//     process's timewait channel: the connection's own channel closes at
//     Close.
//   - A QP on which a memory window failed to deallocate is destroyed,
//     never pooled: the window might still reach memory through it.
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
	testhooks.RegisterSettle(settleDevices) // the tests' resource checks, in any package
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
// the QP was parked; if not, the caller destroys it. A QP on which a
// memory window failed to deallocate is never parked. The device
// reference passes to the parked QP (retire drops it).
func (e *endpoint) parkQP() bool {
	if !e.established || e.dev == nil || e.dev.qpMax.Load() <= 0 || e.noReuse.Load() {
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
// the Conn's event loop, or the timewait channel's).
func (e *endpoint) timewaitExit() {
	e.twOnce.Do(func() { close(e.twExit) })
}

// timewaitLost ends the wait for TIMEWAIT_EXIT without it (the device was
// removed, or the id's events can no longer be read): the QP is destroyed.
func (e *endpoint) timewaitLost() {
	e.twLost.Store(true)
	e.timewaitExit()
}

// awaitTimewait is the second half, once the connection released
// everything else and its event loop ended: the id moves to the channel
// shared by the ids in timewait, the connection's own channel closes now
// (it holds no id any more, so it is kept for the next connection), and
// retire waits for the id's TIMEWAIT_EXIT on its own goroutine: Close
// does not wait for the timewait, and a closed connection in timewait
// holds no descriptor of its own.
func (e *endpoint) awaitTimewait(id *rdmacm.ID, ch *rdmacm.Channel) {
	if err := timewaitAdopt(id, e); err != nil {
		// No channel to wait on: the QP cannot learn its TIMEWAIT_EXIT.
		id.Destroy()
		id = nil
		e.timewaitLost()
	}
	ch.Close()
	go e.retire(id)
}

// retire waits for TIMEWAIT_EXIT on the connection's id (at most
// qpTimewaitMax), destroys the id, then pools the QP (or destroys it)
// and drops the device reference the parked QP held.
func (e *endpoint) retire(id *rdmacm.ID) {
	defer retiring.Add(-1)
	t := time.NewTimer(time.Duration(qpTimewaitMax.Load()))
	defer t.Stop()
	exited := false
	select {
	case <-e.twExit:
		exited = !e.twLost.Load()
	case <-t.C:
	}
	if id != nil {
		timewaitLeave(id)
	}
	d, q := e.parkDev, e.parked
	// A window whose dealloc failed after the QP was parked (an Export
	// closed while the connection closed) also keeps it from the pool.
	reuse := exited && !e.noReuse.Load()
	if !reuse {
		d.qps.count(func(st *qpPoolStats) { st.Destroyed++ })
	}
	if !reuse || !d.qps.put(e.shape, q, int(d.qpMax.Load())) {
		if err := q.qp.Close(); err != nil {
			teardownErr.Store(&err)
		}
	}
	d.release()
}

// The timewait channel: the ids of closed connections waiting for their
// TIMEWAIT_EXIT are migrated (rdma_migrate_id) to one process-wide event
// channel, read by one goroutine that hands each id's events to its
// endpoint. The channel is opened with the first id and closed with the
// last (Channel.Close keeps it a while for the next user, idle.go), so a
// process with no connection in timewait holds neither it nor the
// goroutine.
//
// rdma_migrate_id waits until the id's events read on its old channel are
// acknowledged, and moves those not yet read to the new one: the Conn's
// event loop (which acknowledges each event as it reads it) ends before
// the migration, so no event is lost or read twice.
var timewait struct {
	mu   sync.Mutex
	ch   *rdmacm.Channel // nil while no id waits
	done chan struct{}   // closed when ch's reader ends
	n    int             // ids adopted and not yet left
	eps  map[*rdmacm.ID]*endpoint
}

// timewaitAdopt moves id to the timewait channel, where its events reach e.
func timewaitAdopt(id *rdmacm.ID, e *endpoint) error {
	timewait.mu.Lock()
	if timewait.ch == nil {
		ch, err := rdmacm.NewChannel()
		if err != nil {
			timewait.mu.Unlock()
			return err
		}
		timewait.ch, timewait.done = ch, make(chan struct{})
		timewait.eps = make(map[*rdmacm.ID]*endpoint)
		go timewaitLoop(ch, timewait.done)
	}
	ch := timewait.ch
	timewait.n++
	timewait.eps[id] = e
	timewait.mu.Unlock()
	if err := id.Migrate(ch); err != nil {
		timewaitLeave(id)
		return err
	}
	return nil
}

// timewaitLeave destroys id (adopted by timewaitAdopt) and closes the
// timewait channel if no other id waits on it.
func timewaitLeave(id *rdmacm.ID) {
	id.Destroy()
	timewait.mu.Lock()
	delete(timewait.eps, id)
	timewait.n--
	var ch *rdmacm.Channel
	var done chan struct{}
	if timewait.n == 0 {
		ch, done = timewait.ch, timewait.done
		timewait.ch, timewait.done, timewait.eps = nil, nil, nil
	}
	timewait.mu.Unlock()
	if ch != nil {
		ch.Close()
		<-done
	}
}

// timewaitLoop reads the timewait channel until it is closed.
func timewaitLoop(ch *rdmacm.Channel, done chan struct{}) {
	defer close(done)
	for {
		ev, err := ch.Next(context.Background())
		if err != nil {
			if !errors.Is(err, rdmacm.ErrChannelClosed) {
				// The channel failed: no id on it learns its TIMEWAIT_EXIT.
				timewait.mu.Lock()
				for _, e := range timewait.eps {
					e.timewaitLost()
				}
				timewait.mu.Unlock()
			}
			return
		}
		timewait.mu.Lock()
		e := timewait.eps[ev.ID]
		timewait.mu.Unlock()
		if e == nil {
			continue
		}
		switch ev.Type {
		case rdmacm.EventDisconnected:
			// The peer's DREQ (or its answer to ours, which needs none):
			// answering it is what starts the id's timewait when both
			// sides sent a DREQ.
			ev.ID.Disconnect()
		case rdmacm.EventTimewaitExit:
			e.timewaitExit()
		case rdmacm.EventDeviceRemoval:
			e.timewaitLost()
		}
	}
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
