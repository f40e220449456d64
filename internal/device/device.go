//go:build linux && cgo

// Package device is the registry of the RDMA devices a process uses and
// what the connections on one device share: the verbs context, one
// protection domain, one buffer pool registered with it, the pinned
// pollers whose CQs the connections' QPs complete into, the pool of reset
// QPs, the ports' cached limits, the low-priority worker, the budget of
// unread large messages, and the device's faults fanned out to its
// connections (faults.go). A device is set up by its first connection
// (Acquire) and torn down after its last one and its last lent buffer,
// once it has lingered unused for Config.Linger.
package device

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/hints"
	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/testhooks"
	"github.com/verbline/rdma/internal/verbs"
)

// Config is what a device takes from its first connection: the root
// package builds it from its own Config.
type Config struct {
	Pollers      poller.Config // OnFail is the device's own
	PoolMaxBytes int64         // the buffer pool's limit (0: the pool's default)
	BufferSize   int           // the connections' buffer size, a size class of the pool
	QPPool       int           // reset QPs kept for new connections; 0 keeps none
	Linger       time.Duration // how long an unused device is kept; 0 tears it down at once

	// OnFatal, if set, is called once the device failed for good (the
	// listeners bound to it fail too).
	OnFatal func(key uintptr, err error)
}

// Device is what every connection on one RDMA device context shares.
type Device struct {
	// Set by Acquire, then immutable.
	Ctx     *verbs.Context
	PD      *verbs.PD
	Pool    *buffer.Pool  // registered once per arena, never per connection or per message
	Pollers *poller.Group // the shared CQs
	Attr    *verbs.DeviceAttr
	Caps    Caps // what the device can do, as the paths ask it (caps.go)
	// LendExact: the device bounds a window's accesses by the MR it is
	// bound over, not by the window's own range (Soft-RoCE), so a large
	// message is lent through a registration of exactly its bytes rather
	// than through its arena's MR.
	LendExact bool
	// SignalFrom: a send-queue request carrying at least this many bytes
	// must ask for its own completion (0: none must). Soft-iWARP
	// (quirks.go).
	SignalFrom int
	// ReadsIgnoreRights: the device serves a peer's RDMA READ from any of
	// its registrations, remote read granted or not (Soft-iWARP;
	// quirks.go).
	ReadsIgnoreRights bool

	// Each guarded by its own lock.
	Ports      PortCache // the ports' limits, cached (portcache.go)
	QPs        QPPool    // reset QPs for new connections (qppool.go)
	Unread     Unread    // received large messages held, all connections (half the pool)
	faultState           // async events, the connections they affect (faults.go)
	lendMRs    mrFreeList

	// Atomics, from the Config of the device's first connection (the
	// tests change them).
	QPMax     atomic.Int32 // Config.QPPool
	LingerFor atomic.Int64 // Config.Linger, in nanoseconds
	// InlineGranted is the inline room the device granted a QP that asked
	// for more (CreateQP): 0 until one did, -1 for none.
	InlineGranted atomic.Int32

	key  uintptr
	name string
	cfg  Config
	rxe  bool         // a Soft-RoCE device (quirks.go)
	slow *lowPriority // registers the rings' arenas off the data path (lowprio.go)
	reg  *registrar

	// Guarded by registry.mu.
	refs      int         // connections using it
	linger    *time.Timer // set while the device waits, unused, for a new connection
	lingerGen uint64      // which linger timer is current
}

// registry is the process's devices by context key.
var registry struct {
	mu sync.Mutex
	m  map[uintptr]*Device
	// Devices that reported a fatal error stay failed for the process (a
	// new device state on the same context would fail too): dials fail
	// fast.
	fatal map[uintptr]error
}

// Fatal returns the error of the device with context key key if it
// failed for good, or nil.
func Fatal(key uintptr) error {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return registry.fatal[key]
}

// ForgetFatal clears the record of a failed device (tests).
func ForgetFatal(key uintptr) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	delete(registry.fatal, key)
}

