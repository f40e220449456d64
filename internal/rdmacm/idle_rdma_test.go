//go:build linux && cgo

package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
)

// TestIdleChannelReuse: a closed channel with no ids is kept and the next
// NewChannel gets it; an event the former user never read does not reach
// the next one; a listener's channel is never kept; the pool is bounded.
func TestIdleChannelReuse(t *testing.T) {
	env := rdmatest.Require(t)
	addr := netip.MustParseAddr(env.Addr)
	DrainIdleChannels()
	defer DrainIdleChannels()

	// A user that resolves an address and goes away without reading the
	// event (its id destroyed first, as every user of the library does).
	ch, err := NewChannel()
	if err != nil {
		t.Fatal(err)
	}
	cptr := ch.ch
	id, err := ch.CreateID()
	if err != nil {
		t.Fatal(err)
	}
	if err := id.ResolveAddr(netip.AddrPort{}, netip.AddrPortFrom(addr, 1), 2000); err != nil {
		t.Fatal(err)
	}
	time.Sleep(rdmatest.Scale(20 * time.Millisecond)) // let the event arrive unread
	if err := id.Destroy(); err != nil {
		t.Fatal(err)
	}
	ch.Close()
	if n := IdleChannels(); n != 1 {
		t.Fatalf("%d idle channels after closing an empty one, want 1", n)
	}
	if _, err := ch.Next(context.Background()); !errors.Is(err, ErrChannelClosed) {
		t.Fatalf("Next on the closed channel: %v, want ErrChannelClosed", err)
	}

	ch2, err := NewChannel()
	if err != nil {
		t.Fatal(err)
	}
	if ch2.ch != cptr || IdleChannels() != 0 {
		t.Fatalf("NewChannel did not reuse the idle channel (%d idle)", IdleChannels())
	}
	id2, err := ch2.CreateID()
	if err != nil {
		t.Fatal(err)
	}
	if err := id2.ResolveAddr(netip.AddrPort{}, netip.AddrPortFrom(addr, 1), 2000); err != nil {
		t.Fatal(err)
	}
	ev := next(t, ch2, EventAddrResolved)
	if ev.ID != id2 {
		t.Fatalf("the reused channel delivered an event for another id: %+v", ev)
	}
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(20*time.Millisecond))
	defer cancel()
	if ev, err := ch2.Next(ctx); err == nil {
		t.Fatalf("unexpected second event %s on the reused channel", ev.Type)
	} else if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting for no event: %v", err)
	}
	id2.Destroy()
	ch2.Close()

	// A channel that still has an id, or whose id listened, is destroyed.
	DrainIdleChannels()
	ch3, err := NewChannel()
	if err != nil {
		t.Fatal(err)
	}
	id3, err := ch3.CreateID()
	if err != nil {
		t.Fatal(err)
	}
	ch3.Close()
	id3.Destroy()
	lch, err := NewChannel()
	if err != nil {
		t.Fatal(err)
	}
	lid, err := lch.CreateID()
	if err != nil {
		t.Fatal(err)
	}
	if err := lid.BindAddr(netip.AddrPortFrom(addr, 0)); err != nil {
		t.Fatal(err)
	}
	if err := lid.Listen(4); err != nil {
		t.Fatal(err)
	}
	lid.Destroy()
	lch.Close()
	if n := IdleChannels(); n != 0 {
		t.Fatalf("%d idle channels after closing one with a live id and a listener's, want 0", n)
	}

	// Bounded.
	var chs []*Channel
	for range idleMax + 3 {
		c, err := NewChannel()
		if err != nil {
			t.Fatal(err)
		}
		chs = append(chs, c)
	}
	for _, c := range chs {
		c.Close()
	}
	if n := IdleChannels(); n != idleMax {
		t.Fatalf("%d idle channels after closing %d, want the bound %d", n, len(chs), idleMax)
	}
	DrainIdleChannels()
	if n := IdleChannels(); n != 0 {
		t.Fatalf("%d idle channels after draining", n)
	}
}

