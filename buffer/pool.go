package buffer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Registrar registers arenas with a protection domain (implemented by the
// library over ibv_reg_mr).
type Registrar interface {
	Register(mem []byte) (Registration, error)
}

// Registration is one registered arena.
type Registration interface {
	LKey() uint32
	RKey() uint32
	Addr() uint64 // device-visible address of mem[0]
	Close() error // deregister
}

// Options configures a Pool. Every zero value is a documented default.
type Options struct {
	// Classes are the buffer sizes, ascending. nil: 256, 1 KiB, 4 KiB,
	// 16 KiB, 64 KiB, 256 KiB, 1 MiB, 4 MiB.
	Classes []int
	// SlabSize is the bytes mapped per arena; one arena serves one class
	// with SlabSize/class buffers, at least one (an arena is never smaller
	// than its class). 0: 4 MiB, a multiple of 2 MiB so huge pages fit.
	SlabSize int
	// MaxBytes caps all arenas together. 0: 1 GiB. Past it, a class that
	// needs an arena takes one back from other classes (an arena none of
	// whose buffers is handed out is deregistered and unmapped); only if
	// none is free does Get return ErrExhausted and GetWait wait.
	MaxBytes int64
	// TrackAllocations records the caller's stack on every Get, for Leaks
	// and misuse errors. It costs allocations per Get; meant for tests.
	TrackAllocations bool
	// OnIdle, if set, is called whenever a release brings the bytes in use
	// to zero (from the releasing goroutine: it must not block on it).
	OnIdle func()
}

var defaultClasses = []int{256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20}

const (
	defaultSlab     = 4 << 20
	defaultMaxBytes = 1 << 30
)

// Errors of Get and GetWait, to test with errors.Is.
var (
	// ErrExhausted: every buffer of the class is in use and the pool has
	// mapped Options.MaxBytes (rdma's Conn.Alloc: Config.PoolMaxBytes).
	// Get returns it at once; GetWait waits for a release instead.
	ErrExhausted = errors.New("buffer: pool exhausted: every buffer is in use and MaxBytes is reached (release buffers, or raise Options.MaxBytes)")
	// ErrTooLarge: the size asked for is above the largest size class
	// (MaxSize; 4 MiB by default).
	ErrTooLarge = errors.New("buffer: size exceeds the largest size class")
	// ErrClosed: the pool was closed.
	ErrClosed = errors.New("buffer: pool closed")
	// ErrNoFree: TryGet found no free buffer of the size class; Get would
	// map and register a new arena for it, which takes milliseconds (Grow
	// does that off the caller's hot path).
	ErrNoFree = errors.New("buffer: no free buffer of this size class (Get or Grow would register a new arena)")
)

type tooLargeError struct{ n, max int }

func (e *tooLargeError) Error() string {
	return fmt.Sprintf("buffer: %d bytes exceeds the largest size class %d", e.n, e.max)
}
func (e *tooLargeError) Unwrap() error { return ErrTooLarge }

// Stats is a snapshot of a pool's counters.
type Stats struct {
	Arenas         int
	PageKind       PageKind // what backs the most recent arena (meaningful once Arenas > 0)
	ArenaBytes     int64    // mapped
	InUseBytes     int64    // capacity of the buffers handed out (recyclers' included)
	HighWaterBytes int64    // the most InUseBytes has been
	Gets           uint64   // Get and GetWait calls, and TryGets that found a buffer
	Hits           uint64   // served from a free list
	Misses         uint64   // needed a new arena
	Grows          uint64   // arenas Grow mapped ahead of the Gets that need them
	Exhausted      uint64   // Gets that found the pool exhausted (a GetWait counts once)
	DoubleReleases uint64   // double releases and other uses of stale handles
	Reclaimed      uint64   // arenas given back so that another class could grow
}

// Leak is a buffer still outstanding.
type Leak struct {
	Size  int    // its capacity (size class)
	Stack string // where it was allocated; empty without TrackAllocations
}

// Pool hands out registered buffers from size classes.
type Pool struct {
	reg     Registrar
	opt     Options
	classes []*class // immutable after NewPool
	track   bool

	closed atomic.Bool

	// Counters. inUse and highWater are shared by all classes: HighWaterBytes
	// is a maximum of the total. Gets is not counted but summed (hits +
	// misses + failed), which spares the common path one atomic add.
	inUse, highWater                                atomic.Int64
	hits, misses, failed, exhausted, doubleReleases atomic.Uint64
	reclaimed, grows                                atomic.Uint64

	// Waiters park on waitCh; a release closes and replaces it when
	// waiters > 0, so the common Release pays one atomic load.
	waiters atomic.Int32
	waitMu  sync.Mutex
	waitCh  chan struct{}

	mu         sync.Mutex // slow path: new arenas, Close, Leaks, Stats' arena fields
	arenas     []arenaReg
	arenaBytes int64
	lastKind   PageKind
}

type arenaReg struct {
	a     *Arena
	reg   Registration // nil without a Registrar
	c     *class       // the class it was carved for
	chunk int          // its chunk in c's slot table
}

// class is one size class: its free list and how its arenas are carved.
type class struct {
	size      int
	arenaSize int // max(SlabSize, size)
	free      freeList
	p         *Pool
}

// NewPool makes an empty pool; arenas are mapped and registered on demand.
// reg may be nil: the memory is then unregistered, keys are 0 and Buf.Addr is
// the virtual address.
func NewPool(reg Registrar, opt Options) (*Pool, error) {
	if opt.Classes == nil {
		opt.Classes = defaultClasses
	}
	opt.Classes = append([]int(nil), opt.Classes...)
	if opt.SlabSize == 0 {
		opt.SlabSize = defaultSlab
	}
	if opt.MaxBytes == 0 {
		opt.MaxBytes = defaultMaxBytes
	}
	if len(opt.Classes) == 0 {
		return nil, errors.New("buffer: Options.Classes is empty")
	}
	if opt.SlabSize < 0 || opt.MaxBytes < 0 {
		return nil, fmt.Errorf("buffer: negative SlabSize %d or MaxBytes %d", opt.SlabSize, opt.MaxBytes)
	}
	p := &Pool{reg: reg, opt: opt, track: opt.TrackAllocations, waitCh: make(chan struct{})}
	for i, size := range opt.Classes {
		if size <= 0 || (i > 0 && size <= opt.Classes[i-1]) {
			return nil, fmt.Errorf("buffer: Options.Classes must be positive and ascending: %v", opt.Classes)
		}
		c := &class{size: size, arenaSize: max(opt.SlabSize, size), p: p}
		c.free.per = c.arenaSize / size
		// A class whose single arena does not fit would make GetWait wait forever.
		if int64(c.arenaSize) > opt.MaxBytes {
			return nil, fmt.Errorf("buffer: Options.MaxBytes %d is below one arena (%d bytes) of the %d-byte class", opt.MaxBytes, c.arenaSize, size)
		}
		// Slot indices (plus one) must fit the free list's 32-bit half word.
		if opt.MaxBytes/int64(size) >= math.MaxUint32 {
			return nil, fmt.Errorf("buffer: Options.MaxBytes %d allows more than 2^32 buffers of %d bytes", opt.MaxBytes, size)
		}
		p.classes = append(p.classes, c)
	}
	return p, nil
}

// Owns reports whether b is a live buffer of this pool: its memory is
// registered with the pool's Registrar (a buffer of another pool, even one
// on the same device, has other keys).
func (p *Pool) Owns(b Buf) bool {
	s := b.live()
	return s != nil && s.c.p == p
}

// MaxBytes is the cap on all arenas together: Options.MaxBytes, or its
// default when that was 0.
func (p *Pool) MaxBytes() int64 { return p.opt.MaxBytes }

// MaxSize is the largest buffer Get can return (the largest size class).
func (p *Pool) MaxSize() int { return p.classes[len(p.classes)-1].size }

// Get returns a buffer of the smallest class >= n with Len() == n. It never
// blocks: if every buffer of that class is in use and MaxBytes is reached it
// returns ErrExhausted.
func (p *Pool) Get(n int) (Buf, error) {
	b, err := p.get(n, true)
	if err != nil {
		if err == ErrExhausted {
			p.exhausted.Add(1)
		}
		p.failed.Add(1)
		return Buf{}, err
	}
	if p.track {
		b.s.site.Store(&allocSite{gen: b.gen, alloc: captureStack(1)})
	}
	return b, nil
}

// TryGet is Get without growing: it returns a free buffer of n's class, or
// ErrNoFree when there is none, and never maps or registers memory. Meant
// for callers that must not stall (a completion handler, code holding a
// lock others poll under): registering an arena takes milliseconds, and
// they leave it to Grow, called where a wait harms no one. A TryGet that
// finds no free buffer is not counted in Stats.
func (p *Pool) TryGet(n int) (Buf, error) {
	b, err := p.get(n, false)
	if err != nil {
		if err != ErrNoFree {
			p.failed.Add(1)
		}
		return Buf{}, err
	}
	if p.track {
		b.s.site.Store(&allocSite{gen: b.gen, alloc: captureStack(1)})
	}
	return b, nil
}

// Grow makes sure n's class has count free buffers, mapping and
// registering arenas as needed (or returning ErrExhausted when MaxBytes
// leaves no room, after taking back wholly free arenas of other classes).
// Others may take them before a later TryGet does.
func (p *Pool) Grow(n, count int) error {
	if p.closed.Load() {
		return ErrClosed
	}
	c, err := p.class(n)
	if err != nil {
		return err
	}
	held := make([]*slot, 0, count)
	defer func() {
		for _, s := range held {
			c.free.push(s)
		}
	}()
	for len(held) < count {
		s := c.free.pop()
		if s == nil {
			if s, err = p.grow(c, false); err != nil {
				return err
			}
		}
		held = append(held, s)
	}
	return nil
}

// GetWait is Get, but while the pool is exhausted it waits for a release
// (parked, not spinning), as long as ctx allows.
func (p *Pool) GetWait(ctx context.Context, n int) (Buf, error) {
	b, err := p.get(n, true)
	if err == ErrExhausted {
		p.exhausted.Add(1)
		b, err = p.wait(ctx, n)
	}
	if err != nil {
		p.failed.Add(1)
		return Buf{}, err
	}
	if p.track {
		b.s.site.Store(&allocSite{gen: b.gen, alloc: captureStack(1)})
	}
	return b, nil
}

func (p *Pool) wait(ctx context.Context, n int) (Buf, error) {
	for {
		// Register as a waiter before trying again: a release that pushed
		// before our try is seen by the try, one after it sees waiters > 0
		// and closes the channel we hold.
		p.waitMu.Lock()
		ch := p.waitCh
		p.waiters.Add(1)
		p.waitMu.Unlock()
		b, err := p.get(n, true)
		if err != ErrExhausted {
			p.waiters.Add(-1)
			return b, err
		}
		select {
		case <-ch:
			p.waiters.Add(-1)
		case <-ctx.Done():
			p.waiters.Add(-1)
			return Buf{}, fmt.Errorf("buffer: waiting for a %d-byte buffer: %w (%w)", n, ctx.Err(), ErrExhausted)
		}
	}
}

// wake releases every waiter; they retry and the losers wait again.
func (p *Pool) wake() {
	p.waitMu.Lock()
	close(p.waitCh)
	p.waitCh = make(chan struct{})
	p.waitMu.Unlock()
}

// get is the common path: pop a free slot of n's class, else grow (or,
// without mayGrow, fail with ErrNoFree).
func (p *Pool) get(n int, mayGrow bool) (Buf, error) {
	if p.closed.Load() {
		return Buf{}, ErrClosed
	}
	c, err := p.class(n)
	if err != nil {
		return Buf{}, err
	}
	s := c.free.pop()
	if s != nil {
		p.hits.Add(1)
	} else if !mayGrow {
		return Buf{}, ErrNoFree
	} else if s, err = p.grow(c, true); err != nil {
		return Buf{}, err
	}
	// A free slot has refs 0 and only Close changes its state meanwhile.
	st := s.state.Load()
	gen, refs := unpack(st)
	if refs != 0 || !s.state.CompareAndSwap(st, pack(gen, 1)) {
		return Buf{}, ErrClosed
	}
	// Close sets closed before it advances every slot's generation. If it
	// is not set yet, Close will find this slot taken and make the handle
	// stale; if it is, the arena may be unmapped already.
	if p.closed.Load() {
		return Buf{}, ErrClosed
	}
	if s.length.Load() != int64(n) { // a load is cheaper than a (locked) store
		s.length.Store(int64(n))
	}
	size := int64(len(s.mem))
	v := p.inUse.Add(size)
	for {
		h := p.highWater.Load()
		if v <= h || p.highWater.CompareAndSwap(h, v) {
			break
		}
	}
	return Buf{s, gen}, nil
}

func (p *Pool) class(n int) (*class, error) {
	if n < 0 {
		return nil, fmt.Errorf("buffer: negative size %d", n)
	}
	for _, c := range p.classes {
		if n <= c.size {
			return c, nil
		}
	}
	return nil, &tooLargeError{n, p.classes[len(p.classes)-1].size}
}

// put takes back a slot whose last reference was released (its generation
// already advanced).
func (p *Pool) put(s *slot) {
	// Before the push, so a Get of this slot cannot count it twice.
	idle := p.inUse.Add(-int64(len(s.mem))) == 0
	s.c.free.push(s)
	if p.waiters.Load() > 0 {
		p.wake()
	}
	if idle && p.opt.OnIdle != nil {
		p.opt.OnIdle()
	}
}

// grow maps, registers and carves a new arena for c and returns one of its
// slots; the rest go on c's free list. forGet says whether a Get is served
// (counted as a hit or a miss) or Grow (counted in grows).
func (p *Pool) grow(c *class, forGet bool) (*slot, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return nil, ErrClosed
	}
	// Another Get may have grown the class (or a Release refilled it) while
	// we waited for the mutex.
	if s := c.free.pop(); s != nil {
		if forGet {
			p.hits.Add(1)
		}
		return s, nil
	}
	remaining := p.opt.MaxBytes - p.arenaBytes
	if int64(c.arenaSize) > remaining {
		p.reclaimLocked(c, int64(c.arenaSize))
		if remaining = p.opt.MaxBytes - p.arenaBytes; int64(c.arenaSize) > remaining {
			return nil, ErrExhausted
		}
	}
	a, err := newArena(c.arenaSize, int(min(remaining, math.MaxInt)))
	if err != nil {
		return nil, err
	}
	mem := a.Bytes()
	ar := arenaReg{a: a}
	// Without a registration the device address is the virtual address;
	// the arena is outside the Go heap and never moves.
	base := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(mem))))
	var lkey, rkey uint32
	if p.reg != nil {
		r, err := p.reg.Register(mem)
		if err != nil {
			a.Close()
			return nil, fmt.Errorf("buffer: registering a %d-byte arena: %w", len(mem), err)
		}
		ar.reg = r
		base, lkey, rkey = r.Addr(), r.LKey(), r.RKey()
	}

	per := c.free.per
	first := len(c.free.chunks()) * per
	chunk := make([]slot, per)
	for i := range chunk {
		s := &chunk[i]
		off := i * c.size
		s.idx = uint32(first + i)
		s.mem = mem[off : off+c.size : off+c.size]
		s.addr = base + uint64(off)
		s.lkey, s.rkey = lkey, rkey
		s.c = c
		if i+1 < per {
			s.next.Store(uint32(first + i + 2)) // index+1 of the following slot
		}
	}
	c.free.grow(chunk)
	if per > 1 {
		c.free.pushChain(&chunk[1], &chunk[per-1])
	}

	ar.c, ar.chunk = c, first/per
	p.arenas = append(p.arenas, ar)
	p.arenaBytes += int64(len(mem))
	p.lastKind = a.Kind()
	if forGet {
		p.misses.Add(1)
	} else {
		p.grows.Add(1)
	}
	return &chunk[0], nil
}

