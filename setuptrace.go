//go:build linux && cgo

package rdma

import (
	"sync/atomic"
	"time"

	"github.com/verbline/rdma/internal/cmsetup"
	"github.com/verbline/rdma/internal/rdmacm"
)

// setupTrace, when set (by the set-up measurements in the package's tests),
// receives the duration of each step of a dial or accept as it completes:
// side is "dial" or "accept", step names what ran. Nil in normal use: the
// steps then read no clock.
var setupTrace atomic.Pointer[func(side, step string, d time.Duration)]

// stepTimer times the consecutive steps of one dial or accept.
type stepTimer struct {
	side  string
	last  time.Time
	trace func(side, step string, d time.Duration)
}

func startSteps(side string) stepTimer {
	f := setupTrace.Load()
	if f == nil {
		return stepTimer{}
	}
	return stepTimer{side: side, last: time.Now(), trace: *f}
}

// step reports the time since the previous step (or the start) as step.
func (s *stepTimer) step(step string) {
	if s.trace == nil {
		return
	}
	now := time.Now()
	s.trace(s.side, step, now.Sub(s.last))
	s.last = now
}

// The events the set-up steps check (cmsetup.CheckEvent: every one a dial
// or accept waits for) are traced as delivered to the goroutine that
// handles them.
func init() { cmsetup.SetDeliveryHook(func(ev rdmacm.Event) { traceDelivery(ev, "") }) }

// traceDelivery reports how long ev took from its read off the kernel's
// event channel to the goroutine that handles it (a hand-off through a Go
// channel, and for connect requests the listener's loop and a new
// goroutine too), as the step "delivery <event><via>" of side "event".
func traceDelivery(ev rdmacm.Event, via string) {
	if f := setupTrace.Load(); f != nil && !ev.Read.IsZero() {
		(*f)("event", "delivery "+ev.Type.String()+via, time.Since(ev.Read))
	}
	if f := eventTrace.Load(); f != nil && !ev.Read.IsZero() {
		(*f)(ev)
	}
}

// eventTrace, when set (by the set-up measurements), receives every CM event
// traceDelivery sees, to be matched with the kernel's record of when it was
// queued (TestSetupProfile's RDMA_SETUP_EVENTS).
var eventTrace atomic.Pointer[func(ev rdmacm.Event)]
