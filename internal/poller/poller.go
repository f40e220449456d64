package poller

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/verbline/rdma/internal/verbs"
)

// Mode says how a poller waits when there is nothing to poll.
type Mode int

const (
	// Adaptive spins for Config.Spin after the last completion, then arms the
	// CQ and sleeps on the completion channel through the Go netpoller.
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
	CPUs    []int         // cores to pin to, in order; nil = chosen from the topology
	Mode    Mode          // how to wait
	Spin    time.Duration // adaptive spin budget; 0 = 50 µs
	CQSize  int           // initial entries per CQ; 0 = 4096 (grown as connections attach)
	// NoPin runs pollers as ordinary goroutines: no locked OS thread, no
	// affinity. Waking a locked thread costs a thread handoff, which
	// dominates latency when pollers sleep (adaptive/event) on shared cores.
	NoPin bool
}

// Stats counts a poller's work.
type Stats struct {
	Polls       uint64 // cgo poll calls (each may spin inside C)
	Completions uint64
	Sleeps      uint64 // times it armed the CQ and slept
	Dropped     uint64 // completions for connections that had left
	InlinePolls uint64 // polls done by callers waiting for a completion (TryPoll)
}

// Poller owns one CQ shared by the connections attached to it.
type Poller struct {
	g                                                *Group
	cq                                               *verbs.CQ
	ch                                               *verbs.CompChannel
	file                                             *os.File // dup of the channel fd, for the netpoller
	handlers                                         *table
	cpu                                              int // -1 when not pinned
	tid                                              atomic.Int32
	reserved                                         int // CQ entries promised to attached connections (g.mu)
	stop                                             atomic.Bool
	owner                                            atomic.Bool // held while polling and dispatching (the poller or a TryPoll caller)
	inline                                           []verbs.WC  // TryPoll's batch, used only by the owner
	done                                             chan struct{}
	polls, completions, sleeps, dropped, inlinePolls atomic.Uint64
	pinErr                                           atomic.Pointer[error]
}

// Group is the set of pollers of one device context.
type Group struct {
	mu      sync.Mutex
	cfg     Config
	pollers []*Poller
	closed  bool
}

// NewGroup starts cfg.Pollers pollers on ctx.
func NewGroup(ctx *verbs.Context, cfg Config) (_ *Group, err error) {
	if cfg.Spin == 0 {
		cfg.Spin = 50 * time.Microsecond
	}
	if cfg.CQSize == 0 {
		cfg.CQSize = 4096
	}
	n := cfg.Pollers
	if n <= 0 {
		n = 1
	}
	if limit := runtime.GOMAXPROCS(0) - 1; n > limit {
		n = max(1, limit)
	}
	cpus := cfg.CPUs
	if cpus == nil {
		cpus = PickCPUs(n)
	}
	g := &Group{cfg: cfg}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
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
	if p.cq, err = ctx.CreateCQ(g.cfg.CQSize, p.ch); err != nil {
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
		return nil, 0, errors.New("poller group closed")
	}
	var best *Poller
	for _, p := range g.pollers {
		if best == nil || p.handlers.count < best.handlers.count {
			best = p
		}
	}
	if need := best.reserved + entries; need > best.cq.Size {
		if err := best.cq.Resize(max(need, 2*best.cq.Size)); err != nil {
			return nil, 0, fmt.Errorf("growing the shared CQ for a new connection: %w", err)
		}
	}
	best.reserved += entries
	return best, best.handlers.add(h), nil
}

// Detach removes a handler; completions still queued for it are dropped.
func (p *Poller) Detach(tok uint32, entries int) {
	p.g.mu.Lock()
	p.reserved -= entries
	p.g.mu.Unlock()
	p.handlers.remove(tok)
}

// CQ is the poller's completion queue, for creating QPs on it.
func (p *Poller) CQ() *verbs.CQ { return p.cq }

// CPU is the core the poller is pinned to, or -1.
func (p *Poller) CPU() int { return p.cpu }

// ThreadID is the OS thread the poller runs on (0 before it started).
func (p *Poller) ThreadID() int { return int(p.tid.Load()) }

// PinError reports why pinning failed, if it did.
func (p *Poller) PinError() error {
	if e := p.pinErr.Load(); e != nil {
		return *e
	}
	return nil
}

