//go:build linux && cgo

package wait

import (
	"time"

	"github.com/verbline/rdma/internal/poller"
)

// Start starts a wait on pl's CQ, the first step of a caller that drives
// the CQ while it waits (poller.Waiter), with a spin budget learnt by est
// and never under minSpin; with eventOnly (Config.PollMode PollEvent) the
// waiter gets no budget: it polls once and parks.
func Start(w *poller.Waiter, pl *poller.Poller, est *poller.SpinBudget, eventOnly bool, minSpin time.Duration) {
	var budget time.Duration
	if !eventOnly {
		budget = est.Budget(minSpin)
	}
	w.Start(pl, est, budget)
}
