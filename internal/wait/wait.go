// Package wait is how a blocked call of a connection or a PacketConn
// waits: Start begins driving the device's CQ with a learnt spin budget
// (spin.go), and once that is spent the call sleeps on a broadcast
// wake-up its owner closes on the next state change (Wakeup), beside the
// deadline, Close and a context (Park). Both the RC engine and the UD
// endpoint wait this way, so it lives apart from either; Wakeup and Park
// are pure Go, so their tests run anywhere.
package wait

import (
	"context"
	"net"
	"os"

	"github.com/verbline/rdma/internal/deadline"
)

// Wakeup is a broadcast wake-up for the waiters that park: a waiter takes
// its channel under its owner's lock, in the critical section that found
// its condition false, and the owner's next state change closes it. A new
// channel is made only when someone waited on the last, so a change with
// no waiter costs nothing. The zero value is ready to use.
type Wakeup struct {
	ch      chan struct{}
	waiters int
}

// Wait returns the channel the next broadcast closes. Called under the
// owner's lock.
func (w *Wakeup) Wait() <-chan struct{} {
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	w.waiters++
	return w.ch
}

// Broadcast wakes every waiter. Called under the owner's lock.
func (w *Wakeup) Broadcast() {
	if w.waiters > 0 {
		close(w.ch)
		w.ch = nil
		w.waiters = 0
	}
}

// Park sleeps until wake is closed (nil), d passes (os.ErrDeadlineExceeded),
// closing is closed (net.ErrClosed) or ctx, which may be nil, ends.
func Park(ctx context.Context, wake <-chan struct{}, d *deadline.Deadline, closing <-chan struct{}) error {
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	select {
	case <-wake:
		return nil
	case <-d.Wait():
		return os.ErrDeadlineExceeded
	case <-closing:
		return net.ErrClosed
	case <-done:
		return ctx.Err()
	}
}
