//go:build linux && cgo

package poller

import (
	"testing"
	"time"
)

// TestLookAgainNeverNever: whatever the callers do, the poller goroutine
// that leaves the CQ unarmed schedules a look (a zero deadline would sleep
// for ever, leaving a completion nobody waits for in the CQ): every Idle
// for a channel consumer, the parked callers' backstop while one is
// parked, else maxBackstop.
func TestLookAgainNeverNever(t *testing.T) {
	const idle = time.Millisecond
	for _, tc := range []struct {
		name             string
		chanUsers, parks int32
		backstop         time.Duration
		want             time.Duration
	}{
		{"callers drive, nobody else", 0, 0, 0, maxBackstop},
		{"callers drive, backstop grown", 0, 0, 40 * time.Millisecond, maxBackstop},
		{"a channel consumer", 1, 0, 40 * time.Millisecond, idle},
		{"a parked caller, fresh backstop", 0, 1, 0, idle},
		{"a parked caller, grown backstop", 0, 1, 40 * time.Millisecond, 40 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Poller{backstop: tc.backstop}
			p.chanUsers.Store(tc.chanUsers)
			p.parked.Store(tc.parks)
			before := time.Now()
			at := p.lookAgain(idle)
			if at.IsZero() {
				t.Fatal("no look scheduled")
			}
			if d := at.Sub(before); d < tc.want || d > tc.want+time.Second {
				t.Fatalf("next look in %v, want %v", d, tc.want)
			}
		})
	}
}
