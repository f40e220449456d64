//go:build linux && cgo

package device

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/verbs"
)

// fakePorts answers port queries with MTU, counting them per port.
type fakePorts struct {
	mu   sync.Mutex
	mtu  verbs.MTU
	err  error
	hold chan struct{} // if set, a query waits for it
	n    map[uint8]int
}

func (f *fakePorts) query(num uint8) (verbs.PortLimits, error) {
	f.mu.Lock()
	if f.n == nil {
		f.n = map[uint8]int{}
	}
	f.n[num]++
	mtu, err, hold := f.mtu, f.err, f.hold
	f.mu.Unlock()
	if hold != nil {
		<-hold
	}
	return verbs.PortLimits{ActiveMTU: mtu}, err
}

func TestPortCacheTTLAndFresh(t *testing.T) {
	f := &fakePorts{mtu: verbs.MTU1024}
	now := time.Unix(1000, 0)
	pc := PortCache{query: f.query, now: func() time.Time { return now }}
	for range 5 {
		lim, err := pc.Limits(1, false)
		if err != nil || lim.ActiveMTU != verbs.MTU1024 {
			t.Fatalf("Limits = %+v, %v", lim, err)
		}
	}
	if pc.Queries() != 1 {
		t.Fatalf("5 lookups within the TTL made %d queries, want 1", pc.Queries())
	}
	// Another port has an entry of its own.
	pc.Limits(2, false)
	if pc.Queries() != 2 {
		t.Fatalf("a second port: %d queries, want 2", pc.Queries())
	}
	// fresh asks the device even within the TTL, and the answer is cached.
	f.mtu = verbs.MTU4096
	if lim, _ := pc.Limits(1, true); lim.ActiveMTU != verbs.MTU4096 {
		t.Fatalf("fresh lookup: MTU %v, want 4096", lim.ActiveMTU)
	}
	if lim, _ := pc.Limits(1, false); lim.ActiveMTU != verbs.MTU4096 || pc.Queries() != 3 {
		t.Fatalf("after a fresh lookup: MTU %v, %d queries; want 4096 cached, 3", lim.ActiveMTU, pc.Queries())
	}
	// An entry is read again once it is portCacheTTL old.
	now = now.Add(portCacheTTL - time.Nanosecond)
	pc.Limits(1, false)
	if pc.Queries() != 3 {
		t.Fatalf("just within the TTL: %d queries, want 3", pc.Queries())
	}
	now = now.Add(time.Nanosecond)
	pc.Limits(1, false)
	if pc.Queries() != 4 {
		t.Fatalf("at the TTL: %d queries, want 4", pc.Queries())
	}
}

func TestPortCacheForgetAndErrors(t *testing.T) {
	f := &fakePorts{mtu: verbs.MTU1024}
	pc := PortCache{query: f.query}
	pc.Limits(1, false)
	pc.Forget(1)
	if _, ok := pc.Cached(1); ok {
		t.Fatal("Forget left the port cached")
	}
	pc.Limits(1, false)
	if pc.Queries() != 2 {
		t.Fatalf("after Forget: %d queries, want 2", pc.Queries())
	}
	// A failed query is returned and not cached.
	pc.Forget(1)
	f.err = errors.New("query failed")
	if _, err := pc.Limits(1, false); err == nil {
		t.Fatal("a failed query returned no error")
	}
	if _, ok := pc.Cached(1); ok {
		t.Fatal("a failed query was cached")
	}
	// Replace keeps an entry's age and changes its limits; it adds none.
	f.err = nil
	pc.Limits(1, false)
	pc.Replace(1, verbs.PortLimits{ActiveMTU: verbs.MTU256})
	if lim, _ := pc.Limits(1, false); lim.ActiveMTU != verbs.MTU256 {
		t.Fatalf("after Replace: MTU %v, want 256", lim.ActiveMTU)
	}
	pc.Replace(9, verbs.PortLimits{})
	if _, ok := pc.Cached(9); ok {
		t.Fatal("Replace added an entry")
	}
}

// A query that began before a Forget does not cache its (maybe stale)
// answer: the port event came while it ran.
func TestPortCacheForgetDuringQuery(t *testing.T) {
	f := &fakePorts{mtu: verbs.MTU1024, hold: make(chan struct{})}
	pc := PortCache{query: f.query}
	done := make(chan struct{})
	go func() {
		defer close(done)
		pc.Limits(1, false)
	}()
	for pc.Queries() == 0 {
		time.Sleep(time.Millisecond)
	}
	pc.Forget(1)
	close(f.hold)
	<-done
	if _, ok := pc.Cached(1); ok {
		t.Fatal("a query that raced a Forget cached its answer")
	}
}

func TestPortCacheConcurrent(t *testing.T) {
	f := &fakePorts{mtu: verbs.MTU1024}
	pc := PortCache{query: f.query}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 200 {
				if _, err := pc.Limits(uint8(1+i%2), j%50 == 0); err != nil {
					t.Error(err)
					return
				}
				if j%70 == 0 {
					pc.Forget(uint8(1 + i%2))
				}
			}
		}()
	}
	wg.Wait()
}
