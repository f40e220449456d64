//go:build linux && cgo

package poller

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	cerrors "github.com/cockroachdb/errors"
	uatomic "go.uber.org/atomic"
	"golang.org/x/sys/unix"

	"github.com/verbline/rdma/internal/verbs"
)

// Mode says how a poller waits when there is nothing to poll.
type Mode int

const (
	// Adaptive lets waiting callers drive the CQ (each spins for a budget
	// learnt from its recent waits, then parks); the poller goroutine
	// covers what nobody waits for and sleeps on the completion channel
	// through the Go netpoller.
	Adaptive Mode = iota
	// Busy never sleeps: lowest latency, one core per poller at 100%.
	Busy
	// Event never spins: every wait goes through the completion channel.
	Event
)

func (m Mode) String() string {
	switch m {
	case Adaptive:
		return "adaptive"
	case Busy:
		return "busy"
	case Event:
		return "event"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Config sets up a device's pollers.
type Config struct {
	Pollers int           // 0 = one; never more than GOMAXPROCS-1 (at least one)
	CPUs    []int         // cores to pin to, in order; nil = chosen (see ClaimCPUs)
	Mode    Mode          // how to wait
	Spin    time.Duration // a waiting caller's minimum spin budget; 0 = 50 µs
	CQSize  int           // initial entries per CQ; 0 = 4096 (grown as connections attach)
	// MaxCQE caps a CQ's entries; 0 = the device's max_cqe. When no
	// poller's CQ can take a new connection's entries within it, the group
	// adds a poller (an unpinned one) with a CQ of its own.
	MaxCQE int
	// NoPin runs pollers as ordinary goroutines: no locked OS thread, no
	// affinity, even when CPUs are given.
	NoPin bool
	// Idle is how long the CQ must go unpolled by callers before the
	// poller goroutine takes over (arms the CQ and sleeps on its channel).
	// 0 = 1 ms. While callers poll, the CQ stays unarmed: an armed CQ would
	// wake the poller for completions the callers take themselves. The
	// poller still looks every 100 ms (every Idle for a channel
	// consumer's sake), so it takes over within that once they stop.
	Idle time.Duration
	// OnFail, if set, is called once (on a goroutine of its own) when a
	// poller fails: polling or arming its CQ, or reading its completion
	// channel, returned an error. The poller takes no new connections;
	// those attached to it get no more completions and must be failed.
	OnFail func(*Poller, error)
}

// Stats counts a poller's work. Polls made by callers and by the poller's
// own goroutine are counted apart: the goal is that callers do the work.
type Stats struct {
	Polls       uint64 // poll calls (cgo) made by the poller goroutine
	Completions uint64 // completions dispatched, by anyone
	Sleeps      uint64 // times the poller goroutine armed the CQ and slept
	Wakeups     uint64 // times a CQ event woke the poller goroutine
	Dropped     uint64 // completions for connections that had left
	InlinePolls uint64 // poll calls made by waiting callers
	EmptyPolls  uint64 // ... of which found nothing
	Parks       uint64 // callers that ran out of spin budget and parked
	Arms        uint64 // ibv_req_notify_cq calls
}

// Poller owns one CQ shared by the connections attached to it. Whoever
// holds owner polls it and dispatches: a waiting caller (Waiter) or the
// poller's own goroutine, which covers what no caller waits for.
type Poller struct {
	g        *Group
	cq       *verbs.CQ
	ch       *verbs.CompChannel
	file     *os.File // dup of the channel fd, for the netpoller
	handlers *table
	cpu      int // -1 when not pinned
	tid      atomic.Int32
	reserved int // CQ entries promised to attached connections (g.mu)
	stop     atomic.Bool
	done     chan struct{}
	pinErr   uatomic.Error // why pinning failed (set once, by run)
	failErr  uatomic.Error // why the poller stopped (set once, by Fail)

	owner    atomic.Bool   // held while polling and dispatching
	inline   []verbs.WC    // the owner's batch when a caller polls
	progress atomic.Uint64 // completions dispatched so far: waiters watch it change
	spinners atomic.Int32  // callers spinning on the CQ now
	parked   atomic.Int32  // callers parked until a completion wakes them
	// chanUsers counts connections whose user may wait on a channel
	// (Messages, Notifications, Completions) without calling into the
	// library: only for them must the poller look at the CQ while callers
	// drive it, in case they all went quiet.
	chanUsers atomic.Int32
	kicked    atomic.Bool   // look at the CQ again before sleeping (AddChannelUser)
	backstop  time.Duration // the poller goroutine's: see lookAgain

	polls, completions, sleeps, wakeups, dropped atomic.Uint64
	inlinePolls, emptyPolls, parks, arms         atomic.Uint64
}

// Group is the set of pollers of one device context.
type Group struct {
	mu      sync.Mutex
	ctx     *verbs.Context
	cfg     Config
	pollers []*Poller
	claims  []*cpuClaim
	closed  bool
	// fixedCQ: the device cannot resize a CQ (Soft-iWARP: EOPNOTSUPP), so a
	// CQ holds what it was created with and new ones are made large
	// (fixedCQSize); learnt at the first refused resize.
	fixedCQ bool
}

// fixedCQSize is the size of the CQs made once the device has refused to
// resize one: room for about 200 connections of the default Config.
const fixedCQSize = 1 << 16

// errCQFull: a poller's CQ cannot take a connection's entries.
var errCQFull = errors.New("completion queue full")

// cqRoom is how many entries p's CQ can come to hold: the device's cap, or
// its size where CQs cannot be resized. Called with g.mu held.
func (g *Group) cqRoom(p *Poller) int {
	if g.fixedCQ {
		return min(p.cq.Size, g.cfg.MaxCQE) // a device may round a CQ's size up past the cap
	}
	return g.cfg.MaxCQE
}

// growCQ makes p's CQ hold need entries. Where the device refuses to resize
// a CQ it records that (fixedCQ) and returns errCQFull: the caller takes
// another CQ. Called with g.mu held.
func (g *Group) growCQ(p *Poller, need int) error {
	if need <= p.cq.Size {
		return nil
	}
	if g.fixedCQ {
		return errCQFull
	}
	err := p.cq.Resize(min(max(need, 2*p.cq.Size), g.cfg.MaxCQE))
	if errors.Is(err, unix.EOPNOTSUPP) {
		g.fixedCQ = true
		return errCQFull
	}
	return err
}

// NewGroup starts cfg.Pollers pollers on ctx.
func NewGroup(ctx *verbs.Context, cfg Config) (_ *Group, err error) {
	if cfg.Spin == 0 {
		cfg.Spin = 50 * time.Microsecond
	}
	if cfg.CQSize == 0 {
		cfg.CQSize = 4096
	}
	if cfg.Idle == 0 {
		cfg.Idle = time.Millisecond
	}
	if cfg.MaxCQE == 0 {
		attr, err := ctx.QueryDevice()
		if err != nil {
			return nil, err
		}
		cfg.MaxCQE = attr.MaxCQE
	}
	cfg.CQSize = min(cfg.CQSize, cfg.MaxCQE)
	n := cfg.Pollers
	if n <= 0 {
		n = 1
	}
	if limit := runtime.GOMAXPROCS(0) - 1; n > limit {
		n = max(1, limit)
	}
	g := &Group{ctx: ctx, cfg: cfg}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	cpus := cfg.CPUs
	if cpus == nil && !cfg.NoPin {
		cpus, g.claims = ClaimCPUs(n)
	}
	for i := 0; i < n; i++ {
		cpu := -1
		if i < len(cpus) && !cfg.NoPin {
			cpu = cpus[i]
		}
		p, err := newPoller(g, ctx, cpu)
		if err != nil {
			return nil, err
		}
		g.pollers = append(g.pollers, p)
	}
	return g, nil
}

func newPoller(g *Group, ctx *verbs.Context, cpu int) (_ *Poller, err error) {
	p := &Poller{g: g, handlers: newTable(), cpu: cpu, done: make(chan struct{}), inline: make([]verbs.WC, 64)}
	if p.ch, err = ctx.CreateCompChannel(); err != nil {
		return nil, err
	}
	size := g.cfg.CQSize
	if g.fixedCQ {
		size = min(max(size, fixedCQSize), g.cfg.MaxCQE)
	}
	if p.cq, err = ctx.CreateCQ(size, p.ch); err != nil {
		p.ch.Close()
		return nil, err
	}
	fd, err := unix.FcntlInt(uintptr(p.ch.Fd()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		p.cq.Close()
		p.ch.Close()
		return nil, fmt.Errorf("dup completion channel fd: %w", err)
	}
	p.file = os.NewFile(uintptr(fd), "rdma-completions")
	started := make(chan struct{})
	go p.run(started)
	<-started
	return p, nil
}

// Attach assigns h to the least-loaded poller, growing its CQ by entries
// (the most completions h can have outstanding). It returns the poller and
// the token h must put in its work-request ids (see TokenShift).
func (g *Group) Attach(h Handler, entries int) (*Poller, uint32, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		// A device's pollers close with its last connection, so no
		// connection can be attaching: a bug in the device's reference count.
		return nil, 0, cerrors.AssertionFailedf("attaching a connection to a closed poller group")
	}
	if entries > g.cfg.MaxCQE {
		return nil, 0, fmt.Errorf("a connection needs %d completion queue entries; the device allows %d per CQ "+
			"(lower Config.RecvBuffers and SendBuffers)", entries, g.cfg.MaxCQE)
	}
	for {
		var best *Poller
		for _, p := range g.pollers {
			if p.reserved+entries > g.cqRoom(p) || p.Err() != nil {
				continue // full (its CQ cannot grow that far), or failed
			}
			if best == nil || p.handlers.count.Load() < best.handlers.count.Load() {
				best = p
			}
		}
		if best == nil {
			// Every CQ is at its limit: add a poller with a CQ of its own
			// (not pinned: the cores were claimed for the first ones).
			p, err := newPoller(g, g.ctx, -1)
			if err != nil {
				return nil, 0, fmt.Errorf("adding a completion queue for a new connection: %w", err)
			}
			g.pollers = append(g.pollers, p)
			best = p
		}
		err := g.growCQ(best, best.reserved+entries)
		if err == errCQFull {
			continue // the device cannot resize CQs: look again, now with their sizes as their limits
		}
		if err != nil {
			return nil, 0, fmt.Errorf("growing the shared CQ for a new connection: %w", err)
		}
		best.reserved += entries
		return best, best.handlers.add(h), nil
	}
}

// Fail records that the poller cannot go on (the first error wins): it
// takes no new connections, and Config.OnFail is told so that those
// attached to it are failed rather than left waiting for completions.
func (p *Poller) Fail(err error) {
	err = fmt.Errorf("completion queue poller failed: %w", err)
	if !p.failErr.CompareAndSwap(nil, err) {
		return
	}
	if f := p.g.cfg.OnFail; f != nil {
		go f(p, err)
	}
}

// Err is why the poller failed, or nil.
func (p *Poller) Err() error { return p.failErr.Load() }

// Detach removes a handler; completions still queued for it are dropped.
func (p *Poller) Detach(tok uint32, entries int) {
	p.g.mu.Lock()
	p.reserved -= entries
	p.g.mu.Unlock()
	p.handlers.remove(tok)
}

// AddChannelUser records that a connection's user may wait on one of its
// delivery channels; RemoveChannelUser undoes it when the connection ends.
// The first makes the poller look at the CQ at once: it may be asleep
// without having armed the CQ (callers were driving it).
func (p *Poller) AddChannelUser() {
	p.chanUsers.Add(1)
	p.kicked.Store(true)
	p.file.SetReadDeadline(time.Now()) // ends a sleep in progress; kicked covers one about to start
}

func (p *Poller) RemoveChannelUser() { p.chanUsers.Add(-1) }

// CQ is the poller's completion queue, for creating QPs on it.
func (p *Poller) CQ() *verbs.CQ { return p.cq }

// CPU is the core the poller is pinned to, or -1.
func (p *Poller) CPU() int { return p.cpu }

// ThreadID is the OS thread the poller runs on (0 before it started).
func (p *Poller) ThreadID() int { return int(p.tid.Load()) }

// PinError reports why pinning failed, if it did.
func (p *Poller) PinError() error { return p.pinErr.Load() }

// Stats returns the poller's counters.
func (p *Poller) Stats() Stats {
	return Stats{Polls: p.polls.Load(), Completions: p.completions.Load(), Sleeps: p.sleeps.Load(),
		Wakeups: p.wakeups.Load(), Dropped: p.dropped.Load(), InlinePolls: p.inlinePolls.Load(),
		EmptyPolls: p.emptyPolls.Load(), Parks: p.parks.Load(), Arms: p.arms.Load()}
}

// Pollers lists the group's pollers.
func (g *Group) Pollers() []*Poller {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*Poller(nil), g.pollers...)
}

// Mode is the group's waiting mode.
func (g *Group) Mode() Mode { return g.cfg.Mode }

// Spin is the group's minimum spin budget for waiting callers.
func (g *Group) Spin() time.Duration { return g.cfg.Spin }

// pollOwned polls (up to tries times inside one cgo call) and dispatches
// what it found. The caller holds owner.
func (p *Poller) pollOwned(wcs []verbs.WC, tries int) (int, error) {
	var n int
	var err error
	if tries > 1 {
		n, err = p.cq.PollTries(wcs, tries)
	} else {
		n, err = p.cq.Poll(wcs)
	}
	if err != nil || n <= 0 {
		return 0, err
	}
	p.completions.Add(uint64(n))
	if d := p.handlers.dispatch(wcs[:n]); d > 0 {
		p.dropped.Add(uint64(d))
	}
	p.progress.Add(uint64(n))
	return n, nil
}

// arm asks for an event at the next completion. Arming twice is harmless.
func (p *Poller) arm() error {
	p.arms.Add(1)
	return p.cq.ReqNotify()
}

// release gives up ownership. If callers are parked and none is spinning
// (so nobody will poll soon), it arms the CQ and polls once more, so a
// completion that arrived before the arm still wakes them: no wake-up is
// lost between the last poll and a park. The check follows the store so
// that a waiter that registered as parked while we owned the CQ, and
// failed to take it, is seen here.
func (p *Poller) release(wcs []verbs.WC) {
	for {
		p.owner.Store(false)
		if p.parked.Load() == 0 || p.spinners.Load() > 0 || p.stop.Load() {
			return
		}
		if !p.owner.CompareAndSwap(false, true) {
			return // the new owner inherits the duty
		}
		if err := p.arm(); err != nil {
			p.owner.Store(false)
			p.Fail(err)
			return
		}
		if n, err := p.pollOwned(wcs, 0); err != nil || n == 0 {
			p.owner.Store(false)
			if err != nil {
				p.Fail(err)
			}
			return
		}
	}
}

// run is the poller goroutine: it polls what no caller is waiting for.
// While callers poll the CQ it leaves it unarmed and looks again after a
// while (see lookAgain); once callers made no poll between two looks it
// takes over: it drains the CQ, arms it, polls once more and sleeps on the
// channel. So the CQ is never unarmed without a look scheduled.
func (p *Poller) run(started chan<- struct{}) {
	defer close(p.done)
	if p.cpu >= 0 {
		// A pinned poller keeps its thread for its whole life; the thread
		// exits with the goroutine (no UnlockOSThread), so no later
		// goroutine inherits its CPU affinity.
		runtime.LockOSThread()
		var set unix.CPUSet
		set.Set(p.cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			err = fmt.Errorf("pinning poller to CPU %d: %w", p.cpu, err)
			p.pinErr.Store(err)
			p.cpu = -1
		}
	}
	p.tid.Store(int32(unix.Gettid()))
	close(started)
	rc, err := p.file.SyscallConn()
	if err != nil {
		p.Fail(err)
		return
	}
	wcs := make([]verbs.WC, 64)
	mode, idle := p.g.cfg.Mode, p.g.cfg.Idle
	var seen uint64 // callers' polls at the poller's last look
	// Made once: a closure built per sleep would be a heap allocation per sleep.
	var gerr error
	events := 0
	takeEvent := func(uintptr) bool {
		ok, err := p.ch.GetEvent()
		if err != nil {
			gerr = err
			return true
		}
		if ok {
			events++
		}
		return ok
	}
	for !p.stop.Load() {
		if mode == Busy {
			if p.owner.CompareAndSwap(false, true) {
				n, err := p.pollOwned(wcs, 64)
				p.polls.Add(1)
				p.release(wcs)
				if err != nil {
					p.Fail(err)
					return
				}
				if n > 0 {
					continue
				}
			}
			runtime.Gosched()
			continue
		}
		// Drain what is there, unless a caller is polling right now.
		if p.owner.CompareAndSwap(false, true) {
			found := 0
			for {
				n, err := p.pollOwned(wcs, 0)
				p.polls.Add(1)
				if err != nil {
					p.owner.Store(false)
					p.Fail(err)
					return
				}
				found += n
				if n < len(wcs) {
					break
				}
			}
			// Callers drive the CQ if they polled since the last look.
			now := p.inlinePolls.Load()
			driven := now != seen
			seen = now
			// While they do, what a look finds they would have found:
			// the parked callers' backstop backs off all the same.
			if driven && p.backstop > 0 {
				p.backstop = min(2*p.backstop, maxBackstop)
			} else {
				p.backstop = idle
			}
			if mode == Event || !driven {
				// Nobody drives the CQ: arm it, poll once more (a
				// completion before the arm raises no event), sleep.
				if err := p.arm(); err != nil {
					p.owner.Store(false)
					p.Fail(err)
					return
				}
				n, err := p.pollOwned(wcs, 0)
				p.polls.Add(1)
				if err != nil {
					p.owner.Store(false)
					p.Fail(err)
					return
				}
				p.owner.Store(false)
				if n > 0 {
					continue
				}
				p.sleeps.Add(1)
				p.file.SetReadDeadline(time.Time{})
			} else {
				p.release(wcs)
				p.file.SetReadDeadline(p.lookAgain(idle))
			}
		} else {
			p.file.SetReadDeadline(p.lookAgain(idle))
		}
		if p.kicked.Swap(false) {
			continue
		}
		events = 0
		werr := rc.Read(takeEvent)
		// Every event taken is counted for its acknowledgement first:
		// destroying the CQ waits until all are acknowledged.
		if events > 0 {
			p.wakeups.Add(1)
			for ; events > 0; events-- {
				p.cq.GotEvent()
			}
		}
		if p.stop.Load() {
			return // Close closed the file
		}
		if gerr != nil {
			p.Fail(gerr)
			return
		}
		if werr != nil && !errors.Is(werr, os.ErrDeadlineExceeded) {
			p.Fail(werr)
			return
		}
	}
}

// lookAgain is when the poller, while callers drive the CQ (which stays
// unarmed), looks at it again: after d if a channel consumer may depend on
// it (the callers may all go quiet, leaving a completion for the consumer
// in the CQ); while a caller is parked, after a backoff that starts at d
// and doubles up to maxBackstop (a backstop: a parked caller's completion
// raises an event on the armed CQ, and this bounds the damage should a
// wake-up ever be lost); else after maxBackstop. Never "not at all": a
// completion nobody waits for may arrive after the last caller's wait
// ended (a peer's rendezvous done answer, which gives a sent buffer back
// to the pool; a keepalive probe's failure), and the CQ is unarmed. Each
// look drains the CQ; the first that finds the callers gone arms it and
// sleeps on the channel. Not sooner: each look while callers spin is a
// thread switch taken from them, and frequent looks show in a
// ping-pong's tail latency.
func (p *Poller) lookAgain(d time.Duration) time.Time {
	switch {
	case p.chanUsers.Load() > 0:
		return time.Now().Add(d)
	case p.parked.Load() > 0:
		return time.Now().Add(max(p.backstop, d))
	}
	return time.Now().Add(maxBackstop)
}

// maxBackstop is the interval between the poller's looks while callers
// drive the CQ (the parked callers' backstop grows to it): how long a
// completion nobody waits for can stay in the CQ once they stop.
const maxBackstop = 100 * time.Millisecond

// Close stops the pollers and destroys their CQs. Every QP on them must be
// destroyed first.
func (g *Group) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	ps := g.pollers
	claims := g.claims
	g.mu.Unlock()
	var errs []error
	for _, p := range ps {
		p.stop.Store(true)
		p.file.Close() // wakes a sleeping poller
		<-p.done
		errs = append(errs, p.cq.Close(), p.ch.Close())
	}
	for _, c := range claims {
		c.release()
	}
	return errors.Join(errs...)
}
