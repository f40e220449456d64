//go:build linux && cgo

package rdma

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/hints"
	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/verbs"
)

// device is what every connection on one RDMA device context shares: one
// protection domain, one buffer pool registered with it (so memory is
// registered once per arena, never per connection or per message), and the
// pinned pollers whose CQs the connections' QPs complete into.
type device struct {
	key     uintptr
	ctx     *verbs.Context
	pd      *verbs.PD
	pool    *buffer.Pool
	pollers *poller.Group
	slow    *lowPriority // registers the rings' arenas off the data path (lowprio.go)
	reg     *registrar
	refs    int // connections using it (devices.mu)
	// windows: the device has type 2 memory windows, so a message larger
	// than the peer's receive buffers can be lent to the peer for one RDMA
	// READ (rendezvous.go) without registering memory on the data path.
	windows bool
	// lendExact: the device bounds a window's accesses by the MR it is
	// bound over, not by the window's own range (Soft-RoCE), so a large
	// message is lent through a registration of exactly its bytes
	// (rendezvous.go) rather than through its arena's MR.
	lendExact  bool
	lendMRs    mrFreeList   // lendExact's MR structures, for reuse
	unread     unreadBudget // received large messages held, all connections (half the pool)
	faultState              // faults.go: async events, the connections they affect
	qps        qpPool       // reset QPs for new connections (qppool.go)
	ports      portCache    // the ports' limits, cached (portcache.go)
	linger     *time.Timer  // set while the device waits, unused, for a new connection (devices.mu)
	lingerGen  uint64       // which linger timer is current (devices.mu)
	// From the Config of the device's first connection (atomics: the
	// tests change them): Config.QPPool and Config.DeviceLinger, resolved.
	qpMax     atomic.Int32
	attr      *verbs.DeviceAttr // ibv_query_device's, once (it does not change)
	lingerFor atomic.Int64
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

// trackAllocations makes device pools record where each buffer was
// allocated, for the tests' leak reports (set by the package's tests).
var trackAllocations bool

var devices struct {
	mu sync.Mutex
	m  map[uintptr]*device
}

// acquireDevice returns the shared state of ctx's device, creating it with
// cfg's poller settings for the first connection.
func acquireDevice(ctx *verbs.Context, cfg *Config) (_ *device, err error) {
	devices.mu.Lock()
	defer devices.mu.Unlock()
	if err := fatalDevices[ctx.Key()]; err != nil {
		return nil, err
	}
	if d := devices.m[ctx.Key()]; d != nil {
		d.refs++
		if d.linger != nil {
			d.linger.Stop()
			d.linger = nil
		}
		return d, nil
	}
	d := &device{key: ctx.Key(), ctx: ctx, refs: 1}
	d.qpMax.Store(int32(cfg.qpPoolSize()))
	d.lingerFor.Store(int64(cfg.deviceLinger()))
	defer func() {
		if err != nil {
			d.teardown()
		}
	}()
	if d.pd, err = ctx.AllocPD(); err != nil {
		return nil, err
	}
	if d.attr, err = ctx.QueryDevice(); err != nil {
		return nil, err
	}
	attr := d.attr
	d.windows = attr.MemWindow2
	d.lendExact = isSoftRoCE(ctx.Name())
	d.reg = &registrar{pd: d.pd, access: verbs.AccessLocalWrite, mrs: make(map[uint32]*verbs.MR)}
	if d.windows {
		d.reg.access |= verbs.AccessMWBind // binding a window grants nothing by itself
	}
	// A device whose connections are gone lingers until its last buffer is
	// back (received messages may outlive their connection); OnIdle says when.
	// From a new goroutine: a release may come from under a Conn's lock or
	// from a poller, and teardown takes devices.mu and stops the pollers.
	onIdle := func() { go d.bufReturned() }
	if d.pool, err = buffer.NewPool(d.reg, buffer.Options{MaxBytes: cfg.PoolMaxBytes, Classes: poolClasses(cfg.BufferSize),
		TrackAllocations: trackAllocations, OnIdle: onIdle}); err != nil {
		return nil, err
	}
	d.unread.max = d.pool.MaxBytes() / 2
	d.slow = startLowPriority()
	pc := cfg.pollerConfig()
	pc.OnFail = d.pollerFailed
	if d.pollers, err = poller.NewGroup(ctx, pc); err != nil {
		return nil, err
	}
	if err = d.startFaults(); err != nil {
		return nil, err
	}
	if devices.m == nil {
		devices.m = make(map[uintptr]*device)
	}
	devices.m[d.key] = d
	return d, nil
}

// release drops a connection's reference; the last one frees the device's
// pollers, pool and PD (QPs must be gone by then).
func (d *device) release() {
	devices.mu.Lock()
	defer devices.mu.Unlock()
	d.refs--
	d.maybeTeardownLocked()
}

// bufReturned is called when a buffer lent by a closed connection comes back.
func (d *device) bufReturned() {
	devices.mu.Lock()
	defer devices.mu.Unlock()
	d.maybeTeardownLocked()
}

// maybeTeardownLocked frees the device once no connection uses it and no
// buffer of its pool is out: received messages may outlive their connection,
// and their memory must stay mapped until they are released.
func (d *device) maybeTeardownLocked() {
	if d.refs > 0 || d.pool.Stats().InUseBytes > 0 || devices.m[d.key] != d {
		return
	}
	if linger := time.Duration(d.lingerFor.Load()); linger > 0 && fatalDevices[d.key] == nil {
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
func (d *device) lingerExpired(gen uint64) {
	devices.mu.Lock()
	defer devices.mu.Unlock()
	if d.linger == nil || d.lingerGen != gen {
		return // a connection came (and maybe went: a newer timer runs)
	}
	d.linger = nil
	if d.refs > 0 || d.pool.Stats().InUseBytes > 0 || devices.m[d.key] != d {
		return
	}
	d.teardownLocked()
}

// flushLingeringDevices tears down at once every device that only lingers
// (no connection, no buffer out): for the tests' leak checks.
func flushLingeringDevices() { teardownUnusedDevices(false) }

// teardownUnusedDevices tears down at once every device no connection
// uses: those that only linger, and with buffersOut also those whose pool
// still has buffers out (their handles go stale: for the tests, once a
// leak was reported).
func teardownUnusedDevices(buffersOut bool) {
	devices.mu.Lock()
	defer devices.mu.Unlock()
	for _, d := range devices.m {
		if d.refs == 0 && (buffersOut || d.linger != nil && d.pool.Stats().InUseBytes == 0) {
			if d.linger != nil {
				d.linger.Stop()
				d.linger = nil
			}
			d.teardownLocked()
		}
	}
}

// teardownLocked removes an unused device from the table and frees it.
func (d *device) teardownLocked() {
	delete(devices.m, d.key)
	// Not here: this may run on a poller's goroutine (a buffer released by a
	// completion) or under a Conn's lock while a poller waits for that lock,
	// and teardown waits for the pollers to stop.
	tearingDown.Add(1)
	go func() {
		defer tearingDown.Add(-1)
		if err := d.teardown(); err != nil {
			teardownErr.Store(&err) // the tests' leak checks report it
		}
	}()
}

// tearingDown counts device teardowns under way (for the tests' leak checks).
var tearingDown atomic.Int64

// teardownErr is the last error of a device teardown (destroying the CQs,
// deregistering the pool, deallocating the PD), which no caller is left
// to receive: it means something still held the device.
var teardownErr atomic.Pointer[error]

func (d *device) teardown() error {
	d.stopFaults()
	var errs []error
	errs = append(errs, d.qps.drain()) // the pooled QPs complete into the pollers' CQs
	if d.pollers != nil {
		errs = append(errs, d.pollers.Close())
	}
	if d.pool != nil {
		errs = append(errs, d.pool.Close())
	}
	if d.slow != nil {
		d.slow.stop()
	}
	if d.pd != nil {
		errs = append(errs, d.pd.Close())
	}
	return errors.Join(errs...)
}

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
		return nil, hints.RegistrationError(err, len(mem), "") // a refused pinning with a hint: the limit, what is pinned, how to raise it
	}
	r.mu.Lock()
	r.mrs[mr.LKey] = mr
	r.mu.Unlock()
	return registration{r, mr}, nil
}

// mr returns the MR of the arena b was carved from.
func (r *registrar) mr(b buffer.Buf) *verbs.MR {
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

// poolClasses are the pool's size classes: powers of four from 256 B to
// 4 MiB, plus the connections' buffer size so their rings waste nothing.
func poolClasses(bufSize int) []int {
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
