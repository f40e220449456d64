package deadline

import (
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
)

// Tests of Deadline, the timer behind SetReadDeadline/SetWriteDeadline: a
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
	d := New()
	if d.Expired() {
		t.Fatal("a new deadline has expired")
	}
	d.Set(time.Time{})
	if d.Expired() || closesWithin(d.Wait(), 20*time.Millisecond) {
		t.Fatal("the zero time expired")
	}
}

func TestDeadlineExpires(t *testing.T) {
	d := New()
	start := time.Now()
	d.Set(start.Add(30 * time.Millisecond))
	if !closesWithin(d.Wait(), 5*time.Second) {
		t.Fatal("a deadline 30 ms away did not expire")
	}
	if el := time.Since(start); el < 30*time.Millisecond {
		t.Fatalf("expired after %v, before the deadline", el)
	}
	if !d.Expired() {
		t.Fatal("expired() false after the channel closed")
	}
}

func TestDeadlinePast(t *testing.T) {
	d := New()
	d.Set(time.Now().Add(-time.Second))
	if !d.Expired() {
		t.Fatal("a deadline in the past did not expire at once")
	}
	d.Set(time.Now().Add(-time.Second)) // again: the channel is closed only once
	if !d.Expired() {
		t.Fatal("a second past deadline un-expired it")
	}
}

// A call already blocked on wait() sees a deadline set after it started, and
// an earlier one replacing a later one (SetReadDeadline on a blocked Read).
func TestDeadlinePendingWaiter(t *testing.T) {
	d := New()
	c := d.Wait() // blocked with no deadline
	d.Set(time.Now().Add(far))
	d.Set(time.Now().Add(20 * time.Millisecond))
	if !closesWithin(c, 5*time.Second) {
		t.Fatal("a waiter that started before the deadline was set was not woken")
	}

	d = New()
	c = d.Wait()
	d.Set(time.Now().Add(-time.Second))
	if !IsClosed(c) {
		t.Fatal("a deadline set in the past did not wake a waiter at once")
	}
}

// Moving a pending deadline later or clearing it means it does not fire.
func TestDeadlineExtendAndClear(t *testing.T) {
	for _, next := range []time.Time{time.Now().Add(far), {}} {
		d := New()
		d.Set(time.Now().Add(10 * time.Millisecond))
		d.Set(next) // if 10 ms had passed already, set re-arms a fresh channel
		if closesWithin(d.Wait(), 100*time.Millisecond) || d.Expired() {
			t.Fatalf("a deadline moved to %v still fired", next)
		}
	}
}

// After expiring, a deadline can be cleared or set again: later calls block
// again (net.Conn: "a deadline can be extended ... after it has been exceeded").
func TestDeadlineReset(t *testing.T) {
	d := New()
	d.Set(time.Now().Add(-time.Second))
	old := d.Wait()
	d.Set(time.Time{})
	if d.Expired() {
		t.Fatal("clearing an expired deadline left it expired")
	}
	if !IsClosed(old) {
		t.Fatal("the channel of the expired deadline reopened")
	}
	d.Set(time.Now().Add(-time.Second))
	d.Set(time.Now().Add(far))
	if d.Expired() {
		t.Fatal("a future deadline after an expired one is expired")
	}
	d.Set(time.Now().Add(20 * time.Millisecond))
	if !closesWithin(d.Wait(), 5*time.Second) {
		t.Fatal("a re-armed deadline did not expire")
	}
	d.Set(time.Now().Add(far))
	if d.Expired() {
		t.Fatal("extending after expiry left it expired")
	}
	d.Set(time.Time{})
}

// Concurrent set, wait and expired (run with -race): setters race the
// timers firing (deadlines a few µs away hit set's "the timer already fired"
// path), waiters select on whatever channel is current. It must not deadlock,
// panic (closing a closed channel) or race, and end in a consistent state.
func TestDeadlineConcurrent(t *testing.T) {
	d := New()
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
					d.Set(time.Time{})
				case 1:
					d.Set(time.Now().Add(-time.Millisecond))
				case 2:
					d.Set(time.Now().Add(time.Duration(rng.Intn(50)) * time.Microsecond))
				case 3:
					d.Set(time.Now().Add(far))
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
				case <-d.Wait():
				case <-time.After(time.Millisecond):
				}
				d.Expired()
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

	d.Set(time.Time{})
	if d.Expired() {
		t.Fatal("cleared after the storm, but expired")
	}
	d.Set(time.Now().Add(5 * time.Millisecond))
	if !closesWithin(d.Wait(), 5*time.Second) {
		t.Fatal("set after the storm did not expire")
	}
}

// TestSetRW: each side is set only where asked.
func TestSetRW(t *testing.T) {
	rd, wr := New(), New()
	SetRW(&rd, &wr, time.Now().Add(-time.Second), true, false)
	if !rd.Expired() || wr.Expired() {
		t.Fatalf("read only: read expired %v, write expired %v; want true, false", rd.Expired(), wr.Expired())
	}
	SetRW(&rd, &wr, time.Now().Add(-time.Second), false, true)
	if !wr.Expired() {
		t.Fatal("write only: the write deadline did not expire")
	}
	SetRW(&rd, &wr, time.Time{}, true, true)
	if rd.Expired() || wr.Expired() {
		t.Fatalf("both cleared: read expired %v, write expired %v", rd.Expired(), wr.Expired())
	}
}