// Acquire returns the shared state of ctx's device, creating it with cfg
// for the first connection. Each Acquire is paired with a Release.
func Acquire(ctx *verbs.Context, cfg Config) (_ *Device, err error) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if err := registry.fatal[ctx.Key()]; err != nil {
		return nil, err
	}
	if d := takeLocked(ctx.Key()); d != nil {
		return d, nil
	}
	d := &Device{key: ctx.Key(), name: ctx.Name(), Ctx: ctx, cfg: cfg, refs: 1}
	d.QPMax.Store(int32(cfg.QPPool))
	d.LingerFor.Store(int64(cfg.Linger))
	defer func() {
		if err != nil {
			d.teardown()
		}
	}()
	if d.PD, err = ctx.AllocPD(); err != nil {
		return nil, err
	}
	if d.Attr, err = ctx.QueryDevice(); err != nil {
		return nil, err
	}
	d.Ports.query = func(num uint8) (verbs.PortLimits, error) {
		port, err := ctx.QueryPort(num)
		if err != nil {
			return verbs.PortLimits{}, err
		}
		return port.Limits(d.Attr), nil
	}
	d.Caps = CapsOf(d.Attr)
	d.rxe = IsSoftRoCE(d.name)
	d.LendExact = d.rxe
	if d.Caps.Transport == verbs.TransportIWARP && IsSoftware(d.name) {
		d.SignalFrom = os.Getpagesize() // siw's zero-copy threshold (quirks.go)
	}
	d.ReadsIgnoreRights = ReadsIgnoreRights(d.Caps, d.name)
	d.reg = &registrar{pd: d.PD, access: verbs.AccessLocalWrite, mrs: make(map[uint32]*verbs.MR)}
	if d.Caps.MemoryWindows {
		d.reg.access |= verbs.AccessMWBind // binding a window grants nothing by itself
	}
	// A device whose connections are gone lingers until its last buffer is
	// back (received messages may outlive their connection); OnIdle says when.
	// From a new goroutine: a release may come from under a connection's
	// lock or from a poller, and teardown takes the registry's lock and
	// stops the pollers.
	onIdle := func() { go d.BufReturned() }
	if d.Pool, err = buffer.NewPool(d.reg, buffer.Options{MaxBytes: cfg.PoolMaxBytes, Classes: PoolClasses(cfg.BufferSize),
		TrackAllocations: testhooks.TrackAllocations.Load(), OnIdle: onIdle}); err != nil {
		return nil, err
	}
	d.Unread.max = d.Pool.MaxBytes() / 2
	d.slow = startLowPriority()
	pc := cfg.Pollers
	pc.OnFail = d.pollerFailed
	if d.Pollers, err = poller.NewGroup(ctx, pc); err != nil {
		return nil, err
	}
	if err = d.startFaults(); err != nil {
		return nil, err
	}
	if registry.m == nil {
		registry.m = make(map[uintptr]*Device)
	}
	registry.m[d.key] = d
	return d, nil
}

// takeLocked returns the device of context key key, with one more
// reference, if it is set up; a lingering device stops lingering.
func takeLocked(key uintptr) *Device {
	d := registry.m[key]
	if d == nil {
		return nil
	}
	d.refs++
	if d.linger != nil {
		d.linger.Stop()
		d.linger = nil
	}
	return d
}

// Key is the device's context key.
func (d *Device) Key() uintptr { return d.key }

// Name is the device's name (e.g. "mlx5_0", "rxe0").
func (d *Device) Name() string { return d.name }

// Release drops a connection's reference; the last one frees the device's
// pollers, pool and PD (QPs must be gone by then), at once or after its
// linger.
func (d *Device) Release() {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	d.refs--
	d.maybeTeardownLocked()
}

// BufReturned is called when a buffer lent by a closed connection comes
// back: the device may have been waiting for it.
func (d *Device) BufReturned() {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	d.maybeTeardownLocked()
}

