package buffer

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
)

// Buf is a value handle to one buffer of a Pool; copying it is fine (copies
// share the buffer and its reference count). The zero Buf is not valid.
// A Buf from rdma's Conn.Alloc or a received message holds one reference,
// which its holder gives up with Release (or hands to Conn.Send).
//
// The handle carries the buffer's generation: when the last reference is
// released the generation advances, so every older handle becomes stale and
// is detected without allocating (see the package documentation).
type Buf struct {
	s   *slot
	gen uint32
}

// Recycler takes back buffers whose last reference was released, instead of
// the pool (e.g. the library's receive ring, which lends its buffers to users).
type Recycler interface {
	// Recycle receives a fresh handle (reference count 1) that the recycler
	// now owns. It is called synchronously from Release and must not block.
	Recycle(b Buf)
}

// slot is one buffer's bookkeeping. It lives in the Go heap and never moves
// or goes away (until the pool is garbage), so a stale Buf can always look at
// it; the bytes themselves are in an arena.
type slot struct {
	// state packs gen<<32 | refs. Every change is a CAS that checks the
	// handle's gen, so a stale handle can neither release nor retain and the
	// count can never go below zero.
	state  atomic.Uint64
	length atomic.Int64  // Len(); atomic because a stale handle may read it while the next owner sets it
	next   atomic.Uint32 // free list link: index+1 of the next free slot, 0 = none
	idx    uint32        // index in its class's slot table

	recycler atomic.Pointer[RecyclerRef]
	site     atomic.Pointer[allocSite] // current generation's allocation (TrackAllocations)
	prev     atomic.Pointer[allocSite] // the last released generation, for misuse errors

	// Fixed when the arena is carved.
	mem        []byte // len == cap == class size
	addr       uint64
	lkey, rkey uint32
	c          *class
}

// RecyclerRef is a Recycler prepared for SetRecyclerRef: made once, it lets
// a hot path set a recycler without an allocation.
type RecyclerRef struct{ r Recycler }

// NewRecyclerRef prepares r for SetRecyclerRef.
func NewRecyclerRef(r Recycler) *RecyclerRef { return &RecyclerRef{r} }

// NewRecyclerRefs prepares n recyclers in one allocation: element i (take
// its address) is r(i). For a connection's per-slot recyclers, made at
// set-up, where one allocation each would be most of its allocations.
func NewRecyclerRefs(n int, r func(i int) Recycler) []RecyclerRef {
	refs := make([]RecyclerRef, n)
	for i := range refs {
		refs[i].r = r(i)
	}
	return refs
}

// allocSite records, for one generation of a slot, where it was allocated
// and (once released) where the last reference was dropped.
type allocSite struct {
	gen     uint32
	alloc   []uintptr
	release []uintptr
}

func pack(gen, refs uint32) uint64        { return uint64(gen)<<32 | uint64(refs) }
func unpack(st uint64) (gen, refs uint32) { return uint32(st >> 32), uint32(st) }

// live returns the slot if b is a current handle (right generation, at least
// one reference), else nil.
func (b Buf) live() *slot {
	s := b.s
	if s == nil {
		return nil
	}
	gen, refs := unpack(s.state.Load())
	if gen != b.gen || refs == 0 {
		return nil
	}
	return s
}

// Bytes returns the first Len() bytes (capacity limited to them; Full gives
// all of the buffer), or nil if the handle is stale or zero.
func (b Buf) Bytes() []byte {
	s := b.live()
	if s == nil {
		return nil
	}
	n := s.length.Load()
	return s.mem[:n:n]
}

// Full returns all Cap() bytes, or nil if the handle is stale or zero.
func (b Buf) Full() []byte {
	s := b.live()
	if s == nil {
		return nil
	}
	return s.mem
}

// Len is the buffer's length (what Get asked for, or the last SetLen); 0 if
// the handle is stale.
func (b Buf) Len() int {
	s := b.live()
	if s == nil {
		return 0
	}
	return int(s.length.Load())
}

// Cap is the buffer's size class; 0 if the handle is stale.
func (b Buf) Cap() int {
	s := b.live()
	if s == nil {
		return 0
	}
	return len(s.mem)
}

// SetLen sets Len to n, which must be in 0..Cap(). The length is shared by
// every copy of the handle.
func (b Buf) SetLen(n int) error {
	s := b.live()
	if s == nil {
		return b.misuse("SetLen")
	}
	if n < 0 || n > len(s.mem) {
		return fmt.Errorf("buffer: SetLen(%d) outside 0..%d", n, len(s.mem))
	}
	s.length.Store(int64(n))
	return nil
}

// Addr is the device-visible address of Bytes()[0]: the registration's Addr
// plus the buffer's offset in its arena. For a pool without a Registrar it is
// the buffer's virtual address. 0 if the handle is stale.
func (b Buf) Addr() uint64 {
	if s := b.live(); s != nil {
		return s.addr
	}
	return 0
}

// LKey is the local key of the buffer's arena registration (0 without a
// Registrar, or if the handle is stale).
func (b Buf) LKey() uint32 {
	if s := b.live(); s != nil {
		return s.lkey
	}
	return 0
}

// RKey is the remote key of the buffer's arena registration (0 without a
// Registrar, or if the handle is stale).
func (b Buf) RKey() uint32 {
	if s := b.live(); s != nil {
		return s.rkey
	}
	return 0
}

// Valid reports whether b is a current handle: not the zero Buf and not
// released.
func (b Buf) Valid() bool { return b.live() != nil }

