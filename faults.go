//go:build linux && cgo

package rdma

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/verbline/rdma/internal/errs"
	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/verbs"
)

// Faults a device reports on its own. The device's asynchronous events
// (ibv_get_async_event) are read through the netpoller, as CM events are,
// and each is turned into failures of what it concerns:
//
//   - QP fatal, request and access errors, path migration error: that
//     connection fails (its blocked calls return the error).
//   - CQ error (an overrun) and a poller that cannot poll, arm or read its
//     channel: every connection on that CQ fails, and the poller takes no
//     new ones.
//   - Port error (its netdev went down): the connections on that port fail,
//     and dials on it fail fast until port active.
//   - Device fatal: every connection on the device fails, listeners bound
//     to it fail Accept, and dials on it fail fast.
//
// Device removal comes as a CM event to each cm_id (engine.go's eventLoop,
// acceptor.go's loop). Every event is counted (ConnStats.DeviceEvents).

// faultState is a device's record of its faults and of what they affect,
// guarded by its own mutex (events arrive on the device's reader goroutine;
// connections come and go under devices.mu and their own locks).
type faultState struct {
	fmu     sync.Mutex
	conns   map[*engine]struct{} // live connections on the device
	portErr map[uint8]error      // ports that are down
	fatal   error                // the device reported a fatal error
	events  atomic.Uint64        // async events seen
	async   *verbs.AsyncReader
	asyncWG sync.WaitGroup
}

// Devices that reported a fatal error stay failed for the process (a new
// device state on the same context would fail too): dials fail fast.
// Guarded by devices.mu.
var fatalDevices = map[uintptr]error{}

// listeners bound to one device (by context key), failed with it.
var boundListeners struct {
	mu sync.Mutex
	m  map[*acceptor]uintptr
}

func registerListener(l *acceptor, key uintptr) {
	boundListeners.mu.Lock()
	defer boundListeners.mu.Unlock()
	if boundListeners.m == nil {
		boundListeners.m = make(map[*acceptor]uintptr)
	}
	boundListeners.m[l] = key
}

func unregisterListener(l *acceptor) {
	boundListeners.mu.Lock()
	defer boundListeners.mu.Unlock()
	delete(boundListeners.m, l)
}

// startFaults starts reading the device's async events.
func (d *device) startFaults() error {
	d.conns = make(map[*engine]struct{})
	d.portErr = make(map[uint8]error)
	r, err := d.ctx.OpenAsyncEvents()
	if err != nil {
		return err
	}
	d.async = r
	d.asyncWG.Add(1)
	go func() {
		defer d.asyncWG.Done()
		for ev := range r.Events() {
			d.handleAsync(ev)
		}
		if err := r.Err(); err != nil { // not teardown: reading failed
			d.failAll(&errs.DeviceFailed{Msg: "reading the RDMA device's async events failed, so its faults can no longer be seen", Cause: err})
		}
	}()
	return nil
}

// stopFaults stops the event reader (teardown).
func (d *device) stopFaults() {
	if d.async != nil {
		d.async.Close()
		d.asyncWG.Wait()
	}
}

func (d *device) addConn(c *engine) {
	d.fmu.Lock()
	d.conns[c] = struct{}{}
	d.fmu.Unlock()
}

func (d *device) removeConn(c *engine) {
	d.fmu.Lock()
	delete(d.conns, c)
	d.fmu.Unlock()
}

// usable reports why new connections on port cannot be made, or nil.
func (d *device) usable(port uint8) error {
	d.fmu.Lock()
	defer d.fmu.Unlock()
	if d.fatal != nil {
		return d.fatal
	}
	return d.portErr[port]
}

// handleAsync turns one async event into the failures it implies.
func (d *device) handleAsync(ev verbs.AsyncEvent) {
	d.events.Add(1)
	name := d.ctx.Name()
	if ev.Port != 0 {
		// A port event (state, LID, P_Key, GID, SM change: the only ones
		// that name a port): its cached limits may be stale.
		d.forgetPort(ev.Port)
	}
	switch ev.Type {
	case verbs.EventQPFatal, verbs.EventQPReqErr, verbs.EventQPAccessErr, verbs.EventPathMigErr:
		err := fmt.Errorf("device %s reported %v (the connection's queue pair failed): %w", name, ev, syscall.ECONNABORTED)
		d.failWhere(err, func(c *engine) bool { return c.ep.qp.Num == ev.QPN })
	case verbs.EventCQErr:
		err := fmt.Errorf("device %s reported %v (a completion queue overrun or failure): %w", name, ev, syscall.ECONNABORTED)
		for _, p := range d.pollers.Pollers() {
			if p.CQ().Key() == ev.CQ {
				p.Fail(err) // pollerFailed fails its connections
			}
		}
	case verbs.EventPortErr:
		err := fmt.Errorf("port %d of %s went down (its netdev lost its link or was set down; dial again once it is up): %w",
			ev.Port, name, syscall.ENETDOWN)
		d.fmu.Lock()
		d.portErr[ev.Port] = err
		d.fmu.Unlock()
		d.failWhere(err, func(c *engine) bool { return c.port == ev.Port })
	case verbs.EventPortActive:
		d.fmu.Lock()
		delete(d.portErr, ev.Port)
		d.fmu.Unlock()
	case verbs.EventDeviceFatal:
		d.failAll(&errs.DeviceFailed{Msg: fmt.Sprintf("RDMA device %s reported a fatal error (%v): it needs a reset "+
			"(driver reload, or rdma link delete/add for Soft-RoCE) before this process can use it again", name, ev.Type)})
	}
}

// failAll fails the device for good: its connections, the listeners bound
// to it, and later dials on it.
func (d *device) failAll(err error) {
	d.fmu.Lock()
	if d.fatal == nil {
		d.fatal = err
	}
	d.fmu.Unlock()
	devices.mu.Lock()
	fatalDevices[d.key] = err
	devices.mu.Unlock()
	d.failWhere(err, func(*engine) bool { return true })
	boundListeners.mu.Lock()
	var ls []*acceptor
	for l, key := range boundListeners.m {
		if key == d.key {
			ls = append(ls, l)
		}
	}
	boundListeners.mu.Unlock()
	for _, l := range ls {
		l.fail(err)
	}
}

// pollerFailed is the pollers' OnFail: the connections on a failed
// poller's CQ get no more completions.
func (d *device) pollerFailed(p *poller.Poller, err error) {
	d.failWhere(err, func(c *engine) bool { return c.ep.poller == p })
}

// failWhere fails the device's connections that match.
func (d *device) failWhere(err error, match func(*engine) bool) {
	d.fmu.Lock()
	var hit []*engine
	for c := range d.conns {
		if match(c) {
			hit = append(hit, c)
		}
	}
	d.fmu.Unlock()
	for _, c := range hit {
		c.failAsync(err)
	}
}

// failAsync fails the connection from outside its completions (a device
// fault): every blocked call returns err, as later calls do.
func (c *engine) failAsync(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return
	}
	c.failLocked(err)
	c.closeMessagesLocked()
	c.broadcast()
}