// reclaimLocked gives back arenas of classes other than except, none of
// whose buffers is handed out, until need bytes fit under MaxBytes (or no
// such arena is left), so that one size class cannot starve another. A
// class's free list is drained to see which of its arenas are wholly free
// (a buffer a concurrent Get pops first, or one released meanwhile, keeps
// its arena); the rest is pushed back. A retired arena's slots stay in the
// class's table, never to be handed out again. Called with p.mu held.
func (p *Pool) reclaimLocked(except *class, need int64) {
	for _, c := range p.classes {
		if c == except || p.opt.MaxBytes-p.arenaBytes >= need {
			continue
		}
		var free []*slot
		for s := c.free.pop(); s != nil; s = c.free.pop() {
			free = append(free, s)
		}
		count := make(map[int]int)
		for _, s := range free {
			count[int(s.idx)/c.free.per]++
		}
		retired := make(map[int]bool)
		for i := 0; i < len(p.arenas) && p.opt.MaxBytes-p.arenaBytes < need; {
			ar := p.arenas[i]
			if ar.c != c || count[ar.chunk] != c.free.per {
				i++
				continue
			}
			if ar.reg != nil {
				if err := ar.reg.Close(); err != nil {
					i++ // still registered: keep it
					continue
				}
			}
			ar.a.Close()
			retired[ar.chunk] = true
			p.arenaBytes -= int64(c.arenaSize)
			p.arenas = append(p.arenas[:i], p.arenas[i+1:]...)
			p.reclaimed.Add(1)
		}
		for _, s := range free {
			if !retired[int(s.idx)/c.free.per] {
				c.free.push(s)
			}
		}
	}
}

