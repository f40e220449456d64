// Package deadline is the timer behind the SetReadDeadline and
// SetWriteDeadline of the library's connections: a settable point in time
// whose passing closes a channel. Completions do not come through Go's
// netpoller, so blocked calls select on Wait() beside their wake-up channel
// (the approach of net/pipe.go), and a spinning caller asks Expired() on
// every turn (one atomic load).
package deadline

import (
	"sync"
	"sync/atomic"
	"time"
)

// Deadline is a settable point in time whose passing closes a channel. Make
// it with New; its zero value is not usable.
type Deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{} // closed when the deadline passes
	// passed is set just before cancel is closed and cleared when a new
	// cancel replaces a closed one: Expired reads it without the mutex,
	// since a waiting caller asks on every turn of its spin loop.
	passed atomic.Bool
}

// New returns a deadline that is not set.
func New() Deadline { return Deadline{cancel: make(chan struct{})} }

// Set changes the deadline; the zero time means none; a time in the past
// expires at once.
func (d *Deadline) Set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer fired: wait for it to close cancel, then re-arm
	}
	d.timer = nil
	closed := IsClosed(d.cancel)
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
			// Before the close: Set waits for the close (the timer's
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

// Wait returns a channel that is closed when the deadline passes.
func (d *Deadline) Wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}

// Expired reports whether the deadline has passed: one atomic load.
func (d *Deadline) Expired() bool { return d.passed.Load() }

// IsClosed reports whether c is closed, without waiting.
func IsClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// SetRW sets the read deadline rdD (if rd) and the write deadline wrD (if
// wr) to t: what a connection's SetDeadline, SetReadDeadline and
// SetWriteDeadline do once it is known to be open.
func SetRW(rdD, wrD *Deadline, t time.Time, rd, wr bool) {
	if rd {
		rdD.Set(t)
	}
	if wr {
		wrD.Set(t)
	}
}
