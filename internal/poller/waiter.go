//go:build linux && cgo

package poller

import (
	"runtime"
	"sync/atomic"
	"time"
)

var epoch = time.Now()

// nanotime is monotonic nanoseconds since the package started (a vDSO
// clock read, no allocation).
func nanotime() int64 { return int64(time.Since(epoch)) }

// pollTries is how many times one caller poll tries inside C. Each try
// is one read of the CQ in user space, so a call stays short and the
// caller still gives the P up often enough. It is not smaller because a
// completion that arrives while the caller is outside C (crossing back,
// yielding) waits for it, and per try the C loop is the cheapest place to
// be (docs/performance.md, "Where the time goes").
const pollTries = 64

// yieldEvery is how many polls a spinning caller makes between yields
// (runtime.Gosched). A yield lets other goroutines run under GOMAXPROCS 1,
// but costs more than a poll: the scheduler looks at the run queues, may
// poll the network and, with an idle P, wakes another thread (wakep), and
// a completion that arrives meanwhile waits. Yielding after every poll
// would put a large share of a ping-pong's CPU in the scheduler and delay
// the completions that land during the yields.
const yieldEvery = 4

// clockEvery is how many spin iterations pass between clock reads: under
// emulation a clock read costs about as much as a poll, so reading it on
// every iteration would spend a large share of a spinning caller's CPU on
// the clock.
const clockEvery = 8

// maxSpin caps a learnt spin budget: a caller that waited this long parks.
const maxSpin = 2 * time.Millisecond

// maxParkSpin caps what the cost of parking adds to the budget: a
// connection whose messages come just slower than a park would otherwise
// spin without pause.
const maxParkSpin = 500 * time.Microsecond

// SpinBudget learns how long a caller should spin before parking, the way
// TCP learns its retransmission timeout: a smoothed wait time plus four
// times its mean deviation (Jacobson), never less than the configured
// minimum, never more than maxSpin. A ping-pong whose round trip, or whose
// jitter, exceeds the minimum keeps spinning through it instead of parking
// (a park and wake-up costs far more than the spin it saves); a
// connection whose waits are long (idle) parks after the minimum.
//
// It also never spins less than a park has recently cost (the time from
// parking to being woken with the wait over): spinning as long as the
// alternative costs is the classic 2-competitive choice, and it adapts to
// the machine, since a wake-up through the completion channel, the
// netpoller and the scheduler costs far more under emulation than on
// hardware.
type SpinBudget struct {
	srtt, rttvar atomic.Int64 // ns
	perIter      atomic.Int64 // ns per spin iteration, measured at clock reads
	parkCost     atomic.Int64 // ns, smoothed
}

// Budget is the spin budget given the configured minimum.
func (s *SpinBudget) Budget(floor time.Duration) time.Duration {
	b := time.Duration(max(s.srtt.Load()+4*s.rttvar.Load(), min(s.parkCost.Load(), int64(maxParkSpin))))
	if b < floor {
		return floor
	}
	if b > maxSpin {
		return max(floor, maxSpin)
	}
	return b
}

// Observe records how long a wait took. Waits longer than maxSpin are
// idleness, not latency: they do not count.
func (s *SpinBudget) Observe(d time.Duration) {
	if d > maxSpin {
		return
	}
	srtt, rttvar := s.srtt.Load(), s.rttvar.Load()
	err := int64(d) - srtt
	s.srtt.Store(srtt + err/8)
	if err < 0 {
		err = -err
	}
	s.rttvar.Store(rttvar + (err-rttvar)/4)
}

// observePark records how long a parked wait took from its park to its end.
// Parks longer than maxSpin were idleness, not the cost of waking.
func (s *SpinBudget) observePark(d time.Duration) {
	if d > maxSpin {
		return
	}
	old := s.parkCost.Load()
	s.parkCost.Store(old + (int64(d)-old)/4)
}