// Stats returns a snapshot of the counters.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	st := Stats{Arenas: len(p.arenas), PageKind: p.lastKind, ArenaBytes: p.arenaBytes}
	p.mu.Unlock()
	st.InUseBytes = p.inUse.Load()
	st.HighWaterBytes = p.highWater.Load()
	st.Hits = p.hits.Load()
	st.Misses = p.misses.Load()
	st.Gets = st.Hits + st.Misses + p.failed.Load()
	st.Exhausted = p.exhausted.Load()
	st.DoubleReleases = p.doubleReleases.Load()
	st.Reclaimed = p.reclaimed.Load()
	st.Grows = p.grows.Load()
	return st
}

// Leaks lists the buffers currently outstanding (recyclers' included), with
// their allocation stacks when TrackAllocations is set.
func (p *Pool) Leaks() []Leak {
	p.mu.Lock()
	defer p.mu.Unlock()
	var leaks []Leak
	p.eachSlot(func(s *slot) {
		if gen, refs := unpack(s.state.Load()); refs > 0 {
			leaks = append(leaks, s.leak(gen))
		}
	})
	return leaks
}

func (s *slot) leak(gen uint32) Leak {
	l := Leak{Size: len(s.mem)}
	if site := s.site.Load(); site != nil && site.gen == gen {
		l.Stack = formatStack(site.alloc)
	}
	return l
}

