package rdma

import (
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
)

// Tests of deadline, the timer behind SetReadDeadline/SetWriteDeadline: a
// channel that closes when the deadline passes. Timings only ever bound
// from above by a scaled wait (the Soft-RoCE guest is emulated and slow), and
// "not expired" is checked against deadlines an hour away.

const far = time.Hour

// closesWithin reports whether c closes within a scaled d.
func closesWithin(c <-chan struct{}, d time.Duration) bool {
	select {
	case <-c:
		return true
	case <-time.After(rdmatest.Scale(d)):
		return false
	}
}

func TestDeadlineNone(t *testing.T) {
	d := makeDeadline()
	if d.expired() {
		t.Fatal("a new deadline has expired")
	}
	d.set(time.Time{})
	if d.expired() || closesWithin(d.wait(), 20*time.Millisecond) {
		t.Fatal("the zero time expired")
	}
}

func TestDeadlineExpires(t *testing.T) {
	d := makeDeadline()
	start := time.Now()
	d.set(start.Add(30 * time.Millisecond))
	if !closesWithin(d.wait(), 5*time.Second) {
		t.Fatal("a deadline 30 ms away did not expire")
	}
	if el := time.Since(start); el < 30*time.Millisecond {
		t.Fatalf("expired after %v, before the deadline", el)
	}
	if !d.expired() {
		t.Fatal("expired() false after the channel closed")
	}
}

func TestDeadlinePast(t *testing.T) {
	d := makeDeadline()
	d.set(time.Now().Add(-time.Second))
	if !d.expired() {
		t.Fatal("a deadline in the past did not expire at once")
	}
	d.set(time.Now().Add(-time.Second)) // again: the channel is closed only once
	if !d.expired() {
		t.Fatal("a second past deadline un-expired it")
	}
}

// A call already blocked on wait() sees a deadline set after it started, and
// an earlier one replacing a later one (SetReadDeadline on a blocked Read).
func TestDeadlinePendingWaiter(t *testing.T) {
	d := makeDeadline()
	c := d.wait() // blocked with no deadline
	d.set(time.Now().Add(far))
	d.set(time.Now().Add(20 * time.Millisecond))
	if !closesWithin(c, 5*time.Second) {
		t.Fatal("a waiter that started before the deadline was set was not woken")
	}

	d = makeDeadline()
	c = d.wait()
	d.set(time.Now().Add(-time.Second))
	if !isClosedChan(c) {
		t.Fatal("a deadline set in the past did not wake a waiter at once")
	}
}

// Moving a pending deadline later or clearing it means it does not fire.
func TestDeadlineExtendAndClear(t *testing.T) {
	for _, next := range []time.Time{time.Now().Add(far), {}} {
		d := makeDeadline()
		d.set(time.Now().Add(10 * time.Millisecond))
		d.set(next) // if 10 ms had passed already, set re-arms a fresh channel
		if closesWithin(d.wait(), 100*time.Millisecond) || d.expired() {
			t.Fatalf("a deadline moved to %v still fired", next)
		}
	}
}

// After expiring, a deadline can be cleared or set again: later calls block
// again (net.Conn: "a deadline can be extended ... after it has been exceeded").
func TestDeadlineReset(t *testing.T) {
	d := makeDeadline()
	d.set(time.Now().Add(-time.Second))
	old := d.wait()
	d.set(time.Time{})
	if d.expired() {
		t.Fatal("clearing an expired deadline left it expired")
	}
	if !isClosedChan(old) {
		t.Fatal("the channel of the expired deadline reopened")
	}
	d.set(time.Now().Add(-time.Second))
	d.set(time.Now().Add(far))
	if d.expired() {
		t.Fatal("a future deadline after an expired one is expired")
	}
	d.set(time.Now().Add(20 * time.Millisecond))
	if !closesWithin(d.wait(), 5*time.Second) {
		t.Fatal("a re-armed deadline did not expire")
	}
	d.set(time.Now().Add(far))
	if d.expired() {
		t.Fatal("extending after expiry left it expired")
	}
	d.set(time.Time{})
}

// Concurrent set, wait and expired (run with -race): setters race the
// timers firing (deadlines a few µs away hit set's "the timer already fired"
// path), waiters select on whatever channel is current. It must not deadlock,
// panic (closing a closed channel) or race, and end in a consistent state.
func TestDeadlineConcurrent(t *testing.T) {
	d := makeDeadline()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed))
			for i := 0; i < 2000; i++ {
				switch rng.Intn(4) {
				case 0:
					d.set(time.Time{})
				case 1:
					d.set(time.Now().Add(-time.Millisecond))
				case 2:
					d.set(time.Now().Add(time.Duration(rng.Intn(50)) * time.Microsecond))
				case 3:
					d.set(time.Now().Add(far))
				}
			}
		}(int64(g))
	}
	var waiters sync.WaitGroup
	for g := 0; g < 2; g++ {
		waiters.Add(1)
		go func() {
			defer waiters.Done()
			for {
				select {
				case <-stop:
					return
				case <-d.wait():
				case <-time.After(time.Millisecond):
				}
				d.expired()
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	if !closesWithin(done, 30*time.Second) {
		t.Fatal("concurrent set calls did not finish: deadlock")
	}
	close(stop)
	waiters.Wait()

	d.set(time.Time{})
	if d.expired() {
		t.Fatal("cleared after the storm, but expired")
	}
	d.set(time.Now().Add(5 * time.Millisecond))
	if !closesWithin(d.wait(), 5*time.Second) {
		t.Fatal("set after the storm did not expire")
	}
}
