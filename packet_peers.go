//go:build linux && cgo

package rdma

import (
	"container/list"
	"net/netip"
)

// peerCache maps destination addresses to what a PacketConn needs to send
// to them (an address handle, a QP number), bounded: past max entries the
// least recently used one is evicted and handed to onEvict. It is not safe
// for concurrent use (the PacketConn's mutex guards it). Pure Go, so its
// tests run anywhere.
type peerCache[V any] struct {
	max     int
	m       map[netip.AddrPort]*list.Element
	order   list.List // of *peerItem[V]; front: most recently used
	onEvict func(netip.AddrPort, V)
}

type peerItem[V any] struct {
	key netip.AddrPort
	val V
}

func newPeerCache[V any](max int, onEvict func(netip.AddrPort, V)) *peerCache[V] {
	return &peerCache[V]{max: max, m: make(map[netip.AddrPort]*list.Element), onEvict: onEvict}
}

// get returns the value for k and marks it most recently used.
func (c *peerCache[V]) get(k netip.AddrPort) (V, bool) {
	e, ok := c.m[k]
	if !ok {
		var zero V
		return zero, false
	}
	c.order.MoveToFront(e)
	return e.Value.(*peerItem[V]).val, true
}

// put sets k's value (most recently used); a value it replaces is not
// passed to onEvict (the caller has it). It evicts the least recently
// used entries beyond max.
func (c *peerCache[V]) put(k netip.AddrPort, v V) {
	if e, ok := c.m[k]; ok {
		e.Value.(*peerItem[V]).val = v
		c.order.MoveToFront(e)
		return
	}
	c.m[k] = c.order.PushFront(&peerItem[V]{k, v})
	for c.order.Len() > c.max {
		last := c.order.Back()
		it := last.Value.(*peerItem[V])
		c.order.Remove(last)
		delete(c.m, it.key)
		if c.onEvict != nil {
			c.onEvict(it.key, it.val)
		}
	}
}

// remove drops k without calling onEvict.
func (c *peerCache[V]) remove(k netip.AddrPort) {
	if e, ok := c.m[k]; ok {
		c.order.Remove(e)
		delete(c.m, k)
	}
}

func (c *peerCache[V]) len() int { return c.order.Len() }

// each calls f for every entry, most recently used first.
func (c *peerCache[V]) each(f func(netip.AddrPort, V)) {
	for e := c.order.Front(); e != nil; e = e.Next() {
		it := e.Value.(*peerItem[V])
		f(it.key, it.val)
	}
}
