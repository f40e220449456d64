//go:build linux && cgo

package rdma

import (
	"testing"
	"time"
)

// TestProbeBudget: a peer probing at the shortest keepalive interval never
// exhausts its budget, also when a held-up poller sees a burst of its
// probes at once; probes back to back beyond the burst do.
func TestProbeBudget(t *testing.T) {
	const burst = 8
	start := time.Unix(1000, 0)
	var b probeBudget
	now := start
	for i := range 1000 {
		if !b.take(now, burst) {
			t.Fatalf("probe %d, %v after the first, refused at the minimum interval", i, now.Sub(start))
		}
		now = now.Add(minProbeInterval)
	}
	// A poller held up for burst intervals finds burst probes at once.
	now = now.Add(burst * minProbeInterval)
	for i := range burst {
		if !b.take(now, burst) {
			t.Fatalf("probe %d of a burst of %d after a stall refused", i, burst)
		}
	}
	// Back to back: the budget is spent.
	var f probeBudget
	for i := range burst {
		if !f.take(start, burst) {
			t.Fatalf("probe %d of the first burst refused", i)
		}
	}
	if f.take(start.Add(minProbeInterval/2), burst) {
		t.Fatalf("probe %d back to back accepted", burst+1)
	}
	if !f.take(start.Add(minProbeInterval), burst) {
		t.Fatal("probe a minimum interval later refused")
	}
}
