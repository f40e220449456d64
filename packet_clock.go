//go:build linux && cgo

package rdma

import (
	"encoding/binary"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// coarseClock tells PacketConns roughly what time it is (a tick every
// coarseTick) without a runtime timer and without a clock read on the data
// path. A pending runtime timer (time.AfterFunc, a Sleep, a deadline) makes
// the scheduler read the clock at every scheduling decision of its P
// (runtime timers.check), and a caller spinning on a completion queue
// yields to the scheduler at every turn: under a clock source without a
// vDSO fast path (the Soft-RoCE guest's HPET: a system call per read)
// per-peer TTL timers doubled the datagram round trip. So the ticks come
// from a timerfd read through the netpoller by one goroutine, shared by
// every PacketConn of the process and stopped with the last one.
var coarseClock struct {
	now atomic.Int64 // coarse ticks since the clock (first) started

	mu    sync.Mutex
	users int
	file  *os.File // the timerfd; closing it ends the goroutine
}

const coarseTick = 250 * time.Millisecond

// coarseNow is the clock in ticks (an atomic load).
func coarseNow() int64 { return coarseClock.now.Load() }

// acquireCoarseClock starts the clock for its first user.
func acquireCoarseClock() error {
	c := &coarseClock
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.users++; c.users > 1 {
		return nil
	}
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		c.users--
		return os.NewSyscallError("timerfd_create", err)
	}
	tick := unix.NsecToTimespec(int64(coarseTick))
	if err := unix.TimerfdSettime(fd, 0, &unix.ItimerSpec{Interval: tick, Value: tick}, nil); err != nil {
		unix.Close(fd)
		c.users--
		return os.NewSyscallError("timerfd_settime", err)
	}
	f := os.NewFile(uintptr(fd), "packetconn-clock")
	c.file = f
	go func() {
		var b [8]byte // the number of expirations since the last read
		for {
			if _, err := f.Read(b[:]); err != nil {
				return // closed by the last release
			}
			c.now.Add(int64(binary.NativeEndian.Uint64(b[:])))
		}
	}()
	return nil
}

// releaseCoarseClock stops the clock with its last user.
func releaseCoarseClock() {
	c := &coarseClock
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.users--; c.users == 0 {
		c.file.Close()
		c.file = nil
	}
}