// Retain adds a reference; each reference needs its own Release.
func (b Buf) Retain() error {
	s := b.s
	if s == nil {
		return errZeroBuf
	}
	for {
		st := s.state.Load()
		gen, refs := unpack(st)
		if gen != b.gen || refs == 0 {
			return b.misuse("Retain")
		}
		if refs == math.MaxUint32 {
			return errors.New("buffer: reference count overflow")
		}
		if s.state.CompareAndSwap(st, st+1) {
			return nil
		}
	}
}

// Release drops a reference. On the last one the buffer goes to its recycler
// if it has one, else back to the pool; either way every handle to it
// becomes stale.
func (b Buf) Release() error { return b.release("Release", false) }

// Free clears the recycler and releases the reference, so the buffer goes
// back to the pool on its last release. The recycler's owner uses it at
// shutdown.
func (b Buf) Free() error { return b.release("Free", true) }

// SetRecycler makes r take the buffer back on its last release instead of
// the pool (nil: back to the pool). It stays set across recycling.
func (b Buf) SetRecycler(r Recycler) error {
	s := b.live()
	if s == nil {
		return b.misuse("SetRecycler")
	}
	if r == nil {
		s.recycler.Store(nil)
	} else {
		s.recycler.Store(&RecyclerRef{r})
	}
	return nil
}

// SetRecyclerRef is SetRecycler with a prepared recycler (no allocation).
func (b Buf) SetRecyclerRef(r *RecyclerRef) error {
	s := b.live()
	if s == nil {
		return b.misuse("SetRecycler")
	}
	s.recycler.Store(r)
	return nil
}

func (b Buf) release(op string, free bool) error {
	s := b.s
	if s == nil {
		return errZeroBuf
	}
	if free {
		if b.live() == nil {
			return b.misuse(op)
		}
		s.recycler.Store(nil)
	}
	p := s.c.p
	var rel []uintptr
	for {
		st := s.state.Load()
		gen, refs := unpack(st)
		if gen != b.gen || refs == 0 {
			return b.misuse(op)
		}
		if refs > 1 {
			if s.state.CompareAndSwap(st, st-1) {
				return nil
			}
			continue
		}
		// Last reference: advance the generation.
		next := gen + 1
		if p.track {
			if rel == nil {
				rel = captureStack(2)
			}
			// Before the CAS: afterwards the slot may already be someone
			// else's. If the CAS fails, this record still names gen, which
			// only a stale handle of gen would look up.
			if cur := s.site.Load(); cur != nil && cur.gen == gen {
				s.prev.Store(&allocSite{gen: gen, alloc: cur.alloc, release: rel})
			}
		}
		if rr := s.recycler.Load(); rr != nil {
			// Ownership goes back to the recycler with one reference.
			if !s.state.CompareAndSwap(st, pack(next, 1)) {
				continue
			}
			if p.track {
				if cur := s.site.Load(); cur != nil {
					s.site.Store(&allocSite{gen: next, alloc: cur.alloc})
				}
			}
			rr.r.Recycle(Buf{s, next})
			return nil
		}
		if s.state.CompareAndSwap(st, pack(next, 0)) {
			p.put(s)
			return nil
		}
	}
}

var errZeroBuf = errors.New("buffer: zero Buf (not obtained from a Pool)")

// releasedError is the error for a double release or a use after release. It
// wraps ErrReleased.
type releasedError struct {
	op      string
	size    int
	closed  bool // the pool was closed; Close already reported the buffer
	tracked bool
	alloc   []uintptr
	release []uintptr
}

func (e *releasedError) Unwrap() error { return ErrReleased }

func (e *releasedError) Error() string {
	var sb strings.Builder
	if e.closed {
		fmt.Fprintf(&sb, "buffer: used after release: %s of a %d-byte buffer whose pool was closed", e.op, e.size)
		return sb.String()
	}
	fmt.Fprintf(&sb, "buffer: used after release: %s of a %d-byte buffer already released (double release, or a stale handle)", e.op, e.size)
	switch {
	case e.alloc != nil:
		sb.WriteString("\nallocated at:\n")
		sb.WriteString(formatStack(e.alloc))
		if e.release != nil {
			sb.WriteString("released at:\n")
			sb.WriteString(formatStack(e.release))
		}
	case e.tracked:
		sb.WriteString("; the buffer has been reused since, its allocation site is gone")
	}
	return sb.String()
}

// misuse reports a use of a stale handle: counted, and in a test binary a
// panic, so the test fails at the faulty line rather than at a later check.
// After Pool.Close every handle is stale; Close already reported those, so
// this neither counts nor panics then.
func (b Buf) misuse(op string) error {
	s := b.s
	p := s.c.p
	e := &releasedError{op: op, size: len(s.mem), tracked: p.track}
	if p.closed.Load() {
		e.closed = true
		return e
	}
	p.doubleReleases.Add(1)
	if prev := s.prev.Load(); prev != nil && prev.gen == b.gen {
		e.alloc, e.release = prev.alloc, prev.release
	}
	if testing.Testing() {
		panic(e)
	}
	return e
}

// captureStack records the caller's stack; skip counts the frames between
// captureStack's caller and the frame to start at (1 = its caller's caller).
func captureStack(skip int) []uintptr {
	var pcs [32]uintptr
	n := runtime.Callers(2+skip, pcs[:])
	out := make([]uintptr, n)
	copy(out, pcs[:n])
	return out
}

// formatStack renders pcs like a goroutine trace: function, then file:line.
func formatStack(pcs []uintptr) string {
	var sb strings.Builder
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		if f.Function != "runtime.goexit" {
			fmt.Fprintf(&sb, "%s\n\t%s:%d\n", f.Function, f.File, f.Line)
		}
		if !more {
			break
		}
	}
	return sb.String()
}
