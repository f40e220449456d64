//go:build linux && cgo

package device

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// lowPriority is a device's worker for work off the data path that burns
// CPU in the kernel, such as registering a pool arena (the kernel pins and
// maps every page of it): one goroutine locked to an OS thread
// at the lowest CPU priority (nice 19), running jobs one at a time. On a
// CPU it shares with a busy-polling caller, the caller keeps nearly all of
// it, where at equal priority the kernel would give each half and stall
// the caller's round trips.
//
// The thread lives as long as the device: the kernel attributes RDMA
// objects to the thread that created them (rdma resource show lists its
// pid), and a thread that exits takes that attribution along, so a thread
// per job would hide the arenas it registered, and anything its Go thread
// had made before, from the process's listing. An unprivileged process
// cannot raise a thread's priority back, so the thread is never returned
// to the runtime: it exits with the worker (no UnlockOSThread).
type lowPriority struct {
	jobs chan func()
	quit chan struct{}
	done chan struct{}
}

func startLowPriority() *lowPriority {
	w := &lowPriority{jobs: make(chan func()), quit: make(chan struct{}), done: make(chan struct{})}
	go w.loop()
	return w
}

func (w *lowPriority) loop() {
	defer close(w.done)
	runtime.LockOSThread()
	_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19) // best effort: jobs run either way
	for {
		select {
		case job := <-w.jobs:
			job()
		case <-w.quit:
			return
		}
	}
}

// run runs f on the worker and returns its result; once the worker is
// stopped (the device torn down) f runs in the caller.
func (w *lowPriority) run(f func() error) error {
	res := make(chan error, 1)
	select {
	case w.jobs <- func() { res <- f() }:
		return <-res // a job handed over runs before the worker can stop
	case <-w.quit:
		return f()
	}
}

// stop ends the worker and its thread, after the job it is running.
func (w *lowPriority) stop() {
	close(w.quit)
	<-w.done
}
