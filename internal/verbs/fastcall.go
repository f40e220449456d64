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
// than the work: 390 ns against 60 ns per call in the Soft-RoCE guest
// (BenchmarkCostCall*), on a path that makes two such calls per message.
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
// the UD posts go the same way. Through cgo each ran in the runtime's
// syscall state, and with GOMAXPROCS 1 the runtime's monitor thread
// (sysmon) takes the P from any such call it sees twice and hands it to
// another thread; each call it takes, or that wakes it from a deep sleep,
// keeps it waking every 20 us. In the Soft-RoCE guest, where these calls
// take tens of microseconds, a 64 B Conn ping-pong whose waits sometimes
// parked (each park arms the CQ, each wake-up takes an event) had the
// monitor wake 7,800-9,300 times a second on the client's only CPU, each
// time preempting the thread that ran the ping-pong (0.4-1.3 involuntary
// context switches per round trip); with arming, taking events and the UD
// posts fast, 400-1,500 times a second (benchmarks/HISTORY.md, session 15), and
// none once the acknowledgement was fast too (session 16).
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
