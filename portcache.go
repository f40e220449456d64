//go:build linux && cgo

package rdma

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

// portCache is a device's cached port limits (device.ports).
type portCache struct {
	mu      sync.Mutex
	ports   map[uint8]cachedPort
	gen     uint64 // counts drops: a query that began before one is not kept
	queries uint64 // ibv_query_port calls made (tests)
}

type cachedPort struct {
	lim verbs.PortLimits
	at  time.Time
}

// portLimits returns port num's limits: the cached ones if they are
// younger than portCacheTTL and fresh is false, else the device's answer
// now (which is then cached).
func (d *device) portLimits(num uint8, fresh bool) (verbs.PortLimits, error) {
	now := time.Now()
	pc := &d.ports
	pc.mu.Lock()
	if cp, ok := pc.ports[num]; ok && !fresh && now.Sub(cp.at) < portCacheTTL {
		pc.mu.Unlock()
		return cp.lim, nil
	}
	gen := pc.gen
	pc.queries++
	pc.mu.Unlock()
	port, err := d.ctx.QueryPort(num)
	if err != nil {
		return verbs.PortLimits{}, err
	}
	lim := port.Limits(d.attr)
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

// forgetPort drops port num's cached limits (a port event said they may
// have changed).
func (d *device) forgetPort(num uint8) {
	pc := &d.ports
	pc.mu.Lock()
	delete(pc.ports, num)
	pc.gen++
	pc.mu.Unlock()
}

// portQueries is how many times the device queried a port (tests).
func (d *device) portQueries() uint64 {
	d.ports.mu.Lock()
	defer d.ports.mu.Unlock()
	return d.ports.queries
}
