//go:build linux

package coarseclock

import (
	"runtime"
	"testing"
	"time"
)

// The clock ticks while it has users, stops with the last one (its
// goroutine ends), and starts again for the next.
func TestClock(t *testing.T) {
	g := runtime.NumGoroutine()
	for round := range 2 {
		if err := Acquire(); err != nil {
			t.Fatal(err)
		}
		if err := Acquire(); err != nil { // a second user shares it
			t.Fatal(err)
		}
		start := Now()
		deadline := time.Now().Add(5 * time.Second)
		for Now() < start+2 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the clock did not advance two ticks in 5 s (at %d)", round, Now())
			}
			time.Sleep(10 * time.Millisecond)
		}
		Release()
		if clock.file == nil {
			t.Fatal("stopped while a user remained")
		}
		Release()
		deadline = time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > g {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d goroutines after the last release, %d before", round, runtime.NumGoroutine(), g)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
