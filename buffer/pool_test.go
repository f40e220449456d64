package buffer_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/verbline/rdma/buffer"
)

func newPool(t testing.TB, reg buffer.Registrar, opt buffer.Options) *buffer.Pool {
	t.Helper()
	p, err := buffer.NewPool(reg, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func mustGet(t testing.TB, p *buffer.Pool, n int) buffer.Buf {
	t.Helper()
	b, err := p.Get(n)
	if err != nil {
		t.Fatalf("Get(%d): %v", n, err)
	}
	return b
}

// small is a pool of 4 KiB buffers, four per arena, at most two arenas.
func small(t testing.TB, track bool) *buffer.Pool {
	return newPool(t, nil, buffer.Options{Classes: []int{4096}, SlabSize: 16384, MaxBytes: 32768, TrackAllocations: track})
}

// mustPanic runs f, which must panic with an error wrapping ErrReleased whose
// message contains every string in want. It returns that error.
func mustPanic(t *testing.T, what string, f func() error, want ...string) error {
	t.Helper()
	var got any
	func() {
		defer func() { got = recover() }()
		err := f()
		t.Errorf("%s: returned %v instead of panicking", what, err)
	}()
	err, ok := got.(error)
	if !ok {
		t.Fatalf("%s: panicked with %T %v, want an error", what, got, got)
	}
	if !errors.Is(err, buffer.ErrReleased) {
		t.Errorf("%s: panic %q does not wrap ErrReleased", what, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: panic %q does not contain %q", what, err, w)
		}
	}
	return err
}

func TestSizeClasses(t *testing.T) {
	p := newPool(t, nil, buffer.Options{})
	for _, tc := range []struct{ n, cap int }{
		{0, 256}, {1, 256}, {256, 256}, {257, 1024}, {1024, 1024}, {1025, 4096},
		{4096, 4096}, {10000, 16384}, {65536, 65536}, {65537, 262144},
		{1 << 20, 1 << 20}, {1<<20 + 1, 4 << 20}, {4 << 20, 4 << 20},
	} {
		b := mustGet(t, p, tc.n)
		if b.Len() != tc.n || b.Cap() != tc.cap || len(b.Bytes()) != tc.n || len(b.Full()) != tc.cap || cap(b.Full()) != tc.cap {
			t.Errorf("Get(%d): Len %d Cap %d len(Bytes) %d len(Full) %d, want Len %d Cap %d",
				tc.n, b.Len(), b.Cap(), len(b.Bytes()), len(b.Full()), tc.n, tc.cap)
		}
		if err := b.Release(); err != nil {
			t.Fatal(err)
		}
	}
	_, err := p.Get(4<<20 + 1)
	if !errors.Is(err, buffer.ErrTooLarge) || err.Error() != "buffer: 4194305 bytes exceeds the largest size class 4194304" {
		t.Errorf("Get(4 MiB + 1): %v", err)
	}
	if _, err := p.Get(-1); err == nil {
		t.Error("Get(-1) succeeded")
	}
}

func TestOptionsValidation(t *testing.T) {
	for _, opt := range []buffer.Options{
		{Classes: []int{}},
		{Classes: []int{1024, 256}},
		{Classes: []int{0, 256}},
		{Classes: []int{256, 256}},
		{SlabSize: -1},
		{MaxBytes: 1 << 20}, // below one 4 MiB arena
	} {
		if p, err := buffer.NewPool(nil, opt); err == nil {
			p.Close()
			t.Errorf("NewPool(%+v) succeeded", opt)
		}
	}
	// A class larger than the slab gets an arena of its own size.
	p := newPool(t, nil, buffer.Options{Classes: []int{100, 10000}, SlabSize: 4096, MaxBytes: 1 << 20})
	b := mustGet(t, p, 9000)
	if b.Cap() != 10000 {
		t.Fatalf("Cap %d", b.Cap())
	}
	if st := p.Stats(); st.ArenaBytes != 10000 {
		t.Errorf("ArenaBytes %d, want 10000", st.ArenaBytes)
	}
	b.Release()
}

func TestDataAndLength(t *testing.T) {
	p := small(t, false)
	b := mustGet(t, p, 100)
	copy(b.Full(), strings.Repeat("x", 4096))
	copy(b.Bytes(), "hello")
	c := b // a copy of the handle is the same buffer
	if got := string(c.Bytes()[:5]); got != "hello" {
		t.Errorf("data through a copy: %q", got)
	}
	if err := b.SetLen(4096); err != nil {
		t.Fatal(err)
	}
	if c.Len() != 4096 || string(c.Bytes()[4090:]) != "xxxxxx" {
		t.Errorf("after SetLen(4096): Len %d", c.Len())
	}
	if err := b.SetLen(4097); err == nil || errors.Is(err, buffer.ErrReleased) {
		t.Errorf("SetLen(4097): %v", err)
	}
	if err := b.SetLen(-1); err == nil {
		t.Error("SetLen(-1) succeeded")
	}
	if err := b.SetLen(0); err != nil || len(b.Bytes()) != 0 || b.Bytes() == nil {
		t.Errorf("SetLen(0): %v, Bytes %v", err, b.Bytes())
	}
	if !b.Valid() || (buffer.Buf{}).Valid() {
		t.Error("Valid")
	}
	if b.Addr() == 0 {
		t.Error("Addr of unregistered memory should be its virtual address")
	}
	if b.LKey() != 0 || b.RKey() != 0 {
		t.Error("keys of unregistered memory should be 0")
	}
	b.Release()
}

func TestReuse(t *testing.T) {
	p := small(t, false)
	a := mustGet(t, p, 10)
	addr := a.Addr()
	a.Full()[0] = 42
	if err := a.Release(); err != nil {
		t.Fatal(err)
	}
	b := mustGet(t, p, 20) // LIFO: the buffer just released
	if b.Addr() != addr || b.Full()[0] != 42 {
		t.Errorf("not reused: addr %#x, want %#x", b.Addr(), addr)
	}
	b.Release()
	st := p.Stats()
	// The first Get carves an arena (a miss); the second pops a free slot.
	if st.Gets != 2 || st.Misses != 1 || st.Hits != 1 || st.Arenas != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestStaleHandle(t *testing.T) {
	p := small(t, false)
	b := mustGet(t, p, 100)
	if err := b.Release(); err != nil {
		t.Fatal(err)
	}
	if b.Bytes() != nil || b.Full() != nil || b.Valid() || b.Len() != 0 || b.Cap() != 0 || b.Addr() != 0 {
		t.Error("stale handle still exposes its buffer")
	}
	// The memory now belongs to the next Get; the stale handle stays stale.
	c := mustGet(t, p, 100)
	if b.Bytes() != nil || !c.Valid() {
		t.Error("stale handle revived by reuse")
	}
	want := []string{"used after release", "4096-byte buffer"}
	mustPanic(t, "Release", b.Release, append(want, "Release of")...)
	mustPanic(t, "Retain", b.Retain, append(want, "Retain of")...)
	mustPanic(t, "SetLen", func() error { return b.SetLen(1) }, append(want, "SetLen of")...)
	mustPanic(t, "SetRecycler", func() error { return b.SetRecycler(nil) }, want...)
	mustPanic(t, "Free", b.Free, want...)
	if !c.Valid() || c.Len() != 100 {
		t.Error("misuse of the stale handle disturbed the new owner")
	}
	if st := p.Stats(); st.DoubleReleases != 5 {
		t.Errorf("DoubleReleases %d, want 5", st.DoubleReleases)
	}
	c.Release()
}

func TestDoubleReleaseTracked(t *testing.T) {
	p := small(t, true)
	b := mustGet(t, p, 1)
	b.Release()
	err := mustPanic(t, "double Release", b.Release, "4096-byte", "allocated at:", "released at:", "TestDoubleReleaseTracked")
	t.Logf("the panic:\n%v", err)
	// Reused twice since: the allocation site is gone, the panic still comes.
	for range 2 {
		mustGet(t, p, 1).Release()
	}
	mustPanic(t, "Release after reuse", b.Release, "reused since")
}

func TestZeroBuf(t *testing.T) {
	var b buffer.Buf
	if b.Bytes() != nil || b.Len() != 0 || b.Valid() {
		t.Error("zero Buf")
	}
	// An error, not a panic: the zero Buf is not a use after release.
	for _, err := range []error{b.Release(), b.Retain(), b.Free()} {
		if err == nil || errors.Is(err, buffer.ErrReleased) {
			t.Errorf("zero Buf: %v", err)
		}
	}
}

func TestRetainRelease(t *testing.T) {
	p := small(t, false)
	b := mustGet(t, p, 1)
	for range 2 {
		if err := b.Retain(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		if !b.Valid() {
			t.Fatalf("invalid after %d of 3 releases", i)
		}
		if err := b.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if b.Valid() {
		t.Fatal("valid after the last release")
	}
	if st := p.Stats(); st.InUseBytes != 0 {
		t.Errorf("InUseBytes %d after the last release", st.InUseBytes)
	}
	mustPanic(t, "fourth Release", b.Release)
}

type ring struct{ got []buffer.Buf }

func (r *ring) Recycle(b buffer.Buf) { r.got = append(r.got, b) }

func TestRecycler(t *testing.T) {
	p := small(t, false)
	var r ring
	b := mustGet(t, p, 100)
	if err := b.SetRecycler(&r); err != nil {
		t.Fatal(err)
	}
	copy(b.Bytes(), "data")
	addr := b.Addr()
	b.Retain() // lent to a user who retains it once more
	b.Release()
	if len(r.got) != 0 {
		t.Fatal("recycled before the last release")
	}
	b.Release()
	if len(r.got) != 1 {
		t.Fatalf("Recycle called %d times", len(r.got))
	}
	nb := r.got[0]
	if b.Valid() || b.Bytes() != nil {
		t.Error("the old handle is not stale after recycling")
	}
	if !nb.Valid() || nb.Addr() != addr || string(nb.Full()[:4]) != "data" {
		t.Error("the recycled handle is not the same buffer")
	}
	mustPanic(t, "Release of the pre-recycle handle", b.Release)
	if st := p.Stats(); st.InUseBytes != 4096 {
		t.Errorf("InUseBytes %d: a recycled buffer is still in use", st.InUseBytes)
	}
	// The recycler's handle has one reference and the recycler stays set.
	nb.Release()
	if len(r.got) != 2 {
		t.Fatalf("second recycling: Recycle called %d times", len(r.got))
	}
	nb = r.got[1]
	// Free: back to the pool, not the recycler.
	if err := nb.Free(); err != nil {
		t.Fatal(err)
	}
	if len(r.got) != 2 || nb.Valid() {
		t.Error("Free recycled")
	}
	if st := p.Stats(); st.InUseBytes != 0 {
		t.Errorf("InUseBytes %d after Free", st.InUseBytes)
	}
	if c := mustGet(t, p, 1); c.Addr() != addr {
		t.Error("freed buffer not reused by the pool")
	} else {
		c.Release()
	}
}

func TestExhaustion(t *testing.T) {
	p := small(t, false) // 8 buffers at most
	var held []buffer.Buf
	for range 8 {
		held = append(held, mustGet(t, p, 4096))
	}
	if _, err := p.Get(1); !errors.Is(err, buffer.ErrExhausted) {
		t.Fatalf("Get past MaxBytes: %v", err)
	}

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err := p.GetWait(ctx, 1)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, buffer.ErrExhausted) {
		t.Fatalf("GetWait with a deadline: %v", err)
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Errorf("GetWait returned after %v, before its deadline", d)
	}

	got := make(chan error, 1)
	go func() {
		b, err := p.GetWait(context.Background(), 1)
		if err == nil {
			err = b.Release()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("GetWait returned while exhausted: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	held[3].Release()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("GetWait not woken by a Release")
	}

	st := p.Stats()
	if st.Exhausted != 3 || st.Arenas != 2 || st.ArenaBytes != 32768 {
		t.Errorf("stats %+v", st)
	}
	for i, b := range held {
		if i != 3 {
			b.Release()
		}
	}
}

func TestWaitersStress(t *testing.T) {
	// More goroutines than buffers, all using GetWait: every one must finish.
	p := small(t, false)
	var wg sync.WaitGroup
	for g := range 20 {
		wg.Go(func() {
			for i := range 200 {
				b, err := p.GetWait(context.Background(), 1+g)
				if err != nil {
					t.Error(err)
					return
				}
				binary.LittleEndian.PutUint64(b.Full(), uint64(g<<32|i))
				if i%8 == 0 {
					time.Sleep(time.Microsecond)
				}
				if v := binary.LittleEndian.Uint64(b.Full()); v != uint64(g<<32|i) {
					t.Errorf("buffer shared: wrote %#x, read %#x", g<<32|i, v)
				}
				b.Release()
			}
		})
	}
	wg.Wait()
	if st := p.Stats(); st.InUseBytes != 0 || st.HighWaterBytes > 32768 {
		t.Errorf("stats %+v", st)
	}
}

func TestStats(t *testing.T) {
	p := newPool(t, nil, buffer.Options{Classes: []int{1024, 4096}, SlabSize: 8192})
	a := mustGet(t, p, 1000)
	b := mustGet(t, p, 4000)
	c := mustGet(t, p, 4000)
	st := p.Stats()
	if st.Arenas != 2 || st.ArenaBytes != 16384 || st.InUseBytes != 9216 || st.HighWaterBytes != 9216 ||
		st.Gets != 3 || st.Misses != 2 || st.Hits != 1 || st.Exhausted != 0 || st.DoubleReleases != 0 {
		t.Errorf("stats %+v", st)
	}
	b.Release()
	c.Release()
	st = p.Stats()
	if st.InUseBytes != 1024 || st.HighWaterBytes != 9216 {
		t.Errorf("after releases: InUse %d HighWater %d", st.InUseBytes, st.HighWaterBytes)
	}
	a.Release()
	t.Logf("%+v (%v)", st, st.PageKind)
}

func TestLeaks(t *testing.T) {
	p := small(t, true)
	a := mustGet(t, p, 1)
	b, err := p.Get(2)
	if err != nil {
		t.Fatal(err)
	}
	a.Release()
	leaks := p.Leaks()
	if len(leaks) != 1 || leaks[0].Size != 4096 || !strings.Contains(leaks[0].Stack, "buffer_test.TestLeaks") ||
		!strings.Contains(leaks[0].Stack, "pool_test.go:") {
		t.Fatalf("leaks %+v", leaks)
	}
	if first := strings.SplitN(leaks[0].Stack, "\n", 2)[0]; !strings.HasSuffix(first, "buffer_test.TestLeaks") {
		t.Errorf("the stack should start at the caller of Get, starts at %q", first)
	}
	b.Release()
	if leaks := p.Leaks(); len(leaks) != 0 {
		t.Errorf("leaks after release: %+v", leaks)
	}

	// Untracked: sizes only.
	q := newPool(t, nil, buffer.Options{})
	c := mustGet(t, q, 300)
	if leaks := q.Leaks(); len(leaks) != 1 || leaks[0].Size != 1024 || leaks[0].Stack != "" {
		t.Errorf("untracked leaks %+v", leaks)
	}
	c.Release()

	// GetWait records its caller too.
	d, err := p.GetWait(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if leaks := p.Leaks(); len(leaks) != 1 || !strings.HasPrefix(leaks[0].Stack, "github.com/verbline/rdma/buffer_test.TestLeaks") {
		t.Errorf("GetWait leak %+v", leaks)
	}
	d.Release()
}

func TestClose(t *testing.T) {
	p, err := buffer.NewPool(nil, buffer.Options{Classes: []int{4096}, SlabSize: 8192, MaxBytes: 8192, TrackAllocations: true})
	if err != nil {
		t.Fatal(err)
	}
	a := mustGet(t, p, 1)
	b := mustGet(t, p, 1)
	waiting := make(chan error, 1)
	go func() {
		_, err := p.GetWait(context.Background(), 1) // waits, then takes a
		waiting <- err
	}()
	time.Sleep(20 * time.Millisecond)
	a.Release()
	if err := <-waiting; err != nil {
		t.Fatal(err)
	}
	err = p.Close()
	if err == nil || !strings.Contains(err.Error(), "2 buffers (8192 bytes) still in use") ||
		!strings.Contains(err.Error(), "TestClose.func1") || !strings.Contains(err.Error(), "TestClose\n") {
		t.Errorf("Close with outstanding buffers: %v", err)
	}
	t.Logf("Close: %v", err)
	if b.Valid() || b.Bytes() != nil {
		t.Error("a handle survived Close")
	}
	// After Close: an error, no panic (Close already reported the buffer).
	if err := b.Release(); !errors.Is(err, buffer.ErrReleased) || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Release after Close: %v", err)
	}
	if _, err := p.Get(1); !errors.Is(err, buffer.ErrClosed) {
		t.Errorf("Get after Close: %v", err)
	}
	if _, err := p.GetWait(context.Background(), 1); !errors.Is(err, buffer.ErrClosed) {
		t.Errorf("GetWait after Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if st := p.Stats(); st.Arenas != 0 || st.ArenaBytes != 0 || st.InUseBytes != 0 {
		t.Errorf("stats after Close %+v", st)
	}
}

func TestCloseWakesWaiters(t *testing.T) {
	p, err := buffer.NewPool(nil, buffer.Options{Classes: []int{4096}, SlabSize: 4096, MaxBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	mustGet(t, p, 1)
	waiting := make(chan error, 1)
	go func() {
		_, err := p.GetWait(context.Background(), 1)
		waiting <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := p.Close(); err == nil {
		t.Error("Close should report the outstanding buffer")
	}
	select {
	case err := <-waiting:
		if !errors.Is(err, buffer.ErrClosed) {
			t.Errorf("waiter: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not wake the waiter")
	}
}

type fakeReg struct {
	mu   sync.Mutex
	regs []*fakeMR
	fail error
}

type fakeMR struct {
	mem    []byte
	n      uint32
	closed int
}

func (r *fakeReg) Register(mem []byte) (buffer.Registration, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return nil, r.fail
	}
	mr := &fakeMR{mem: mem, n: uint32(len(r.regs) + 1)}
	r.regs = append(r.regs, mr)
	return mr, nil
}

func (m *fakeMR) LKey() uint32 { return 0x100 + m.n }
func (m *fakeMR) RKey() uint32 { return 0x200 + m.n }
func (m *fakeMR) Addr() uint64 { return uint64(m.n) << 40 }
func (m *fakeMR) Close() error { m.closed++; return nil }

func TestRegistrar(t *testing.T) {
	reg := &fakeReg{}
	p, err := buffer.NewPool(reg, buffer.Options{Classes: []int{1024, 4096}, SlabSize: 8192})
	if err != nil {
		t.Fatal(err)
	}
	var bufs []buffer.Buf
	for range 3 { // one 4096 arena holds two: two arenas
		bufs = append(bufs, mustGet(t, p, 4096))
	}
	for range 8 { // one 1024 arena holds all eight
		bufs = append(bufs, mustGet(t, p, 1024))
	}
	if len(reg.regs) != 3 {
		t.Fatalf("%d registrations for 3 arenas", len(reg.regs))
	}
	for _, mr := range reg.regs {
		if len(mr.mem) != 8192 {
			t.Errorf("registered %d bytes, want the whole 8192-byte arena", len(mr.mem))
		}
	}
	seen := map[uint64]bool{}
	for _, b := range bufs {
		var mr *fakeMR
		for _, m := range reg.regs {
			if b.LKey() == m.LKey() {
				mr = m
			}
		}
		if mr == nil || b.RKey() != mr.RKey() {
			t.Fatalf("keys %#x/%#x match no registration", b.LKey(), b.RKey())
		}
		// Addr = registration Addr + offset of the buffer in the arena.
		off := b.Addr() - mr.Addr()
		if off >= 8192 || off%uint64(b.Cap()) != 0 || &mr.mem[off] != &b.Full()[0] {
			t.Errorf("Addr %#x is not registration %#x + the buffer's offset", b.Addr(), mr.Addr())
		}
		if seen[b.Addr()] {
			t.Errorf("address %#x handed out twice", b.Addr())
		}
		seen[b.Addr()] = true
		b.Release()
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for i, mr := range reg.regs {
		if mr.closed != 1 {
			t.Errorf("registration %d closed %d times", i, mr.closed)
		}
	}

	// A failing Register fails the Get and leaves nothing behind.
	reg = &fakeReg{fail: errors.New("ibv_reg_mr: Cannot allocate memory")}
	p = newPool(t, reg, buffer.Options{Classes: []int{4096}, SlabSize: 8192})
	if _, err := p.Get(1); err == nil || !strings.Contains(err.Error(), "Cannot allocate memory") {
		t.Errorf("Get with a failing Registrar: %v", err)
	}
	if st := p.Stats(); st.Arenas != 0 || st.ArenaBytes != 0 {
		t.Errorf("stats after a failed registration %+v", st)
	}
}

func TestConcurrent(t *testing.T) {
	p := newPool(t, &fakeReg{}, buffer.Options{Classes: []int{64, 512, 4096}, SlabSize: 16384})
	const goroutines, rounds = 16, 3000
	var wg sync.WaitGroup
	var bad atomic.Int32
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			var held []buffer.Buf
			for i := range rounds {
				b, err := p.Get(1 + rng.IntN(4096))
				if err != nil {
					t.Error(err)
					return
				}
				// Stamp the whole buffer's ends with who holds it now.
				full := b.Full()
				id := uint64(g)<<32 | uint64(i)
				binary.LittleEndian.PutUint64(full, id)
				binary.LittleEndian.PutUint64(full[len(full)-8:], id)
				if rng.IntN(2) == 0 {
					b.Retain()
					held = append(held, b)
				}
				held = append(held, b)
				if len(held) > 8 || i == rounds-1 {
					for _, h := range held {
						f := h.Full()
						if f == nil {
							bad.Add(1) // released too early
							continue
						}
						if binary.LittleEndian.Uint64(f) != binary.LittleEndian.Uint64(f[len(f)-8:]) ||
							binary.LittleEndian.Uint64(f)>>32 != uint64(g) {
							bad.Add(1)
						}
						if err := h.Release(); err != nil {
							t.Error(err)
						}
					}
					held = held[:0]
				}
			}
		})
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Errorf("%d buffers were handed to two holders at once", bad.Load())
	}
	st := p.Stats()
	if st.InUseBytes != 0 || st.Gets != goroutines*rounds || st.Hits+st.Misses != st.Gets || st.DoubleReleases != 0 {
		t.Errorf("stats %+v", st)
	}
	if leaks := p.Leaks(); len(leaks) != 0 {
		t.Errorf("%d leaks", len(leaks))
	}
	t.Logf("%+v", st)
}

func TestNoAllocations(t *testing.T) {
	if testing.Short() {
		t.Skip("AllocsPerRun")
	}
	p := newPool(t, &fakeReg{}, buffer.Options{})
	mustGet(t, p, 1000).Release() // the arena
	if n := testing.AllocsPerRun(1000, func() {
		b, err := p.Get(1000)
		if err != nil {
			panic(err)
		}
		b.Full()[0] = 1
		b.Retain()
		b.Release()
		b.Release()
	}); n != 0 {
		t.Errorf("Get+Retain+Release: %v allocations per run", n)
	}
	// The recycling path allocates nothing either.
	b := mustGet(t, p, 1000)
	cur := &b
	rec := recyclerFunc(func(nb buffer.Buf) { *cur = nb })
	b.SetRecycler(rec)
	if n := testing.AllocsPerRun(1000, func() { cur.Release() }); n != 0 {
		t.Errorf("recycling Release: %v allocations per run", n)
	}
	cur.Free()
}

type recyclerFunc func(buffer.Buf)

func (f recyclerFunc) Recycle(b buffer.Buf) { f(b) }

func readInt(path string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return n, err == nil
}

func TestPageKind(t *testing.T) {
	// Read before the pool takes any pages.
	nr, _ := readInt("/proc/sys/vm/nr_hugepages")
	free, _ := readInt("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
	thp, _ := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	p := newPool(t, nil, buffer.Options{}) // 4 MiB arenas
	b := mustGet(t, p, 1)
	defer b.Release()
	kind := p.Stats().PageKind
	t.Logf("arena backed by %v (vm.nr_hugepages %d, free 2 MiB pages %d, THP %q)", kind, nr, free, strings.TrimSpace(string(thp)))
	switch {
	case nr > 0 && free >= 2:
		// Pages are reserved and free: the arena must have got them. (With
		// nr_hugepages > 0 but too few free, the fallback is correct too.)
		if kind != buffer.PagesHugeTLB2M {
			t.Errorf("2 MiB pages were free but the arena is %v", kind)
		}
	case kind == buffer.PagesHugeTLB2M && free == 0:
		t.Errorf("hugetlb reported without free 2 MiB pages")
	}
	if kind != buffer.Pages4K && b.Addr()%(2<<20) != 0 {
		// Arenas with huge pages start on a 2 MiB boundary (the first
		// buffer is at offset 0; without a Registrar Addr is virtual).
		t.Errorf("huge page arena at %#x, not 2 MiB aligned", b.Addr())
	}
}

func TestNewArena(t *testing.T) {
	for _, size := range []int{4096, 100000, 2 << 20, 5 << 20} {
		a, err := buffer.NewArena(size)
		if err != nil {
			t.Fatal(err)
		}
		mem := a.Bytes()
		if len(mem) < size {
			t.Fatalf("NewArena(%d): %d bytes", size, len(mem))
		}
		mem[0], mem[size-1] = 1, 2
		t.Logf("NewArena(%d): %d bytes of %v", size, len(mem), a.Kind())
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if err := a.Close(); err != nil || a.Bytes() != nil {
			t.Fatalf("second Close: %v", err)
		}
	}
	if _, err := buffer.NewArena(0); err == nil {
		t.Error("NewArena(0) succeeded")
	}
}

func BenchmarkGetRelease(b *testing.B) {
	for _, size := range []int{256, 4096, 65536} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			p := newPool(b, nil, buffer.Options{})
			mustGet(b, p, size).Release()
			b.ReportAllocs()
			for b.Loop() {
				buf, err := p.Get(size)
				if err != nil {
					b.Fatal(err)
				}
				buf.Release()
			}
		})
	}
}

func BenchmarkGetReleaseParallel(b *testing.B) {
	p := newPool(b, nil, buffer.Options{})
	mustGet(b, p, 4096).Release()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			buf, err := p.Get(4096)
			if err != nil {
				b.Error(err)
				return
			}
			buf.Full()[0] = 1
			buf.Release()
		}
	})
}

// A class that needs an arena when the pool is at MaxBytes takes back an
// arena of another class none of whose buffers is handed out (deregistered
// and unmapped), so a burst of one size cannot starve the others; an arena
// with a buffer out is never taken, and its handles stay valid.
func TestReclaimAcrossClasses(t *testing.T) {
	reg := &fakeReg{}
	p := newPool(t, reg, buffer.Options{Classes: []int{1024, 16384}, SlabSize: 16384, MaxBytes: 32768})
	// Fill both arenas' worth with 1 KiB buffers: 2 arenas of 16.
	var small []buffer.Buf
	for range 32 {
		b, err := p.Get(1000)
		if err != nil {
			t.Fatal(err)
		}
		small = append(small, b)
	}
	if _, err := p.Get(16000); !errors.Is(err, buffer.ErrExhausted) {
		t.Fatalf("with every small buffer out: %v, want ErrExhausted", err)
	}
	// Release the first arena's buffers only, and one of the second's.
	kept := small[16:]
	for _, b := range small[:16] {
		b.Release()
	}
	// The first arena's buffers went back, but which arena each belongs to
	// is the pool's business: hold the rest and ask for a large one.
	big, err := p.Get(16000)
	if err != nil {
		t.Fatalf("after freeing an arena's worth: %v, want a buffer from a reclaimed arena", err)
	}
	st := p.Stats()
	if st.Reclaimed != 1 || st.ArenaBytes != 32768 || st.Arenas != 2 {
		t.Errorf("stats %+v, want one arena reclaimed, two mapped", st)
	}
	closed := 0
	for _, mr := range reg.regs {
		closed += mr.closed
	}
	if closed != 1 {
		t.Errorf("%d registrations closed, want the reclaimed arena's", closed)
	}
	// The buffers still out are intact and usable.
	for i, b := range kept {
		if b.Bytes() == nil {
			t.Fatalf("kept buffer %d went stale", i)
		}
		b.Bytes()[0] = byte(i)
	}
	big.Bytes()[15999] = 1
	// Nothing else can be taken while every remaining arena has a buffer out.
	kept[0].Release()
	if _, err := p.Get(16000); !errors.Is(err, buffer.ErrExhausted) {
		t.Fatalf("with a buffer out in every arena: %v, want ErrExhausted", err)
	}
	// Small buffers still come from the arena they share.
	b, err := p.Get(1000)
	if err != nil {
		t.Fatal(err)
	}
	b.Release()
	for _, b := range kept[1:] {
		b.Release()
	}
	big.Release()
}

// Reclaiming races with Gets and Releases of the class it drains: nothing
// is lost or handed out twice.
func TestReclaimConcurrent(t *testing.T) {
	p := newPool(t, nil, buffer.Options{Classes: []int{1024, 16384}, SlabSize: 16384, MaxBytes: 65536})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			size := 1000
			if g%2 == 1 {
				size = 16000
			}
			for {
				select {
				case <-stop:
					return
				default:
				}
				var held []buffer.Buf
				for range 8 {
					b, err := p.Get(size)
					if err != nil {
						break
					}
					b.Bytes()[0] = byte(g)
					held = append(held, b)
				}
				for _, b := range held {
					if b.Bytes()[0] != byte(g) {
						t.Error("a buffer was handed out twice")
					}
					b.Release()
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if st := p.Stats(); st.InUseBytes != 0 || st.ArenaBytes > 65536 {
		t.Errorf("stats after the race: %+v", st)
	}
	t.Logf("reclaimed %d arenas", p.Stats().Reclaimed)
}

func TestPoolOwns(t *testing.T) {
	p1, err := buffer.NewPool(nil, buffer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Close()
	p2, err := buffer.NewPool(nil, buffer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	b, err := p1.Get(100)
	if err != nil {
		t.Fatal(err)
	}
	if !p1.Owns(b) || p2.Owns(b) {
		t.Fatalf("Owns: p1 %v, p2 %v; want true, false", p1.Owns(b), p2.Owns(b))
	}
	b.Release()
	if p1.Owns(b) {
		t.Fatal("p1 owns a released handle")
	}
	if p1.Owns(buffer.Buf{}) {
		t.Fatal("p1 owns the zero Buf")
	}
}

// TryGet never registers: with no free buffer it returns ErrNoFree and the
// registrar is not called; Grow registers arenas ahead until the class has
// the free buffers asked for, which TryGet then serves.
func TestTryGetAndGrow(t *testing.T) {
	reg := &fakeReg{}
	p := newPool(t, reg, buffer.Options{Classes: []int{1024, 4096}, SlabSize: 8192, MaxBytes: 16384})
	regs := func() int { reg.mu.Lock(); defer reg.mu.Unlock(); return len(reg.regs) }
	if _, err := p.TryGet(4000); !errors.Is(err, buffer.ErrNoFree) {
		t.Fatalf("TryGet on an empty pool: %v, want ErrNoFree", err)
	}
	if n := regs(); n != 0 {
		t.Fatalf("TryGet registered %d arenas", n)
	}
	if err := p.Grow(4000, 1); err != nil {
		t.Fatal(err)
	}
	if err := p.Grow(4000, 2); err != nil { // the arena holds two: nothing to do
		t.Fatal(err)
	}
	if n := regs(); n != 1 {
		t.Fatalf("two Grows registered %d arenas, want 1", n)
	}
	a, err := p.TryGet(4000)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.TryGet(4096)
	if err != nil {
		t.Fatal(err)
	}
	if a.Len() != 4000 || b.Len() != 4096 || a.LKey() != 0x101 || b.LKey() != 0x101 {
		t.Errorf("buffers from the grown arena: len %d/%d lkey %#x/%#x", a.Len(), b.Len(), a.LKey(), b.LKey())
	}
	if _, err := p.TryGet(4000); !errors.Is(err, buffer.ErrNoFree) {
		t.Fatalf("TryGet with the arena taken: %v, want ErrNoFree", err)
	}
	st := p.Stats()
	if st.Grows != 1 || st.Misses != 0 || st.Hits != 2 || st.Gets != 2 || st.Arenas != 1 {
		t.Errorf("stats %+v: want 1 grow, 2 hits, 2 gets", st)
	}
	if err := p.Grow(4000, 2); err != nil { // the second arena fits under MaxBytes
		t.Fatal(err)
	}
	if n := regs(); n != 2 {
		t.Fatalf("%d arenas registered, want 2", n)
	}
	c, err := p.TryGet(4000) // keeps the second arena from being reclaimed
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Grow(100, 1); err != nil { // the 1024 class: nothing left under MaxBytes, no arena wholly free
		if !errors.Is(err, buffer.ErrExhausted) {
			t.Fatalf("Grow past MaxBytes: %v, want ErrExhausted", err)
		}
	} else {
		t.Fatal("Grow past MaxBytes succeeded")
	}
	if err := p.Grow(4000, 3); !errors.Is(err, buffer.ErrExhausted) {
		t.Errorf("Grow of more than MaxBytes holds: %v, want ErrExhausted", err)
	}
	if err := p.Grow(1<<20, 1); !errors.Is(err, buffer.ErrTooLarge) {
		t.Errorf("Grow above the largest class: %v, want ErrTooLarge", err)
	}
	a.Release()
	b.Release()
	c.Release()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Grow(4000, 1); !errors.Is(err, buffer.ErrClosed) {
		t.Errorf("Grow after Close: %v, want ErrClosed", err)
	}
	if _, err := p.TryGet(4000); !errors.Is(err, buffer.ErrClosed) {
		t.Errorf("TryGet after Close: %v, want ErrClosed", err)
	}
}

// MaxBytes is the cap the pool enforces: the Options' value, or 1 GiB when
// that was 0.
func TestPoolMaxBytes(t *testing.T) {
	for _, c := range []struct{ opt, want int64 }{{0, 1 << 30}, {1 << 20, 1 << 20}} {
		p := newPool(t, nil, buffer.Options{Classes: []int{4096}, SlabSize: 8192, MaxBytes: c.opt})
		if got := p.MaxBytes(); got != c.want {
			t.Errorf("Options.MaxBytes %d: MaxBytes() %d, want %d", c.opt, got, c.want)
		}
	}
}