// cmFDs counts this process's descriptors open on /dev/infiniband/rdma_cm
// (two per event channel: the channel's own and its dup).
func cmFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if p, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && p == "/dev/infiniband/rdma_cm" {
			n++
		}
	}
	return n
}

// TestIdleChannelExpiry: kept channels are destroyed, their descriptors
// closed, once they have been idle for idleTTL; a channel taken from the
// pool before that is unaffected and works; no goroutine is left once the
// pool is empty.
func TestIdleChannelExpiry(t *testing.T) {
	env := rdmatest.Require(t)
	addr := netip.MustParseAddr(env.Addr)
	DrainIdleChannels()
	defer DrainIdleChannels()
	base := cmFDs(t)
	g := rdmatest.Goroutines()

	const n = 9
	var chs []*Channel
	for range n {
		c, err := NewChannel()
		if err != nil {
			t.Fatal(err)
		}
		chs = append(chs, c)
	}
	for _, c := range chs {
		c.Close()
	}
	if idl, fds := IdleChannels(), cmFDs(t); idl != n || fds != base+2*n {
		t.Fatalf("%d idle channels, %d rdma_cm descriptors over the baseline after closing %d, want %d and %d",
			idl, fds-base, n, n, 2*n)
	}
	kept := time.Now()
	// Reused before it expires.
	reused, err := NewChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer reused.Close()

	deadline := kept.Add(idleTTL + rdmatest.Scale(2*time.Second))
	for IdleChannels() != 0 || cmFDs(t) != base+2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle channels, %d rdma_cm descriptors over the baseline %v after they were kept (idle bound %v), want 0 and 2 (the reused channel's)",
				IdleChannels(), cmFDs(t)-base, time.Since(kept).Round(time.Millisecond), idleTTL)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rdmatest.WaitGoroutines(t, g)

	id, err := reused.CreateID()
	if err != nil {
		t.Fatal(err)
	}
	defer id.Destroy()
	if err := id.ResolveAddr(netip.AddrPort{}, netip.AddrPortFrom(addr, 1), 2000); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, reused, EventAddrResolved); ev.ID != id {
		t.Fatalf("the reused channel delivered an event for another id: %+v", ev)
	}
}

// TestIdleChannelLease: a channel's idle time counts from its latest
// Close, not from when it was first kept.
func TestIdleChannelLease(t *testing.T) {
	rdmatest.Require(t)
	DrainIdleChannels()
	defer DrainIdleChannels()
	ttl := rdmatest.Scale(300 * time.Millisecond)
	defer setIdleTTL(setIdleTTL(ttl))

	c, err := NewChannel()
	if err != nil {
		t.Fatal(err)
	}
	first := c.ch
	c.Close()
	time.Sleep(ttl * 6 / 10)
	if c, err = NewChannel(); err != nil {
		t.Fatal(err)
	}
	if c.ch != first {
		t.Fatalf("the kept channel was not reused %v after its Close (idle bound %v)", ttl*6/10, ttl)
	}
	c.Close()
	time.Sleep(ttl * 6 / 10)
	if n := IdleChannels(); n != 1 {
		t.Fatalf("%d idle channels %v after a reused channel's second Close (idle bound %v), want 1", n, ttl*6/10, ttl)
	}
	deadline := time.Now().Add(ttl + rdmatest.Scale(time.Second))
	for IdleChannels() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle channels past the idle bound %v", IdleChannels(), ttl)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// setIdleTTL sets how long kept channels wait for a user and returns the
// bound it replaces. The pool must be empty (DrainIdleChannels).
func setIdleTTL(d time.Duration) time.Duration {
	idle.mu.Lock()
	defer idle.mu.Unlock()
	old := idle.ttl
	idle.ttl = d
	return old
}
