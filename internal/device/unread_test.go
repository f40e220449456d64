package device

import (
	"sync"
	"testing"
	"time"
)

// TestUnreadBudgetBounds: charges past the bound are refused while anything
// is held, a charge larger than the bound passes alone, a connection that
// holds nothing is charged past the bound, and releases give the bytes
// back.
func TestUnreadBudgetBounds(t *testing.T) {
	u := Unread{max: 100}
	charge := func(n int64, alone bool) bool {
		ok, changed := u.TryCharge(n, alone)
		if ok != (changed == nil) {
			t.Fatalf("TryCharge(%d) = %v with a wait channel %v", n, ok, changed)
		}
		return ok
	}
	if !charge(60, false) || !charge(40, false) {
		t.Fatal("charges within the bound refused")
	}
	if charge(1, false) {
		t.Fatal("a charge past the bound passed")
	}
	if !charge(30, true) {
		t.Fatal("a connection holding nothing was refused its one message")
	}
	if got := u.InUse(); got != 130 {
		t.Fatalf("in use %d, want 130", got)
	}
	u.Release(130)
	if !charge(500, false) {
		t.Fatal("a charge larger than the bound refused with nothing held")
	}
	if charge(1, false) {
		t.Fatal("a charge passed while an oversized one is held")
	}
	u.Release(500)
	if got := u.InUse(); got != 0 {
		t.Fatalf("in use after every release: %d", got)
	}
}

// TestUnreadBudgetWaiters: a refused charge's channel closes at the next
// release, waiters that retry never let the total pass the bound, and every
// one of them is charged in the end.
func TestUnreadBudgetWaiters(t *testing.T) {
	u := Unread{max: 100}
	u.TryCharge(100, false)
	ok, changed := u.TryCharge(10, false)
	if ok {
		t.Fatal("a charge past the bound passed")
	}
	select {
	case <-changed:
		t.Fatal("the wait channel closed before any release")
	default:
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	peak := int64(0)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				for {
					ok, changed := u.TryCharge(30, false)
					if ok {
						break
					}
					select {
					case <-changed:
					case <-time.After(10 * time.Second):
						t.Error("a waiter was not woken by the releases")
						return
					}
				}
				mu.Lock()
				peak = max(peak, u.InUse())
				mu.Unlock()
				u.Release(30)
			}
		}()
	}
	u.Release(100)
	select {
	case <-changed:
	default:
		t.Fatal("a release did not close the wait channel")
	}
	wg.Wait()
	if peak > 100 {
		t.Fatalf("the budget held %d bytes, bound 100", peak)
	}
	if got := u.InUse(); got != 0 {
		t.Fatalf("in use after every release: %d", got)
	}
}
