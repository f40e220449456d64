//go:build linux && cgo

package verbs

import (
	"os"
	"unsafe"
)

// The data path's calls into C (poll, post) are short and never call back
// into Go: a poll is a few loads from a ring the NIC (or Soft-RoCE) fills,
// bounded by a try count; a post writes work requests and rings a doorbell
// (an MMIO write on hardware, a write(2) to the uverbs device on Soft-RoCE,
// where the kernel transmits before it returns). For such calls the cgo
// runtime transition (entersyscall, exitsyscall, pointer checks) costs more
// than the work (BenchmarkCostPollEmpty runs an empty poll both ways;
// docs/performance.md), on a path that makes two such calls per message.
//
// So these calls switch to the system stack and call C directly, through
// the runtime's asmcgocall, as a cgo call does minus the scheduler
// bookkeeping. What that gives up, and why it is acceptable here: the P is
// not released during the call (nothing else can run on it, and a garbage
// collection's stop-the-world waits for the call to return), which is a
// matter of microseconds for these calls; a C function that blocked or
// called back into Go would be a bug. Everything else (device set-up,
// async events, queries) goes through cgo as usual, except the QP
// transitions that carry no address vector (ibv_modify_qp to INIT, RTS,
// ERR, RESET: CPU work in the driver, or a firmware command) and rdma_cm's
// set-up commands (internal/rdmacm's fastcall.go, which says why). A
// transition with an address vector (RTR of a connected QP) stays on cgo:
// on RoCE the kernel resolves the peer's MAC in it (ib_resolve_eth_dmac),
// which waits for a work queue and, when the neighbour entry is not valid,
// for ARP, up to a second.
//
// Arming a CQ (ibv_req_notify_cq), taking an event from its non-blocking
// channel (ibv_get_cq_event), acknowledging events (ibv_ack_cq_events) and
// the UD posts go the same way. Through cgo each would run in the
// runtime's syscall state, and with GOMAXPROCS 1 the runtime's monitor
// thread (sysmon) takes the P from any such call it sees twice and hands
// it to another thread; each call it takes, or that wakes it from a deep
// sleep, keeps it waking every 20 us. Where these calls are long
// (Soft-RoCE, whose device work runs inside them), a ping-pong whose waits
// sometimes park (each park arms the CQ, each wake-up takes an event)
// would have the monitor waking over and over and preempting the thread
// that runs it; as fast calls they leave the monitor asleep.
//
// VERBLINE_CGO=safe in the environment turns the fast calls off: every call
// then goes through cgo (for debugging, or a platform where the fast path
// misbehaves).
var fastCalls = os.Getenv("VERBLINE_CGO") != "safe"

// asmcgocall runs fn(arg) on the system stack (the runtime keeps this
// linkname available: go.dev/issue/67401).
//
//go:linkname asmcgocall runtime.asmcgocall
//go:noescape
func asmcgocall(fn, arg unsafe.Pointer) int32

// FastCalls reports whether poll and post calls bypass the cgo runtime
// transition (see VERBLINE_CGO).
func FastCalls() bool { return fastCalls }

// SetFastCalls switches the fast calls on or off (for tests and the cost
// benchmarks) and returns the previous setting. Not safe while other
// goroutines post or poll, or while an rdma_cm event channel reads events
// (internal/rdmacm reads the setting too).
func SetFastCalls(on bool) bool {
	old := fastCalls
	fastCalls = on
	return old
}
