//go:build linux && cgo

package device

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
//     to it fail Accept (Config.OnFatal), and dials on it fail fast.
//
// Device removal comes as a CM event to each cm_id (the connections' and
// the listeners' event loops). Every event is counted (Device.Events).

// Member is a connection on a device: what the device's faults fail. Its
// methods are called from the device's event reader and pollers, never on
// the data path.
type Member interface {
	// FaultScope is what a fault is matched against: the member's QP
	// number, its port and the poller whose CQ its QP completes into.
	FaultScope() (qpn uint32, port uint8, p *poller.Poller)
	// DeviceFailed fails the member from outside its completions: every
	// blocked call returns err, as later calls do.
	DeviceFailed(err error)
}

// faultState is a device's record of its faults and of what they affect,
// guarded by its own mutex (events arrive on the device's reader goroutine;
// members come and go under the registry's lock and their own).
type faultState struct {
	fmu     sync.Mutex
	members map[Member]struct{} // live connections on the device
	portErr map[uint8]error     // ports that are down
	fatal   error               // the device reported a fatal error
	events  atomic.Uint64       // async events seen
	async   *verbs.AsyncReader
	asyncWG sync.WaitGroup
}

// startFaults starts reading the device's async events.
func (d *Device) startFaults() error {
	r, err := d.Ctx.OpenAsyncEvents()
	if err != nil {
		return err
	}
	d.async = r
	d.asyncWG.Add(1)
	go func() {
		defer d.asyncWG.Done()
		for ev := range r.Events() {
			d.HandleAsync(ev)
		}
		if err := r.Err(); err != nil { // not teardown: reading failed
			d.failAll(&errs.DeviceFailed{Msg: "reading the RDMA device's async events failed, so its faults can no longer be seen", Cause: err})
		}
	}()
	return nil
}

// stopFaults stops the event reader (teardown).
func (d *Device) stopFaults() {
	if d.async != nil {
		d.async.Close()
		d.asyncWG.Wait()
	}
}

// Add makes m one of the connections the device's faults fail.
func (d *Device) Add(m Member) {
	d.fmu.Lock()
	if d.members == nil {
		d.members = make(map[Member]struct{})
	}
	d.members[m] = struct{}{}
	d.fmu.Unlock()
}

// Remove forgets m.
func (d *Device) Remove(m Member) {
	d.fmu.Lock()
	delete(d.members, m)
	d.fmu.Unlock()
}

func (d *Device) portDownErr(port uint8) error {
	return fmt.Errorf("port %d of %s went down (its netdev lost its link or was set down; dial again once it is up): %w",
		port, d.name, syscall.ENETDOWN)
}

// PortDown says why a connection on port that just broke broke, if its
// port is down: the error the port's event recorded, or, where the
// connection's end came before that event (an iWARP device ends its TCP
// connections at once), the port's state read from the device. nil while
// the port is active. It queries the device: for failure paths only.
func (d *Device) PortDown(port uint8) error {
	d.fmu.Lock()
	err := d.portErr[port]
	d.fmu.Unlock()
	if err != nil {
		return err
	}
	if d.Ctx == nil {
		return nil
	}
	if p, qerr := d.Ctx.QueryPort(port); qerr == nil && p.State != verbs.PortActive {
		return d.portDownErr(port)
	}
	return nil
}

// Usable reports why new connections on port cannot be made, or nil.
func (d *Device) Usable(port uint8) error {
	d.fmu.Lock()
	defer d.fmu.Unlock()
	if d.fatal != nil {
		return d.fatal
	}
	return d.portErr[port]
}

// Events is how many async events the device reported.
func (d *Device) Events() uint64 { return d.events.Load() }

// HandleAsync turns one async event into the failures it implies (the
// device's event reader; tests inject events).
func (d *Device) HandleAsync(ev verbs.AsyncEvent) {
	d.events.Add(1)
	if ev.Port != 0 {
		// A port event (state, LID, P_Key, GID, SM change: the only ones
		// that name a port): its cached limits may be stale.
		d.Ports.Forget(ev.Port)
	}
	switch ev.Type {
	case verbs.EventQPFatal, verbs.EventQPReqErr, verbs.EventQPAccessErr, verbs.EventPathMigErr:
		err := fmt.Errorf("device %s reported %v (the connection's queue pair failed): %w", d.name, ev, syscall.ECONNABORTED)
		d.failWhere(err, func(qpn uint32, _ uint8, _ *poller.Poller) bool { return qpn == ev.QPN })
	case verbs.EventCQErr:
		err := fmt.Errorf("device %s reported %v (a completion queue overrun or failure): %w", d.name, ev, syscall.ECONNABORTED)
		for _, p := range d.Pollers.Pollers() {
			if p.CQ().Key() == ev.CQ {
				p.Fail(err) // pollerFailed fails its connections
			}
		}
	case verbs.EventPortErr:
		err := d.portDownErr(ev.Port)
		d.fmu.Lock()
		if d.portErr == nil {
			d.portErr = make(map[uint8]error)
		}
		d.portErr[ev.Port] = err
		d.fmu.Unlock()
		d.failWhere(err, func(_ uint32, port uint8, _ *poller.Poller) bool { return port == ev.Port })
	case verbs.EventPortActive:
		d.fmu.Lock()
		delete(d.portErr, ev.Port)
		d.fmu.Unlock()
	case verbs.EventDeviceFatal:
		d.failAll(&errs.DeviceFailed{Msg: fmt.Sprintf("RDMA device %s reported a fatal error (%v): it needs a reset "+
			"(driver reload, or rdma link delete/add for Soft-RoCE) before this process can use it again", d.name, ev.Type)})
	}
}

// failAll fails the device for good: its connections, the listeners bound
// to it (Config.OnFatal), and later dials on it.
func (d *Device) failAll(err error) {
	d.fmu.Lock()
	if d.fatal == nil {
		d.fatal = err
	}
	d.fmu.Unlock()
	registry.mu.Lock()
	if registry.fatal == nil {
		registry.fatal = make(map[uintptr]error)
	}
	registry.fatal[d.key] = err
	registry.mu.Unlock()
	d.failWhere(err, func(uint32, uint8, *poller.Poller) bool { return true })
	if d.cfg.OnFatal != nil {
		d.cfg.OnFatal(d.key, err)
	}
}

// pollerFailed is the pollers' OnFail: the connections on a failed
// poller's CQ get no more completions.
func (d *Device) pollerFailed(p *poller.Poller, err error) {
	d.failWhere(err, func(_ uint32, _ uint8, mp *poller.Poller) bool { return mp == p })
}

// failWhere fails the device's connections whose scope matches.
func (d *Device) failWhere(err error, match func(qpn uint32, port uint8, p *poller.Poller) bool) {
	d.fmu.Lock()
	var hit []Member
	for m := range d.members {
		if match(m.FaultScope()) {
			hit = append(hit, m)
		}
	}
	d.fmu.Unlock()
	for _, m := range hit {
		m.DeviceFailed(err)
	}
}