// Waiter drives a poller's CQ for one blocked caller: it polls the CQ
// itself (one owner at a time, by CAS), watches the progress others make
// while they own it, yields between tries so other goroutines run even
// under GOMAXPROCS 1, and once its spin budget is spent it parks: it
// registers as parked, arms the CQ and polls once more, so the completion
// it waits for wakes the poller's goroutine, which dispatches it and so
// wakes the caller. A Waiter lives on the caller's stack (no allocation).
//
//	w.Start(p, budget)
//	defer w.End()
//	for {
//		if condition() { return }
//		if w.Spin() { continue } // polled, or saw progress, or still within budget
//		select { ...park until woken... }
//	}
type Waiter struct {
	p        *Poller
	est      *SpinBudget
	start    int64 // the first clock read (0: none yet; short waits read none)
	iters    int
	startIt  int   // iterations done at the first clock read
	parkedAt int64 // when it parked
	budget   int64
	lastProg uint64
	spinning bool
	parked   bool
}

// Start begins a wait on p with a spin budget (0: park at once, still
// polling once first).
func (w *Waiter) Start(p *Poller, est *SpinBudget, budget time.Duration) {
	*w = Waiter{p: p, est: est, budget: int64(budget), lastProg: p.progress.Load(), spinning: true}
	p.spinners.Add(1)
}

// Spin makes one step of progress for the caller and reports whether the
// caller should check its condition again before parking: true while the
// spin budget lasts, and once more right after the waiter registered as
// parked (the CQ is then armed). false means park now.
func (w *Waiter) Spin() bool {
	p := w.p
	if w.spinning {
		if p.stop.Load() {
			w.stopSpinning()
			return false
		}
		if p.owner.CompareAndSwap(false, true) {
			n, err := p.pollOwned(p.inline, pollTries)
			p.inlinePolls.Add(1)
			if n == 0 {
				p.emptyPolls.Add(1)
			}
			p.release(p.inline)
			if n > 0 {
				w.lastProg = p.progress.Load()
				return true
			}
			if err != nil {
				p.Fail(err) // its connections are failed: the caller's wait ends
				w.stopSpinning()
				return false
			}
		} else if prog := p.progress.Load(); prog != w.lastProg {
			w.lastProg = prog // someone else dispatched: maybe ours
			return true
		}
		if w.iters++; w.iters%clockEvery != 0 && w.budget > 0 {
			if w.iters%yieldEvery == 0 {
				runtime.Gosched()
			}
			return true
		}
		now := nanotime()
		if w.start == 0 {
			w.start, w.startIt = now, w.iters
		} else if w.est != nil {
			w.est.perIter.Store((now - w.start) / int64(w.iters-w.startIt))
		}
		// The iterations before the first clock read took about perIter each.
		if now-w.start+int64(w.startIt)*w.perIter() < w.budget {
			runtime.Gosched()
			return true
		}
		// Budget spent: park. Register first, then arm and poll once more
		// (done by release when no one else spins), then let the caller
		// check its condition one last time before it sleeps.
		p.parks.Add(1)
		p.parked.Add(1)
		w.parked = true
		w.parkedAt = now
		w.stopSpinning() // the last spinner to leave arms the CQ for the parked
		return true
	}
	return false
}

func (w *Waiter) perIter() int64 {
	if w.est == nil {
		return 0
	}
	return w.est.perIter.Load()
}

// Started reports whether Start was called and End not yet.
func (w *Waiter) Started() bool { return w.p != nil }

// Spinning reports whether the next Spin may still poll (false once the
// waiter has registered as parked: the caller should sleep).
func (w *Waiter) Spinning() bool { return w.spinning }

func (w *Waiter) stopSpinning() {
	if w.spinning {
		w.spinning = false
		if w.p.spinners.Add(-1) == 0 && w.p.parked.Load() > 0 && w.p.owner.CompareAndSwap(false, true) {
			// The last spinner leaves while callers are parked: release
			// arms the CQ for them and polls once more.
			w.p.release(w.p.inline)
		}
	}
}

// End finishes the wait (whatever its outcome) and teaches the spin budget
// how long it took.
func (w *Waiter) End() {
	if w.p == nil {
		return
	}
	w.stopSpinning()
	if w.parked {
		w.parked = false
		w.p.parked.Add(-1)
		if w.est != nil {
			w.est.observePark(time.Duration(nanotime() - w.parkedAt))
		}
	}
	if w.est != nil {
		// A wait too short to have read the clock is estimated from its
		// iterations: clock reads cost as much as polls under emulation.
		d := time.Duration(int64(w.iters) * w.perIter())
		if w.start != 0 {
			d = time.Duration(nanotime() - w.start + int64(w.startIt)*w.perIter())
		}
		w.est.Observe(d)
	}
	w.p = nil
}
