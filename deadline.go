package rdma

import (
	"sync"
	"sync/atomic"
	"time"
)

// deadline is a settable point in time whose passing closes a channel.
// Completions do not come through Go's netpoller, so blocked calls select on
// wait() beside their wake-up channel (the approach of net/pipe.go).
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{} // closed when the deadline passes
	// passed is set just before cancel is closed and cleared when a new
	// cancel replaces a closed one: expired reads it without the mutex,
	// since a waiting caller asks on every turn of its spin loop.
	passed atomic.Bool
}

func makeDeadline() deadline { return deadline{cancel: make(chan struct{})} }

// set changes the deadline; the zero time means none; a time in the past
// expires at once.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer fired: wait for it to close cancel, then re-arm
	}
	d.timer = nil
	closed := isClosedChan(d.cancel)
	if t.IsZero() {
		if closed {
			d.cancel = make(chan struct{})
			d.passed.Store(false)
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.cancel = make(chan struct{})
			d.passed.Store(false)
		}
		cancel := d.cancel
		d.timer = time.AfterFunc(dur, func() {
			// Before the close: set waits for the close (the timer's
			// Stop failed) before it clears passed for a new deadline.
			d.passed.Store(true)
			close(cancel)
		})
		return
	}
	if !closed {
		d.passed.Store(true)
		close(d.cancel)
	}
}

// wait returns a channel that is closed when the deadline passes.
func (d *deadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}

// expired reports whether the deadline has passed: one atomic load.
func (d *deadline) expired() bool { return d.passed.Load() }

func isClosedChan(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
