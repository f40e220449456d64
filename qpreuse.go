//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/testhooks"
)

// A closed connection's QP goes back to its device's QP pool
// (internal/device's qppool.go has the pool's rules): this side parks it
// (reset, handed off), waits for its id's TIMEWAIT_EXIT on the process's
// timewait channel, then puts it in the pool; a new connection takes one
// of its shape with the poller whose CQ it completes into.

// qpTimewaitMax bounds the wait for a closed connection's TIMEWAIT_EXIT;
// a QP whose connection did not report it by then is destroyed (an
// atomic: the tests shorten it).
var qpTimewaitMax atomic.Int64

func init() {
	qpTimewaitMax.Store(int64(10 * time.Second))
	testhooks.RegisterSettle(settleDevices) // the tests' resource checks, in any package
}

// takePooledQP gives e a QP from its device's pool, attached to the QP's
// poller, if one of the shape is there.
func (e *endpoint) takePooledQP(s device.QPShape, h poller.Handler) bool {
	for {
		q, ok := e.dev.QPs.Get(s)
		if !ok {
			return false
		}
		tok, err := e.dev.Pollers.AttachTo(q.Poller, h, e.entries)
		if err != nil {
			// Its poller failed or its CQ is full: this QP is of no use now.
			q.QP.Close()
			e.dev.QPs.Count(func(st *device.QPPoolStats) { st.Destroyed++ })
			continue
		}
		e.qp, e.poller, e.token, e.shape = q.QP, q.Poller, uint64(tok)<<poller.TokenShift, s
		return true
	}
}

// parkQP is the first half of giving an established connection's QP back:
// reset it and take it from the connection (Handoff). It reports whether
// the QP was parked; if not, the caller destroys it. A QP on which a
// memory window failed to deallocate is never parked. The device
// reference passes to the parked QP (retire drops it).
func (e *endpoint) parkQP() bool {
	if !e.established || e.dev == nil || e.dev.QPMax.Load() <= 0 || e.noReuse.Load() || e.dev.Caps.CMConnectsQP {
		return false
	}
	if err := e.qp.Reset(e.lim); err != nil {
		return false
	}
	q, err := e.qp.Handoff()
	if err != nil {
		return false
	}
	e.parked = device.PooledQP{QP: q, Poller: e.poller}
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
		d.QPs.Count(func(st *device.QPPoolStats) { st.Destroyed++ })
	}
	if !reuse || !d.QPs.Put(e.shape, q, int(d.QPMax.Load())) {
		if err := q.QP.Close(); err != nil {
			device.NoteTeardownErr(err)
		}
	}
	d.Release()
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
	device.FlushLingering()
	for device.TearingDown() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}
