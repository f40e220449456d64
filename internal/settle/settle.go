// Package settle lets the tests' resource checks, in any package, wait for
// what the rdma package releases in the background on purpose: closed
// connections' QPs waiting for their TIMEWAIT_EXIT before they join the QP
// pool, pooled QPs and devices kept (lingering) for the next connection.
// The rdma package registers its settling function; internal/rdmatest calls
// Wait before it counts RDMA objects or goroutines, so that the counts show
// leaks, not caches. It has no dependencies, so importing it costs the
// rdma package nothing.
package settle

import (
	"sync/atomic"
	"time"
)

var hook atomic.Pointer[func(limit time.Duration)]

// Register sets the function Wait runs.
func Register(f func(limit time.Duration)) { hook.Store(&f) }

// Wait runs the registered function, if any: it waits (up to limit) until
// nothing is released in the background any more, then frees what is only
// kept for reuse.
func Wait(limit time.Duration) {
	if f := hook.Load(); f != nil {
		(*f)(limit)
	}
}
