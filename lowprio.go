//go:build linux && cgo

package rdma

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// runLowPriority runs f on an OS thread of its own at the lowest CPU
// priority (nice 19) and returns its result. For work off the data path
// that burns CPU in the kernel, such as registering a pool arena (15 ms of
// system time for 4 MiB in the Soft-RoCE guest): on a CPU it shares with a
// busy-polling caller, the caller keeps nearly all of it, where at equal
// priority the kernel would give each half and stall the caller's round
// trips. The thread is never unlocked, so it exits when f returns and its
// priority goes with it (an unprivileged process may lower a thread's
// priority but not raise it back).
func runLowPriority(f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19) // best effort: f runs either way
		done <- f()
	}()
	return <-done
}
