//go:build linux && cgo

package rdma

import (
	"runtime"
	"testing"
	"time"
)

// The coarse clock ticks while it has users, stops with the last one
// (its goroutine ends), and starts again for the next.
func TestCoarseClock(t *testing.T) {
	g := runtime.NumGoroutine()
	for round := range 2 {
		if err := acquireCoarseClock(); err != nil {
			t.Fatal(err)
		}
		if err := acquireCoarseClock(); err != nil { // a second user shares it
			t.Fatal(err)
		}
		start := coarseNow()
		deadline := time.Now().Add(5 * time.Second)
		for coarseNow() < start+2 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the clock did not advance two ticks in 5 s (at %d)", round, coarseNow())
			}
			time.Sleep(10 * time.Millisecond)
		}
		releaseCoarseClock()
		if coarseClock.file == nil {
			t.Fatal("stopped while a user remained")
		}
		releaseCoarseClock()
		deadline = time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > g {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d goroutines after the last release, %d before", round, runtime.NumGoroutine(), g)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
