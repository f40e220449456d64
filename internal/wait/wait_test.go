package wait

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/deadline"
)

// TestWakeup: a broadcast closes the channel every waiter took, and only
// that one: a waiter after it gets a new channel, and a broadcast with no
// waiter makes none.
func TestWakeup(t *testing.T) {
	var w Wakeup
	w.Broadcast() // nobody waits: nothing to close or make
	if w.ch != nil {
		t.Fatal("a broadcast with no waiter made a channel")
	}
	a, b := w.Wait(), w.Wait()
	if a != b {
		t.Fatal("two waiters before one broadcast got different channels")
	}
	w.Broadcast()
	for _, ch := range []<-chan struct{}{a, b} {
		select {
		case <-ch:
		default:
			t.Fatal("a waiter's channel is still open after the broadcast")
		}
	}
	c := w.Wait()
	select {
	case <-c:
		t.Fatal("a waiter after the broadcast got a closed channel")
	default:
	}
}

// TestPark: Park returns what ended the wait.
func TestPark(t *testing.T) {
	open := make(chan struct{})
	closed := make(chan struct{})
	close(closed)
	none := deadline.New()
	if err := Park(context.Background(), closed, &none, open); err != nil {
		t.Errorf("woken: %v, want nil", err)
	}
	if err := Park(context.Background(), open, &none, closed); !errors.Is(err, net.ErrClosed) {
		t.Errorf("closing: %v, want net.ErrClosed", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Park(ctx, open, &none, open); !errors.Is(err, context.Canceled) {
		t.Errorf("ctx canceled: %v, want context.Canceled", err)
	}
	d := deadline.New()
	d.Set(time.Now().Add(time.Millisecond))
	if err := Park(context.Background(), open, &d, open); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("deadline: %v, want os.ErrDeadlineExceeded", err)
	}
}
