// Package flow holds grpcrdma's per-stream flow control: the sender's
// outstanding bytes and the receiver's accounting of what it holds unread,
// against the receiver's stream window W.
//
// The rule both sides apply to a message of n bytes, with out the bytes
// sent and not yet returned by a WINDOW frame: it may be sent if
// out + n <= W, or if out <= W/2 (so a message larger than the window
// moves once half the window is back). A receiver therefore holds at most
// max(W, W/2 + largest message) unread per stream. The receiver returns
// consumed bytes in a WINDOW frame once they reach W/2; whatever the sender
// waits for, that many bytes come back when the application has read
// everything, so neither side waits for the other forever.
package flow

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrViolation is wrapped by the errors that mean the peer broke the rule.
var ErrViolation = errors.New("grpcrdma: flow control violated by peer")

// Send is the sending side of one stream. Its methods are safe for
// concurrent use.
type Send struct {
	mu     sync.Mutex
	window int64         // the peer's window; immutable
	out    int64         // guarded by mu
	shrunk chan struct{} // guarded by mu; closed (and replaced) when out shrinks
}

// NewSend returns a Send against a peer's window.
func NewSend(window uint32) *Send {
	return &Send{window: int64(window), shrunk: make(chan struct{})}
}

// TryAcquire takes n bytes if the rule allows it now.
func (s *Send) TryAcquire(n int) bool {
	ok, _ := s.tryAcquire(n)
	return ok
}

// tryAcquire is TryAcquire, and when it fails the channel to wait on.
func (s *Send) tryAcquire(n int) (bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out+int64(n) <= s.window || s.out <= s.window/2 {
		s.out += int64(n)
		return true, nil
	}
	return false, s.shrunk
}

// Acquire takes n bytes, waiting until the rule allows it, ctx is done or
// done is closed (then it returns ctx's error or errDone). Any number of
// goroutines may wait at once (a connection's calls): each Return wakes
// them all to try again.
func (s *Send) Acquire(ctx context.Context, done <-chan struct{}, errDone error, n int) error {
	for {
		ok, shrunk := s.tryAcquire(n)
		if ok {
			return nil
		}
		select {
		case <-shrunk:
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
			return errDone
		}
	}
}

// Return gives back inc bytes (a WINDOW frame). Returning more than is
// outstanding is a violation.
func (s *Send) Return(inc uint32) error {
	s.mu.Lock()
	if int64(inc) > s.out {
		out := s.out
		s.mu.Unlock()
		return fmt.Errorf("%w: WINDOW returns %d bytes, %d outstanding", ErrViolation, inc, out)
	}
	s.out -= int64(inc)
	close(s.shrunk)
	s.shrunk = make(chan struct{})
	s.mu.Unlock()
	return nil
}

// Outstanding returns the bytes sent and not returned.
func (s *Send) Outstanding() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out
}

// Recv is the receiving side of one stream: what the peer sent and the
// application has not read (unread), and what it read and this side has
// not yet returned (pending). Not safe for concurrent use: its owner
// (the stream) locks.
type Recv struct {
	window  int64
	unread  int64
	pending int64
}

// NewRecv returns a Recv for this side's window.
func NewRecv(window uint32) Recv { return Recv{window: int64(window)} }

// Received accounts for a message of n bytes, or reports the violation.
func (r *Recv) Received(n int) error {
	out := r.unread + r.pending
	if out+int64(n) > r.window && out > r.window/2 {
		return fmt.Errorf("%w: a message of %d bytes with %d outstanding in a window of %d", ErrViolation, n, out, r.window)
	}
	r.unread += int64(n)
	return nil
}

// Consumed accounts for n bytes the application read (or that were
// dropped) and returns the increment to send in a WINDOW frame, or 0.
func (r *Recv) Consumed(n int) uint32 {
	r.unread -= int64(n)
	r.pending += int64(n)
	if r.pending >= r.window/2 && r.pending > 0 {
		inc := r.pending
		r.pending = 0
		return uint32(inc)
	}
	return 0
}

// Unread returns the bytes received and not consumed.
func (r *Recv) Unread() int64 { return r.unread }