// Stats returns the poller's counters.
func (p *Poller) Stats() Stats {
	return Stats{Polls: p.polls.Load(), Completions: p.completions.Load(), Sleeps: p.sleeps.Load(),
		Dropped: p.dropped.Load(), InlinePolls: p.inlinePolls.Load()}
}

// Pollers lists the group's pollers.
func (g *Group) Pollers() []*Poller {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*Poller(nil), g.pollers...)
}

// Mode is the group's waiting mode.
func (g *Group) Mode() Mode { return g.cfg.Mode }

func (p *Poller) run(started chan<- struct{}) {
	defer close(p.done)
	if !p.g.cfg.NoPin {
		runtime.LockOSThread() // the thread stays pinned to p.cpu for the poller's life
		defer runtime.UnlockOSThread()
	}
	p.tid.Store(int32(unix.Gettid()))
	if p.cpu >= 0 && !p.g.cfg.NoPin {
		var set unix.CPUSet
		set.Set(p.cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			err = fmt.Errorf("pinning poller to CPU %d: %w", p.cpu, err)
			p.pinErr.Store(&err)
			p.cpu = -1
		}
	}
	close(started)
	rc, err := p.file.SyscallConn()
	if err != nil {
		return
	}
	wcs := make([]verbs.WC, 64)
	mode, spin := p.g.cfg.Mode, p.g.cfg.Spin
	// Made once: a closure built per sleep would be a heap allocation per sleep.
	var gerr error
	takeEvent := func(uintptr) bool {
		ok, err := p.ch.GetEvent()
		if err != nil {
			gerr = err
			return true
		}
		return ok
	}
	for !p.stop.Load() {
		if !p.owner.CompareAndSwap(false, true) {
			runtime.Gosched() // a caller is polling inline (TryPoll); let it finish
			continue
		}
		var n int
		var err error
		switch mode {
		case Busy:
			n, err = p.cq.PollSpin(wcs, time.Millisecond)
		case Adaptive:
			n, err = p.cq.PollSpin(wcs, spin)
		default:
			n, err = p.cq.Poll(wcs)
		}
		p.polls.Add(1)
		if err != nil {
			return
		}
		if n == 0 && mode != Busy {
			// Arm, then poll once more: a completion that arrived before the
			// arm raises no event.
			if err := p.cq.ReqNotify(); err != nil {
				return
			}
			if n, err = p.cq.Poll(wcs); err != nil {
				return
			}
			if n == 0 {
				p.owner.Store(false)
				p.sleeps.Add(1)
				werr := rc.Read(takeEvent)
				if werr != nil || gerr != nil {
					return // Close closed the file
				}
				p.cq.GotEvent()
				continue
			}
		}
		if n > 0 {
			p.completions.Add(uint64(n))
			if d := p.handlers.dispatch(wcs[:n]); d > 0 {
				p.dropped.Add(uint64(d))
			}
		}
		p.owner.Store(false)
	}
}

// TryPoll polls the CQ and dispatches what it finds on the caller's
// goroutine, spinning inside C for up to spin, if nobody else is polling it
// right now (one owner at a time keeps each connection's completions in
// order). A blocked Read calls it before parking: a completion handled on
// the reader's own goroutine needs no wake-up of the poller's thread and no
// handoff back. It returns the number dispatched, or -1 if the CQ was busy.
func (p *Poller) TryPoll(spin time.Duration) int {
	if p.stop.Load() || !p.owner.CompareAndSwap(false, true) {
		return -1
	}
	defer p.owner.Store(false)
	n, err := p.cq.PollSpin(p.inline, spin)
	p.inlinePolls.Add(1)
	if err != nil || n <= 0 {
		return 0
	}
	p.completions.Add(uint64(n))
	if d := p.handlers.dispatch(p.inline[:n]); d > 0 {
		p.dropped.Add(uint64(d))
	}
	return n
}

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
	g.mu.Unlock()
	var errs []error
	for _, p := range ps {
		p.stop.Store(true)
		p.file.Close() // wakes a sleeping poller
		<-p.done
		errs = append(errs, p.cq.Close(), p.ch.Close())
	}
	return errors.Join(errs...)
}