// unusedLocked reports whether nothing holds the device any more: no
// connection, no buffer of its pool out (received messages may outlive
// their connection, and their memory must stay mapped until they are
// released), and it is still the registered one.
func (d *Device) unusedLocked() bool {
	return d.refs <= 0 && d.Pool.Stats().InUseBytes == 0 && registry.m[d.key] == d
}

// maybeTeardownLocked frees the device once nothing holds it, or starts
// its linger.
func (d *Device) maybeTeardownLocked() {
	if !d.unusedLocked() {
		return
	}
	if linger := time.Duration(d.LingerFor.Load()); linger > 0 && registry.fatal[d.key] == nil {
		// Kept a while for the next connection (its QP pool, pollers and
		// registered buffers are warm); lingerExpired tears it down.
		if d.linger == nil {
			d.lingerGen++
			gen := d.lingerGen
			d.linger = time.AfterFunc(linger, func() { d.lingerExpired(gen) })
		}
		return
	}
	d.teardownLocked()
}

// lingerExpired tears the device down if it is still unused when its
// linger timer number gen fires.
func (d *Device) lingerExpired(gen uint64) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if d.linger == nil || d.lingerGen != gen {
		return // a connection came (and maybe went: a newer timer runs)
	}
	d.linger = nil
	if d.unusedLocked() {
		d.teardownLocked()
	}
}

// Registered reports whether d is still its context's device (not torn
// down, nor being torn down).
func (d *Device) Registered() bool {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return registry.m[d.key] == d
}

// Refs is how many connections use the device (tests).
func (d *Device) Refs() int {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return d.refs
}

// Lingering reports whether the device is kept, unused, for the next
// connection (tests).
func (d *Device) Lingering() bool {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return registry.m[d.key] == d && d.refs == 0 && d.linger != nil
}

// All returns the devices set up now (tests).
func All() []*Device {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	out := make([]*Device, 0, len(registry.m))
	for _, d := range registry.m {
		out = append(out, d)
	}
	return out
}

// FlushLingering tears down at once every device that only lingers (no
// connection, no buffer out): for the tests' leak checks.
func FlushLingering() { TeardownUnused(false) }

// TeardownUnused tears down at once every device no connection uses:
// those that only linger, and with buffersOut also those whose pool still
// has buffers out (their handles go stale: for the tests, once a leak was
// reported).
func TeardownUnused(buffersOut bool) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	for _, d := range registry.m {
		if d.refs == 0 && (buffersOut || d.linger != nil && d.Pool.Stats().InUseBytes == 0) {
			if d.linger != nil {
				d.linger.Stop()
				d.linger = nil
			}
			d.teardownLocked()
		}
	}
}

// teardownLocked removes an unused device from the table and frees it.
func (d *Device) teardownLocked() {
	delete(registry.m, d.key)
	// Not here: this may run on a poller's goroutine (a buffer released by a
	// completion) or under a connection's lock while a poller waits for
	// that lock, and teardown waits for the pollers to stop.
	tearingDown.Add(1)
	go func() {
		defer tearingDown.Add(-1)
		if err := d.teardown(); err != nil {
			NoteTeardownErr(err)
		}
	}()
}

// tearingDown counts device teardowns under way (for the tests' leak checks).
var tearingDown atomic.Int64

// TearingDown is how many device teardowns are under way (tests).
func TearingDown() int64 { return tearingDown.Load() }

// teardownErr is the last error of freeing a device's objects in the
// background (destroying the CQs, deregistering the pool, deallocating
// the PD, destroying a retired QP), which no caller is left to receive: it
// means something still held the device.
var teardownErr atomic.Pointer[error]

// NoteTeardownErr records err, a failure to free a device's object that
// no caller is left to receive.
func NoteTeardownErr(err error) { teardownErr.Store(&err) }

// TakeTeardownErr returns the last error NoteTeardownErr recorded, or
// nil, and clears it (the tests' leak checks report it).
func TakeTeardownErr() error {
	if p := teardownErr.Swap(nil); p != nil {
		return *p
	}
	return nil
}

