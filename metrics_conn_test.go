//go:build linux && cgo

package rdma

import (
	"testing"
)

// Host tests of metrics_conn.go's pure parts: a batch's arrived counts, the
// credit-stall transitions; and what counting costs the data path.

// TestAddArrived: a batch's counts reach the atomics once, and the batch's
// tally starts again from zero. (Which completions count is checked inside
// Soft-RoCE: TestMetrics sends stream bytes, messages and a large message
// and compares what both ends counted.)
func TestAddArrived(t *testing.T) {
	var k connCounters
	a := arrivedCounts{bytes: 1000, msgs: 3}
	k.addArrived(&a)
	if a != (arrivedCounts{}) {
		t.Fatalf("the batch's tally was not cleared: %+v", a)
	}
	k.addArrived(&a) // an empty batch adds nothing
	a = arrivedCounts{bytes: 24}
	k.addArrived(&a)
	if b, m := k.bytesReceived.Load(), k.msgsReceived.Load(); b != 1024 || m != 3 {
		t.Fatalf("%d bytes, %d messages; want 1024, 3", b, m)
	}
}

func TestCreditCheck(t *testing.T) {
	var k connCounters
	for i, step := range []struct {
		noCredit bool
		stalls   uint64
	}{
		{false, 0}, {true, 1}, {true, 1}, {true, 1}, // one stall however often a waiter looks
		{false, 1}, {false, 1}, {true, 2}, {false, 2}, {true, 3},
	} {
		k.creditCheck(step.noCredit)
		if got := k.creditStalls.Load(); got != step.stalls {
			t.Fatalf("step %d (no credit %v): %d stalls, want %d", i, step.noCredit, got, step.stalls)
		}
	}
}

// BenchmarkCountWrite is what Write adds per call for the metrics.
func BenchmarkCountWrite(b *testing.B) {
	var c connCounters
	b.ReportAllocs()
	for b.Loop() {
		c.wrote(64)
	}
}
