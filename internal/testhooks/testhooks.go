// Package testhooks holds what tests, in any package of the module, may
// switch or call in the rdma package (and in internal/device, the
// registry of its devices), and nothing else does: the package
// is internal, so no user of the library can reach it, and the rdma
// package reads a switch with one atomic load. It has no dependencies,
// so importing it costs the rdma package nothing.
package testhooks

import (
	"sync/atomic"
	"time"
)

// Settling: the tests' resource checks wait for what the rdma package
// releases in the background on purpose (closed connections' QPs waiting
// for their TIMEWAIT_EXIT before they join the QP pool, pooled QPs and
// devices kept for the next connection). The rdma package registers its
// settling function; internal/rdmatest calls Settle before it counts RDMA
// objects or goroutines, so that the counts show leaks, not caches.
var settle atomic.Pointer[func(limit time.Duration)]

// RegisterSettle sets the function Settle runs.
func RegisterSettle(f func(limit time.Duration)) { settle.Store(&f) }

// Settle runs the registered function, if any: it waits (up to limit)
// until nothing is released in the background any more, then frees what
// is only kept for reuse.
func Settle(limit time.Duration) {
	if f := settle.Load(); f != nil {
		(*f)(limit)
	}
}

// RXEBindAnytime turns off the Soft-RoCE rule that binds memory windows
// only into an empty send queue (the rdma package's post.go; read by
// internal/device on every bind), for the fault tests' control runs
// (-faults.rxe-bind-anytime), which show the hang the rule prevents.
var RXEBindAnytime atomic.Bool

// WholeReads makes the rdma package read each large message with one RDMA
// READ, up to maxRendezvous of them at once, instead of in pieces
// (rendezvous.go, readChunk), for the fault tests' control runs
// (-faults.whole-reads), which show what the pieces gain over a lossy wire.
var WholeReads atomic.Bool

// ReplyBySIDR makes PacketConns opened while it is set answer senders by
// resolving their address (an SIDR exchange), as on InfiniBand, instead of
// from the GRH of their datagrams, as RoCE allows: the test of that path on
// Soft-RoCE.
var ReplyBySIDR atomic.Bool

// TrackAllocations makes the buffer pools of devices set up while it is
// set record where each buffer was allocated, for the leak reports of the
// tests' resource checks.
var TrackAllocations atomic.Bool
