//go:build linux && cgo

package rdmacm

/*
#include <rdma/rdma_cma.h>
*/
import "C"

import (
	"os"
	"sync"
	"time"
)

// Idle event channels. Opening one (open of /dev/infiniband/rdma_cm, a dup
// of its fd and the fd's registration with the netpoller) and destroying it
// again is a sizeable share of each side's connection set-up. A
// connection's channel ends with no ids on it and its kernel event queue
// empty (rdma_destroy_id discards the id's undelivered events), so Close
// keeps it here and the next NewChannel takes it instead of opening
// another.
//
// What is kept is the C channel and its registered file only: every user
// gets a fresh Channel (ids map, read buffer, closed flag), so nothing a
// former user holds (an *ID, the Channel) reaches the next one.
//
// A kept channel is destroyed once it has been idle for idleTTL, so the
// descriptors of a burst go back to the system soon after it: the pool
// only serves connections that follow each other closely. One timer, armed
// while the pool holds a channel, does it: no goroutine waits while
// channels are kept, and none is left when the pool is empty.

// idleMax bounds the idle channels a process keeps: each holds two fds and
// nothing else (no goroutine, no kernel rdma_cm object).
const idleMax = 64

// idleTTL is how long a kept channel waits for its next user: the default
// Config.DeviceLinger, for which a device whose last connection closed is
// kept for the next one, so a process keeps what speeds up the next
// connection for as long as it keeps the device.
const idleTTL = 2 * time.Second

type idleChannel struct {
	ch    *C.struct_rdma_event_channel
	file  *os.File
	since time.Time // when Close kept it
}

var idle struct {
	mu    sync.Mutex
	list  []idleChannel // oldest first: keepIdle appends, takeIdle takes the last
	ttl   time.Duration // idleTTL; tests shorten it (setIdleTTL)
	timer *time.Timer   // runs expireIdle; armed while list is not empty
}

func init() { idle.ttl = idleTTL }

// takeIdle returns a kept channel, or ok false.
func takeIdle() (ic idleChannel, ok bool) {
	idle.mu.Lock()
	defer idle.mu.Unlock()
	n := len(idle.list)
	if n == 0 {
		return ic, false
	}
	ic = idle.list[n-1]
	idle.list[n-1] = idleChannel{}
	idle.list = idle.list[:n-1]
	if n == 1 {
		idle.timer.Stop()
	}
	return ic, true
}

// keepIdle keeps a channel no Next is reading any more; false if
// the pool is full (the caller destroys it).
func keepIdle(ch *C.struct_rdma_event_channel, file *os.File) bool {
	if err := file.SetReadDeadline(time.Time{}); err != nil { // the stop's deadline off again
		return false
	}
	idle.mu.Lock()
	defer idle.mu.Unlock()
	if len(idle.list) >= idleMax {
		return false
	}
	idle.list = append(idle.list, idleChannel{ch, file, time.Now()})
	if len(idle.list) == 1 {
		if idle.timer == nil {
			idle.timer = time.AfterFunc(idle.ttl, expireIdle)
		} else {
			idle.timer.Reset(idle.ttl)
		}
	}
	return true
}

// expireIdle destroys the channels idle for idle.ttl or longer and arms
// the timer for the oldest of the others.
func expireIdle() {
	idle.mu.Lock()
	now := time.Now()
	n := 0
	for n < len(idle.list) && now.Sub(idle.list[n].since) >= idle.ttl {
		n++
	}
	expired := make([]idleChannel, n)
	copy(expired, idle.list[:n])
	rest := copy(idle.list, idle.list[n:])
	clear(idle.list[rest:])
	idle.list = idle.list[:rest]
	if rest > 0 {
		idle.timer.Reset(idle.ttl - now.Sub(idle.list[0].since))
	}
	idle.mu.Unlock()
	destroyIdle(expired)
}

func destroyIdle(list []idleChannel) {
	for _, ic := range list {
		ic.file.Close()
		C.rdma_destroy_event_channel(ic.ch)
	}
}

// IdleChannels is how many closed channels are kept for reuse.
func IdleChannels() int {
	idle.mu.Lock()
	defer idle.mu.Unlock()
	return len(idle.list)
}

// DrainIdleChannels destroys the kept channels now rather than when they
// expire (tests that count fds).
func DrainIdleChannels() {
	idle.mu.Lock()
	list := idle.list
	idle.list = nil
	if idle.timer != nil {
		idle.timer.Stop()
	}
	idle.mu.Unlock()
	destroyIdle(list)
}
