//go:build linux && cgo

package rdma

import (
	"sync/atomic"
	"time"
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
