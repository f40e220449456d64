//go:build linux && cgo

package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
)

// TestNextWaits: Next, which reads the channel in its caller's goroutine,
// ends on each of the three things that can end a wait, and on nothing
// else: its context's cancellation and deadline, Close, and an event; an
// interrupt left over from an earlier wait does not end a later one.
func TestNextWaits(t *testing.T) {
	env := rdmatest.Require(t)
	addr := netip.MustParseAddr(env.Addr)
	ch, id := channelID(t)
	patience := rdmatest.Scale(10 * time.Second)

	// Cancelled while blocked.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(rdmatest.Scale(20*time.Millisecond), cancel)
	t0 := time.Now()
	if _, err := ch.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next with a cancelled context: %v", err)
	}
	if d := time.Since(t0); d > patience {
		t.Fatalf("cancellation took %v to end Next", d)
	}

	// A deadline: not before it. Compared with the context's own deadline
	// (a time taken after the context was made may be later than its
	// start by a preemption, and the wait then look short).
	wait := rdmatest.Scale(30 * time.Millisecond)
	ctx, cancel = context.WithTimeout(context.Background(), wait)
	dl, _ := ctx.Deadline()
	_, err := ch.Next(ctx)
	end := time.Now()
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || end.Before(dl) {
		t.Fatalf("Next with a %v deadline: %v, returned %v before the deadline", wait, err, dl.Sub(end))
	}

	// A stale interrupt (a cancellation's wake-up that lost the race with
	// the event it was to cut short lands in the next wait) wakes a Next
	// whose own context is live: it waits on for, and returns, the event.
	time.AfterFunc(rdmatest.Scale(10*time.Millisecond), ch.interrupt)
	time.AfterFunc(rdmatest.Scale(40*time.Millisecond), func() {
		if err := id.ResolveAddr(netip.AddrPort{}, netip.AddrPortFrom(addr, 1), 2000); err != nil {
			t.Error(err)
		}
	})
	ctx, cancel = context.WithTimeout(context.Background(), patience)
	ev, err := ch.Next(ctx)
	cancel()
	if err != nil || ev.Type != EventAddrResolved || ev.ID != id {
		t.Fatalf("Next after a stale interrupt: %+v, %v", ev, err)
	}

	// Many short waits cut by their contexts while events arrive: every
	// event is read once, by some wait, and no wait hangs.
	const n = 20
	var got int
	var wg sync.WaitGroup
	ids := make([]*ID, n)
	for i := range ids {
		if ids[i], err = ch.CreateID(); err != nil {
			t.Fatal(err)
		}
		defer ids[i].Destroy()
	}
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * time.Millisecond)
			if err := ids[i].ResolveAddr(netip.AddrPort{}, netip.AddrPortFrom(addr, 1), 2000); err != nil {
				t.Error(err)
			}
		}()
	}
	deadline := time.Now().Add(patience)
	for got < n && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+got%3)*time.Millisecond)
		ev, err := ch.Next(ctx)
		cancel()
		switch {
		case err == nil && ev.Type == EventAddrResolved:
			got++
		case err == nil:
			t.Fatalf("unexpected %s", ev.Type)
		case !errors.Is(err, context.DeadlineExceeded):
			t.Fatalf("a short wait: %v", err)
		}
	}
	wg.Wait()
	if got != n {
		t.Fatalf("%d of %d events read", got, n)
	}

	// Close wakes a blocked Next and returns after it left; Next after
	// Close fails at once. Only Next holds readMu for long, so a failed
	// TryLock says the reader is inside (the goroutine may start late on a
	// loaded host: a fixed sleep does not prove it), and a successful one
	// after Close says it has left.
	done := make(chan error, 1)
	go func() {
		_, err := ch.Next(context.Background())
		done <- err
	}()
	for start := time.Now(); ch.readMu.TryLock(); {
		ch.readMu.Unlock()
		if time.Since(start) > patience {
			t.Fatal("the reader never entered Next")
		}
		time.Sleep(time.Millisecond)
	}
	for _, i := range ids {
		i.Destroy()
	}
	id.Destroy()
	ch.Close()
	if !ch.readMu.TryLock() {
		t.Fatal("Close returned before the blocked Next left")
	}
	ch.readMu.Unlock()
	select {
	case err := <-done:
		if !errors.Is(err, ErrChannelClosed) {
			t.Fatalf("Next blocked across Close: %v", err)
		}
	case <-time.After(patience):
		t.Fatal("the blocked Next did not return after Close")
	}
	if _, err := ch.Next(context.Background()); !errors.Is(err, ErrChannelClosed) {
		t.Fatalf("Next after Close: %v", err)
	}
}