func (d *Device) teardown() error {
	d.stopFaults()
	var errs []error
	errs = append(errs, d.QPs.Drain()) // the pooled QPs complete into the pollers' CQs
	if d.Pollers != nil {
		errs = append(errs, d.Pollers.Close())
	}
	if d.Pool != nil {
		errs = append(errs, d.Pool.Close())
	}
	if d.slow != nil {
		d.slow.stop()
	}
	if d.PD != nil {
		errs = append(errs, d.PD.Close())
	}
	return errors.Join(errs...)
}

// RunLowPriority runs f on the device's low-priority worker and returns
// its result (lowprio.go): for work off the data path that burns CPU in
// the kernel, such as registering a pool arena.
func (d *Device) RunLowPriority(f func() error) error { return d.slow.run(f) }

// registrar registers pool arenas with the device's PD for local access
// (and window binding) only: nothing is remotely accessible unless a
// connection exports it or binds a window to it. It remembers each arena's
// MR by lkey, which a window bind needs.
type registrar struct {
	pd     *verbs.PD
	access verbs.AccessFlags
	mu     sync.RWMutex
	mrs    map[uint32]*verbs.MR
}

func (r *registrar) Register(mem []byte) (buffer.Registration, error) {
	mr, err := r.pd.RegMR(mem, r.access)
	if err != nil {
		return nil, registrationError(err, len(mem)) // a refused pinning with a hint: the limit, what is pinned, how to raise it
	}
	r.mu.Lock()
	r.mrs[mr.LKey] = mr
	r.mu.Unlock()
	return registration{r, mr}, nil
}

// ArenaMR returns the MR of the pool arena b was carved from.
func (d *Device) ArenaMR(b buffer.Buf) *verbs.MR {
	r := d.reg
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.mrs[b.LKey()]
}

type registration struct {
	r  *registrar
	mr *verbs.MR
}

func (r registration) LKey() uint32 { return r.mr.LKey }
func (r registration) RKey() uint32 { return r.mr.RKey }
func (r registration) Addr() uint64 { return r.mr.Addr() }
func (r registration) Close() error {
	r.r.mu.Lock()
	delete(r.r.mrs, r.mr.LKey)
	r.r.mu.Unlock()
	return r.mr.Close()
}

// mrFreeList recycles the MR structures of registrations of exactly a
// lent message's bytes (LendExact), so that a large message allocates
// nothing. It holds as many as were ever lent at once on the device.
type mrFreeList struct {
	mu   sync.Mutex
	free []*verbs.MR
}

// LendMR returns an MR structure to register a lent message into
// (PD.RegMRInto); PutLendMR or CloseLendMR gives it back.
func (d *Device) LendMR() *verbs.MR {
	l := &d.lendMRs
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.free); n > 0 {
		mr := l.free[n-1]
		l.free = l.free[:n-1]
		return mr
	}
	return new(verbs.MR)
}

// PutLendMR gives back an MR structure LendMR returned that holds no
// registration.
func (d *Device) PutLendMR(mr *verbs.MR) {
	l := &d.lendMRs
	l.mu.Lock()
	l.free = append(l.free, mr)
	l.mu.Unlock()
}

// CloseLendMR deregisters a lent message's registration and keeps its
// structure for the next one.
func (d *Device) CloseLendMR(mr *verbs.MR) {
	if err := mr.Close(); err != nil {
		NoteTeardownErr(err)
		return // not reusable
	}
	d.PutLendMR(mr)
}

// PoolClasses are the pool's size classes: powers of four from 256 B to
// 4 MiB, plus the connections' buffer size so their rings waste nothing.
func PoolClasses(bufSize int) []int {
	var out []int
	for c := 256; c <= 4<<20; c *= 4 {
		if bufSize < c && (len(out) == 0 || out[len(out)-1] < bufSize) {
			out = append(out, bufSize)
		}
		out = append(out, c)
	}
	if bufSize > out[len(out)-1] {
		out = append(out, bufSize)
	}
	return out
}

// registrationError is the error of a refused registration of n bytes of
// a pool arena, with the hint to raise the locked-memory limit.
func registrationError(err error, n int) error { return hints.RegistrationError(err, n, "") }
