package turnaround

// The commands are in doc.go.

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var (
	counter atomic.Uint64
	flag    atomic.Bool
	mu      sync.Mutex
	sink    uint64
	ch      = make(chan struct{}, 1)
)

//go:noinline
func call(x int) int { return x + 1 }

func BenchmarkCall(b *testing.B) {
	s := 0
	for i := 0; i < b.N; i++ {
		s = call(s)
	}
	sink = uint64(s)
}

func BenchmarkAtomicAdd(b *testing.B) {
	for i := 0; i < b.N; i++ {
		counter.Add(1)
	}
}

func BenchmarkCASAndStore(b *testing.B) {
	for i := 0; i < b.N; i++ {
		flag.CompareAndSwap(false, true)
		flag.Store(false)
	}
}

func BenchmarkMutexPair(b *testing.B) {
	for i := 0; i < b.N; i++ {
		mu.Lock()
		sink++
		mu.Unlock()
	}
}

func BenchmarkDeferredUnlock(b *testing.B) {
	for i := 0; i < b.N; i++ {
		func() {
			mu.Lock()
			defer mu.Unlock()
			sink++
		}()
	}
}

func BenchmarkChannelPoll(b *testing.B) {
	for i := 0; i < b.N; i++ {
		select {
		case <-ch:
		default:
		}
	}
}

func BenchmarkTimeNow(b *testing.B) {
	for i := 0; i < b.N; i++ {
		_ = time.Now()
	}
}

func BenchmarkGosched(b *testing.B) {
	for i := 0; i < b.N; i++ {
		runtime.Gosched()
	}
}

// BenchmarkSince is one monotonic clock read (what the stamps of
// stamps.patch cost, through runtime.nanotime).
func BenchmarkSince(b *testing.B) {
	start := time.Now()
	for i := 0; i < b.N; i++ {
		_ = time.Since(start)
	}
}
