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

// idleMax bounds the idle channels a process keeps: each holds two fds and
// nothing else (no goroutine, no kernel rdma_cm object).
const idleMax = 64

type idleChannel struct {
	ch   *C.struct_rdma_event_channel
	file *os.File
}

var idle struct {
	mu   sync.Mutex
	list []idleChannel
}

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
	idle.list = append(idle.list, idleChannel{ch, file})
	return true
}

// IdleChannels is how many closed channels are kept for reuse.
func IdleChannels() int {
	idle.mu.Lock()
	defer idle.mu.Unlock()
	return len(idle.list)
}

// DrainIdleChannels destroys the kept channels (tests that count fds; a
// process that wants its fds back).
func DrainIdleChannels() {
	idle.mu.Lock()
	list := idle.list
	idle.list = nil
	idle.mu.Unlock()
	for _, ic := range list {
		ic.file.Close()
		C.rdma_destroy_event_channel(ic.ch)
	}
}
