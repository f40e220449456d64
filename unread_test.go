package rdma

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestUnreadBudgetBounds: charges past the bound are refused while anything
// is held, a charge larger than the bound passes alone, and releases give
// the bytes back.
func TestUnreadBudgetBounds(t *testing.T) {
	u := unreadBudget{max: 100}
	if !u.tryCharge(60) || !u.tryCharge(40) {
		t.Fatal("charges within the bound refused")
	}
	if u.tryCharge(1) {
		t.Fatal("a charge past the bound passed")
	}
	u.release(100)
	if !u.tryCharge(500) {
		t.Fatal("a charge larger than the bound refused with nothing held")
	}
	if u.tryCharge(1) {
		t.Fatal("a charge passed while an oversized one is held")
	}
	u.release(500)
	if got := u.inUse(); got != 0 {
		t.Fatalf("in use after every release: %d", got)
	}
}

// TestUnreadBudgetWaiters: charge waits for releases, never lets the total
// pass the bound, and ends with its context.
func TestUnreadBudgetWaiters(t *testing.T) {
	u := unreadBudget{max: 100}
	u.tryCharge(100)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := u.charge(ctx, 10); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("charge past the bound: %v, want the context's end", err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	peak := int64(0)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				if err := u.charge(context.Background(), 30); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				peak = max(peak, u.inUse())
				mu.Unlock()
				u.release(30)
			}
		}()
	}
	u.release(100)
	wg.Wait()
	if peak > 100 {
		t.Fatalf("the budget held %d bytes, bound 100", peak)
	}
	if got := u.inUse(); got != 0 {
		t.Fatalf("in use after every release: %d", got)
	}
}

// TestMaxUnreadBytesRange: a negative Config.MaxUnreadBytes fails Dial and
// Listen with a *ConfigError naming the field; 0 means 16 MiB.
func TestMaxUnreadBytesRange(t *testing.T) {
	cfg := Config{MaxUnreadBytes: -1}
	d := Dialer{Config: cfg}
	_, err := d.DialContext(context.Background(), "rdma", "169.254.0.1:7471")
	lc := ListenConfig{Config: cfg}
	ln, lerr := lc.Listen(context.Background(), "rdma", "169.254.0.1:0")
	if ln != nil {
		ln.Close()
	}
	for _, err := range []error{err, lerr} {
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != "MaxUnreadBytes" || !strings.Contains(err.Error(), "a positive number of bytes") {
			t.Errorf("%v, want a *ConfigError for MaxUnreadBytes", err)
		}
	}
	if got := (&Config{}).withDefaults().MaxUnreadBytes; got != 16<<20 {
		t.Errorf("zero MaxUnreadBytes resolves to %d, want 16 MiB", got)
	}
}
