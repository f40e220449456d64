//go:build linux

package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// startPerfRecord: RDMABENCH_PERF=prefix records each child's measured
// phase with Linux perf (`perf record -g`, the cpu-clock software event,
// which an emulated CPU supports) into prefix.server.perf /
// prefix.client.perf (the TCP baseline's children: prefix.tcp.server.perf
// and prefix.tcp.client.perf), kernel and user space together: where the Go CPU
// profile shows only "C" or a syscall, this shows what the kernel did
// there (Soft-RoCE's requester and responder, the scheduler, the page
// allocator). A child pinned to one CPU records that CPU, so the softirq
// and kernel-thread work the device does there counts too; an unpinned
// child records its own process. RDMABENCH_PERF_HZ sets the sampling rate
// (default 1000). Read the file where it was recorded (inside the guest:
// the kernel's symbols are the guest's), e.g. `perf report -i
// prefix.server.perf --no-children --sort sym`. The returned func stops
// perf and waits for it to write the file.
func startPerfRecord(serve bool) (stop func(), err error) {
	prefix := os.Getenv("RDMABENCH_PERF")
	if prefix == "" {
		return func() {}, nil
	}
	hz := 1000
	if v, err := strconv.Atoi(os.Getenv("RDMABENCH_PERF_HZ")); err == nil && v > 0 {
		hz = v
	}
	if f := flag.Lookup("net"); f != nil && f.Value.String() == "tcp" {
		prefix += ".tcp" // the TCP baseline's children, beside ours in one run
	}
	out := profilePath(prefix, serve) + ".perf"
	args := []string{"record", "-q", "-e", "cpu-clock", "-F", strconv.Itoa(hz), "-g", "-o", out}
	if cpu, ok := pinnedCPU(); ok {
		args = append(args, "-C", strconv.Itoa(cpu))
	} else {
		args = append(args, "-p", strconv.Itoa(os.Getpid()))
	}
	// Not started before an old file is gone: the wait below watches for
	// the new one.
	os.Remove(out)
	cmd := exec.Command("perf", args...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGINT}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("RDMABENCH_PERF: start perf (install linux-perf): %w", err)
	}
	// perf writes the file's header once its events are open: wait for it
	// (at most 5 s) so that the measured phase is recorded from its start.
	for t0 := time.Now(); time.Since(t0) < 5*time.Second; time.Sleep(20 * time.Millisecond) {
		if fi, err := os.Stat(out); err == nil && fi.Size() > 0 {
			break
		}
	}
	return func() {
		cmd.Process.Signal(syscall.SIGINT)
		cmd.Wait()
	}, nil
}

// pinnedCPU is the one CPU this process may run on, if it is pinned to one.
func pinnedCPU() (int, bool) {
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) != nil || set.Count() != 1 {
		return 0, false
	}
	for cpu := 0; cpu < 1024; cpu++ {
		if set.IsSet(cpu) {
			return cpu, true
		}
	}
	return 0, false
}
