//go:build linux && cgo

package rdmacm

import (
	"context"
	"errors"
	"net/netip"
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