func (p *Pool) eachSlot(f func(*slot)) {
	for _, c := range p.classes {
		for _, chunk := range c.free.chunks() {
			for i := range chunk {
				f(&chunk[i])
			}
		}
	}
}

// Close deregisters and unmaps every arena. Every handle becomes stale, and
// Get returns ErrClosed. If buffers are still outstanding it still frees
// everything, and returns an error naming how many (with the first
// allocation stacks when tracked). Close must not run concurrently with uses
// of the pool's buffers. A second Close returns nil.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Swap(true) {
		return nil
	}
	// Advance every slot's generation so outstanding handles read nil
	// instead of unmapped memory, and a racing Get's CAS fails.
	var leaks []Leak
	var leaked int64
	p.eachSlot(func(s *slot) {
		for {
			st := s.state.Load()
			gen, refs := unpack(st)
			if s.state.CompareAndSwap(st, pack(gen+1, 0)) {
				if refs > 0 {
					leaks = append(leaks, s.leak(gen))
					leaked += int64(len(s.mem))
				}
				return
			}
		}
	})
	var errs []error
	for _, ar := range p.arenas {
		if ar.reg != nil {
			if err := ar.reg.Close(); err != nil {
				errs = append(errs, fmt.Errorf("buffer: deregistering an arena: %w", err))
			}
		}
		if err := ar.a.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	p.arenas, p.arenaBytes = nil, 0
	p.inUse.Store(0)
	p.wake() // waiters retry and get ErrClosed
	if len(leaks) > 0 {
		errs = append([]error{leakError(leaks, leaked)}, errs...)
	}
	return errors.Join(errs...)
}

func leakError(leaks []Leak, bytes int64) error {
	var sb strings.Builder
	fmt.Fprintf(&sb, "buffer: pool closed with %d buffers (%d bytes) still in use; their handles are now stale", len(leaks), bytes)
	shown := 0
	for _, l := range leaks {
		if l.Stack == "" {
			continue
		}
		if shown == 3 {
			sb.WriteString("\n...")
			break
		}
		fmt.Fprintf(&sb, "\n%d-byte buffer allocated at:\n%s", l.Size, strings.TrimRight(l.Stack, "\n"))
		shown++
	}
	return errors.New(sb.String())
}
