//go:build linux && cgo

package rdma

import (
	"sync"

	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/verbs"
)

// The devices a process uses are internal/device's: one per device
// context, shared by its connections and PacketConns, with its PD, buffer
// pool, pollers, QP pool, cached port limits and faults. What the root
// package adds: the device's share of the Config, the listeners a fatal
// device fails, and
// the adapters through which the device fails a connection and the
// metrics read it.

// acquireDevice returns the shared state of ctx's device, creating it with
// cfg's settings for the first connection.
func acquireDevice(ctx *verbs.Context, cfg *Config) (*device.Device, error) {
	return device.Acquire(ctx, cfg.deviceConfig())
}

// deviceConfig is the device's share of the Config.
func (c *Config) deviceConfig() device.Config {
	return device.Config{
		Pollers:      c.pollerConfig(),
		PoolMaxBytes: c.PoolMaxBytes,
		BufferSize:   c.BufferSize,
		QPPool:       c.qpPoolSize(),
		Linger:       c.deviceLinger(),
		OnFatal:      failBoundListeners,
	}
}

// pollerConfig is the device pollers' share of the Config.
func (c *Config) pollerConfig() poller.Config {
	mode := poller.Adaptive
	switch c.PollMode {
	case PollBusy:
		mode = poller.Busy
	case PollEvent:
		mode = poller.Event
	}
	return poller.Config{Pollers: c.Pollers, CPUs: c.PollCPUs, Mode: mode, Spin: c.PollSpin, NoPin: c.PollNoPin}
}

// fatalDevice returns the error of the device with context key key if it
// failed for good, or nil.
func fatalDevice(key uintptr) error { return device.Fatal(key) }

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

// failBoundListeners fails the listeners bound to the device with
// context key key, which failed for good (the device's OnFatal).
func failBoundListeners(key uintptr, err error) {
	boundListeners.mu.Lock()
	var ls []*acceptor
	for l, k := range boundListeners.m {
		if k == key {
			ls = append(ls, l)
		}
	}
	boundListeners.mu.Unlock()
	for _, l := range ls {
		l.fail(err)
	}
}

// engineMember is the engine as one of its device's members: what the
// device's faults match and fail (a type of its own, so that its exported
// methods do not join Conn's).
type engineMember engine

func (c *engine) member() *engineMember { return (*engineMember)(c) }

func (m *engineMember) FaultScope() (qpn uint32, port uint8, p *poller.Poller) {
	return m.ep.qp.Num, m.port, m.ep.poller
}

// DeviceFailed fails the connection from outside its completions (a device
// fault): every blocked call returns err, as later calls do.
func (m *engineMember) DeviceFailed(err error) {
	c := (*engine)(m)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return
	}
	c.failLocked(err)
	c.closeMessagesLocked()
	c.broadcast()
}

// iwarpDevices lists the iWARP devices present: rdma_cm's ports on them
// are TCP ports (iw_cm listens on them), which a TCP fallback listener
// cannot share (fallback.go).
func iwarpDevices() []string { return verbs.IWARPDevices() }
