//go:build linux && cgo

package poller

import (
	"testing"
	"time"
)

// TestSpinBudget: the learnt budget follows the waits (smoothed mean plus
// four deviations), never drops below the configured floor or below the
// recent cost of a park (up to maxParkSpin), never exceeds maxSpin, and
// ignores waits and parks longer than maxSpin (idleness).
func TestSpinBudget(t *testing.T) {
	var s SpinBudget
	floor := 50 * time.Microsecond
	if b := s.Budget(floor); b != floor {
		t.Fatalf("fresh budget %v, want the floor %v", b, floor)
	}
	for i := 0; i < 200; i++ {
		s.Observe(100 * time.Microsecond)
	}
	if b := s.Budget(floor); b < 95*time.Microsecond || b > 110*time.Microsecond {
		t.Fatalf("steady 100 us waits: budget %v, want about 100 us", b)
	}
	for i := 0; i < 200; i++ { // jitter widens it
		s.Observe(time.Duration(50+100*(i%2)) * time.Microsecond)
	}
	if b := s.Budget(floor); b < 250*time.Microsecond {
		t.Fatalf("50/150 us waits: budget %v, want mean + 4 deviations (about 300 us)", b)
	}
	before := s.Budget(floor)
	for i := 0; i < 50; i++ {
		s.Observe(time.Second) // idle: ignored
	}
	if b := s.Budget(floor); b != before {
		t.Fatalf("idle waits moved the budget %v -> %v", before, b)
	}
	var p SpinBudget
	for i := 0; i < 50; i++ {
		p.observePark(300 * time.Microsecond)
	}
	if b := p.Budget(floor); b < 290*time.Microsecond || b > 300*time.Microsecond {
		t.Fatalf("parks of 300 us: budget %v, want about 300 us", b)
	}
	for i := 0; i < 50; i++ {
		p.observePark(1500 * time.Microsecond)
	}
	if b := p.Budget(floor); b != maxParkSpin {
		t.Fatalf("parks of 1.5 ms: budget %v, want the cap %v", b, maxParkSpin)
	}
	if b := p.Budget(5 * time.Millisecond); b != 5*time.Millisecond {
		t.Fatalf("a floor above maxSpin wins: %v", b)
	}
}
