//go:build linux

// Package coarseclock tells PacketConns roughly what time it is (a tick
// every Tick) without a runtime timer and without a clock read on the data
// path. A pending runtime timer (time.AfterFunc, a Sleep, a deadline) makes
// the scheduler read the clock at every scheduling decision of its P
// (runtime timers.check), and a caller spinning on a completion queue
// yields to the scheduler at every turn: under a clock source without a
// vDSO fast path (HPET, as in an emulated guest: a system call per read)
// per-peer TTL timers would add a system call to every turn of a waiting
// caller's spin and slow the datagram round trip. So the ticks come from a
// timerfd read through the netpoller by one goroutine, shared by every
// user in the process and stopped with the last one.
package coarseclock

import (
	"encoding/binary"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Tick is the clock's resolution.
const Tick = 250 * time.Millisecond

var clock struct {
	now atomic.Int64 // ticks since the clock (first) started

	mu    sync.Mutex
	users int
	file  *os.File // the timerfd; closing it ends the goroutine
}

// Now is the clock in ticks (an atomic load).
func Now() int64 { return clock.now.Load() }

// Acquire starts the clock for its first user.
func Acquire() error {
	c := &clock
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.users > 0 {
		c.users++
		return nil
	}
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return os.NewSyscallError("timerfd_create", err)
	}
	tick := unix.NsecToTimespec(int64(Tick))
	if err := unix.TimerfdSettime(fd, 0, &unix.ItimerSpec{Interval: tick, Value: tick}, nil); err != nil {
		unix.Close(fd)
		return os.NewSyscallError("timerfd_settime", err)
	}
	f := os.NewFile(uintptr(fd), "packetconn-clock")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return err
	}
	c.users, c.file = 1, f
	go func() {
		for {
			n, err := readExpirations(rc)
			if err != nil {
				return // closed by the last release
			}
			c.now.Add(int64(n))
		}
	}()
	return nil
}

// readExpirations waits in the netpoller for the timerfd to be readable,
// then reads the number of expirations with a raw system call: the read
// never blocks (the fd is non-blocking), and a read through os.File enters
// the system call state, which wakes the runtime's monitor thread (sysmon)
// from its deep sleep into 20 us rounds that preempt a caller spinning on
// its completion queue.
func readExpirations(rc syscall.RawConn) (uint64, error) {
	var b [8]byte
	var errno unix.Errno
	err := rc.Read(func(fd uintptr) bool {
		_, _, errno = unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		return errno != unix.EAGAIN
	})
	if err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, os.NewSyscallError("read timerfd", errno)
	}
	return binary.NativeEndian.Uint64(b[:]), nil
}

// Release stops the clock with its last user.
func Release() {
	c := &clock
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.users--; c.users == 0 {
		c.file.Close()
		c.file = nil
	}
}
