//go:build linux && cgo

package device

import (
	"sync"
	"time"

	"github.com/verbline/rdma/internal/verbs"
)

// The port's attributes a connection checks its QP's transitions against
// (active MTU, GID table length, link layer, P_Key table length), cached
// per device. ibv_query_port is a slow call to make on every connection
// end: rxe takes the RTNL lock to read the netdev's speed, and the call
// goes through cgo. These attributes change rarely, and the device says so
// for most of them: a port event (state, LID, P_Key, GID, SM change) drops
// the port's entry. What changes without an event is the active MTU when a
// netdev's MTU changes (rxe reports none), so an entry is also read again
// portCacheTTL after it was, and at once when rdma_cm gives a connection a
// path MTU above the cached active MTU (the netdev's MTU was raised).
// A lowered MTU needs nothing: rdma_cm's path MTU follows the netdev.
const portCacheTTL = time.Second

// PortCache is a device's cached port limits (Device.Ports).
type PortCache struct {
	query func(num uint8) (verbs.PortLimits, error) // the device's answer (set once, before use)
	now   func() time.Time                          // time.Now; the tests' clock

	mu      sync.Mutex // guards the fields below
	ports   map[uint8]cachedPort
	gen     uint64 // counts drops: a query that began before one is not kept
	queries uint64 // queries made (tests)
}

type cachedPort struct {
	lim verbs.PortLimits
	at  time.Time
}

// Limits returns port num's limits: the cached ones if they are younger
// than portCacheTTL and fresh is false, else the device's answer now
// (which is then cached).
func (pc *PortCache) Limits(num uint8, fresh bool) (verbs.PortLimits, error) {
	now := time.Now()
	if pc.now != nil {
		now = pc.now()
	}
	pc.mu.Lock()
	if cp, ok := pc.ports[num]; ok && !fresh && now.Sub(cp.at) < portCacheTTL {
		pc.mu.Unlock()
		return cp.lim, nil
	}
	gen := pc.gen
	pc.queries++
	pc.mu.Unlock()
	lim, err := pc.query(num)
	if err != nil {
		return verbs.PortLimits{}, err
	}
	pc.mu.Lock()
	if pc.gen == gen {
		if pc.ports == nil {
			pc.ports = make(map[uint8]cachedPort)
		}
		pc.ports[num] = cachedPort{lim: lim, at: now}
	}
	pc.mu.Unlock()
	return lim, nil
}

// Forget drops port num's cached limits (a port event said they may have
// changed).
func (pc *PortCache) Forget(num uint8) {
	pc.mu.Lock()
	delete(pc.ports, num)
	pc.gen++
	pc.mu.Unlock()
}

// Queries is how many times the cache queried a port (tests).
func (pc *PortCache) Queries() uint64 {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.queries
}

// Cached returns port num's cached limits, if any (tests).
func (pc *PortCache) Cached(num uint8) (verbs.PortLimits, bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	cp, ok := pc.ports[num]
	return cp.lim, ok
}

// Replace replaces port num's cached limits, keeping their age (tests:
// a stale entry).
func (pc *PortCache) Replace(num uint8, lim verbs.PortLimits) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if cp, ok := pc.ports[num]; ok {
		cp.lim = lim
		pc.ports[num] = cp
	}
}
