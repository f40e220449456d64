//go:build linux && cgo

package rdma

import (
	"context"
	"net"
	"time"

	"github.com/verbline/rdma/internal/deadline"
	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/wait"
)

// How a blocked call waits: it drives the device's shared CQ itself
// (poller.Waiter: polls, watches others' progress, spends a spin budget
// learnt from its recent waits), then parks on its wake-up channel once the
// CQ is armed. The three forms differ in what they park on: Read and Write
// have a capacity-1 signal channel each (one waiter at most, held by
// readMu / writeMu), the others the connection's broadcast channel
// (wait.Wakeup, which PacketConn's endpoint shares).

// spinWait drives the connection's CQ for a caller whose condition does not
// hold yet (see poller.Waiter): it starts the wait on first use and reports
// whether the caller should check its condition again (true) or sleep on
// its wake-up channel (false: the waiter is registered as parked and the
// CQ armed, so the completion it waits for wakes the poller's goroutine,
// which dispatches it).
func (c *engine) spinWait(w *poller.Waiter, est *poller.SpinBudget) bool {
	c.postReady() // receives taken back are posted before this side waits (an atomic load when none)
	if !w.Started() {
		wait.Start(w, c.ep.poller, est, c.cfg.PollMode == PollEvent, c.cfg.PollSpin)
	}
	return w.Spin()
}

// closeWaitLocked waits, driving the CQ, for the connection's state to
// change or until passes (then it reports false). For the waits of
// CloseWrite and Close, which go on after c.closing is closed. Called with
// c.mu held; returns with it held.
func (c *engine) closeWaitLocked(w *poller.Waiter, until time.Time) bool {
	if !time.Now().Before(until) {
		return false
	}
	if !w.Started() || w.Spinning() {
		c.mu.Unlock()
		c.spinWait(w, &c.wrSpin)
		c.mu.Lock()
		return true
	}
	wake := c.wake.Wait()
	c.mu.Unlock()
	t := time.NewTimer(time.Until(until))
	select {
	case <-wake:
	case <-t.C:
	}
	t.Stop()
	c.mu.Lock()
	return true
}

// waitLocked waits for the connection's state to change, ctx to end or the
// deadline to pass, driving the CQ meanwhile (spinWait). Called with c.mu
// held, right after the caller's condition failed; returns with it held,
// and the caller checks its condition again. w is the caller's wait (its
// End is the caller's to defer).
func (c *engine) waitLocked(ctx context.Context, d *deadline.Deadline, w *poller.Waiter) error {
	if !w.Started() || w.Spinning() {
		c.mu.Unlock()
		c.spinWait(w, &c.wrSpin)
		c.mu.Lock()
		if c.closed {
			return net.ErrClosed
		}
		return nil
	}
	// Parked: the wake channel is taken in the critical section that
	// checked the condition, so no change after that check is missed.
	wake := c.wake.Wait()
	c.mu.Unlock()
	defer c.mu.Lock()
	return wait.Park(ctx, wake, d, c.closing)
}
