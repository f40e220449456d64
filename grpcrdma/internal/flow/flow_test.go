package flow

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

func TestSendRule(t *testing.T) {
	s := NewSend(1000)
	if !s.TryAcquire(600) || !s.TryAcquire(400) {
		t.Fatal("a full window refused")
	}
	if s.TryAcquire(1) {
		t.Fatal("past the window")
	}
	if err := s.Return(500); err != nil {
		t.Fatal(err)
	}
	// 500 outstanding, half the window: one message of any size goes.
	if !s.TryAcquire(5000) {
		t.Fatal("an oversized message refused with half the window back")
	}
	if s.TryAcquire(1) {
		t.Fatal("a second message past the window")
	}
	if err := s.Return(6000); !errors.Is(err, ErrViolation) {
		t.Fatalf("returning more than outstanding: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := s.Acquire(ctx, nil, nil, 1); err != context.DeadlineExceeded {
		t.Fatalf("Acquire past the window: %v", err)
	}
	done := make(chan struct{})
	close(done)
	errDone := errors.New("done")
	if err := s.Acquire(context.Background(), done, errDone, 1); err != errDone {
		t.Fatalf("Acquire on an ended stream: %v", err)
	}
}

func TestRecvDetectsViolation(t *testing.T) {
	r := NewRecv(1000)
	if err := r.Received(1000); err != nil {
		t.Fatal(err)
	}
	if err := r.Received(1); !errors.Is(err, ErrViolation) {
		t.Fatalf("past the window: %v", err)
	}
	if inc := r.Consumed(400); inc != 0 {
		t.Fatalf("increment %d below half the window", inc)
	}
	if inc := r.Consumed(200); inc != 600 {
		t.Fatalf("increment %d, want 600", inc)
	}
	// 400 outstanding (<= half): a message of any size is allowed once.
	if err := r.Received(1 << 20); err != nil {
		t.Fatal(err)
	}
	if err := r.Received(1); !errors.Is(err, ErrViolation) {
		t.Fatalf("after an oversized message: %v", err)
	}
}

// TestNoDeadlockNoViolation runs a sender and a receiver that follow the
// rules, with random message sizes (some above the window) and a reader
// that takes what arrived: every message gets through and the receiver
// never sees a violation. WINDOW frames are delivered in order, late.
func TestNoDeadlockNoViolation(t *testing.T) {
	for seed := uint64(0); seed < 50; seed++ {
		r := rand.New(rand.NewPCG(seed, 1))
		const w = 1024
		s := NewSend(w)
		rv := NewRecv(w)
		var wire []int       // messages in flight to the receiver
		var windows []uint32 // WINDOW frames in flight to the sender
		var unread []int
		sent, total := 0, 2000
		next := 1 + r.IntN(3*w)
		for steps := 0; sent < total || len(wire) > 0 || len(unread) > 0; steps++ {
			if steps > 1_000_000 {
				t.Fatalf("seed %d: no progress (%d sent, %d outstanding)", seed, sent, s.Outstanding())
			}
			switch r.IntN(4) {
			case 0:
				if sent < total && s.TryAcquire(next) {
					wire = append(wire, next)
					sent++
					next = 1 + r.IntN(3*w)
				}
			case 1:
				if len(wire) > 0 {
					if err := rv.Received(wire[0]); err != nil {
						t.Fatalf("seed %d: %v", seed, err)
					}
					unread = append(unread, wire[0])
					wire = wire[1:]
				}
			case 2:
				if len(unread) > 0 {
					if inc := rv.Consumed(unread[0]); inc > 0 {
						windows = append(windows, inc)
					}
					unread = unread[1:]
				}
			case 3:
				if len(windows) > 0 {
					if err := s.Return(windows[0]); err != nil {
						t.Fatalf("seed %d: %v", seed, err)
					}
					windows = windows[1:]
				}
			}
		}
	}
}

// TestSendWakesEveryWaiter: a connection's window has many calls waiting
// at once; one WINDOW that makes room for all lets every one of them go.
func TestSendWakesEveryWaiter(t *testing.T) {
	s := NewSend(1000)
	if !s.TryAcquire(1000) || s.TryAcquire(600) {
		t.Fatal("the window's rule")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const waiters = 4
	errs := make(chan error, waiters)
	for range waiters {
		go func() { errs <- s.Acquire(ctx, nil, nil, 100) }()
	}
	time.Sleep(20 * time.Millisecond) // let them wait
	if err := s.Return(1000); err != nil {
		t.Fatal(err)
	}
	for i := range waiters {
		if err := <-errs; err != nil {
			t.Fatalf("waiter %d of %d: %v", i+1, waiters, err)
		}
	}
	if got := s.Outstanding(); got != waiters*100 {
		t.Fatalf("outstanding %d, want %d", got, waiters*100)
	}
}
