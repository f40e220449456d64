//go:build linux && cgo

package cmsetup

import (
	"sync/atomic"
	"time"

	"github.com/verbline/rdma/internal/rdmacm"
)

// Set-up timing, for the set-up measurements in the rdma package's tests:
// each step of a dial, an accept or an endpoint's creation, and how long
// each CM event took from its read off the kernel's channel to the
// goroutine that handles it. Nil in normal use: the steps then read no
// clock.
var (
	stepTrace  atomic.Pointer[func(side, step string, d time.Duration)]
	eventTrace atomic.Pointer[func(ev rdmacm.Event)]
)

// SetStepTrace makes every set-up report the duration of each of its steps
// to f as the step completes: side is "dial", "accept" or "endpoint", step
// names what ran; delivered events are reported as side "event" (see
// TraceDelivery). Nil: no reports.
func SetStepTrace(f func(side, step string, d time.Duration)) {
	if f == nil {
		stepTrace.Store(nil)
		return
	}
	stepTrace.Store(&f)
}

// SetEventTrace makes TraceDelivery hand f every event it sees, to be
// matched with the kernel's record of when it was queued. Nil: none.
func SetEventTrace(f func(ev rdmacm.Event)) {
	if f == nil {
		eventTrace.Store(nil)
		return
	}
	eventTrace.Store(&f)
}

// Steps times the consecutive steps of one set-up.
type Steps struct {
	side  string
	last  time.Time
	trace func(side, step string, d time.Duration)
}

// StartSteps starts timing side's set-up: the zero Steps (no trace set)
// does nothing.
func StartSteps(side string) Steps {
	f := stepTrace.Load()
	if f == nil {
		return Steps{}
	}
	return Steps{side: side, last: time.Now(), trace: *f}
}

// Step reports the time since the previous step (or the start) as step.
func (s *Steps) Step(step string) {
	if s.trace == nil {
		return
	}
	now := time.Now()
	s.trace(s.side, step, now.Sub(s.last))
	s.last = now
}

// TraceDelivery reports how long ev took from its read off the kernel's
// event channel to the goroutine that handles it (a hand-off through a Go
// channel, and for connect requests the listener's loop and a new
// goroutine too), as the step "delivery <event><via>" of side "event".
// CheckEvent calls it for every event a set-up checks.
func TraceDelivery(ev rdmacm.Event, via string) {
	if ev.Read.IsZero() {
		return
	}
	if f := stepTrace.Load(); f != nil {
		(*f)("event", "delivery "+ev.Type.String()+via, time.Since(ev.Read))
	}
	if f := eventTrace.Load(); f != nil {
		(*f)(ev)
	}
}
