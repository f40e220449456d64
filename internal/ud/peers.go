package ud

import (
	"container/list"
	"net/netip"
)

// PeerCache maps destination addresses to what a PacketConn needs to send
// to them (an address handle, a QP number), bounded at max entries. It
// keeps two kinds: entries this side's own address resolution found (Put)
// and entries learnt from a received datagram (PutLearned). Learnt entries
// are at most max/2 (at least one) and evict only each other: a flood of
// datagrams from new sources churns the learnt half and never evicts an
// entry this side resolved. A put beyond max evicts the least recently
// used entry of either kind. Evicted entries are handed to onEvict. It is
// not safe for concurrent use (the PacketConn's mutex guards it).
type PeerCache[V any] struct {
	max, maxLearned int
	m               map[netip.AddrPort]*list.Element
	own, learned    list.List // of *peerItem[V]; front: most recently used
	clock           uint64    // stamps uses, to compare the two lists' ends
	onEvict         func(netip.AddrPort, V)
}

type peerItem[V any] struct {
	key     netip.AddrPort
	val     V
	learned bool
	used    uint64
}

// NewPeerCache makes a cache of n entries that hands evicted ones to onEvict.
func NewPeerCache[V any](n int, onEvict func(netip.AddrPort, V)) *PeerCache[V] {
	return &PeerCache[V]{max: n, maxLearned: max(1, n/2),
		m: make(map[netip.AddrPort]*list.Element), onEvict: onEvict}
}

func (c *PeerCache[V]) listOf(it *peerItem[V]) *list.List {
	if it.learned {
		return &c.learned
	}
	return &c.own
}

func (c *PeerCache[V]) touch(e *list.Element) {
	it := e.Value.(*peerItem[V])
	c.clock++
	it.used = c.clock
	c.listOf(it).MoveToFront(e)
}

// Get returns the value for k and marks it most recently used.
func (c *PeerCache[V]) Get(k netip.AddrPort) (V, bool) {
	e, ok := c.m[k]
	if !ok {
		var zero V
		return zero, false
	}
	c.touch(e)
	return e.Value.(*peerItem[V]).val, true
}

func (c *PeerCache[V]) push(k netip.AddrPort, v V, learned bool) {
	c.clock++
	it := &peerItem[V]{key: k, val: v, learned: learned, used: c.clock}
	c.m[k] = c.listOf(it).PushFront(it)
}

func (c *PeerCache[V]) evict(e *list.Element) {
	it := e.Value.(*peerItem[V])
	c.listOf(it).Remove(e)
	delete(c.m, it.key)
	if c.onEvict != nil {
		c.onEvict(it.key, it.val)
	}
}

// Put sets k's value (most recently used) as one this side resolved; a
// value it replaces is not passed to onEvict (the caller has it). It
// evicts the least recently used entries beyond max.
func (c *PeerCache[V]) Put(k netip.AddrPort, v V) {
	if e, ok := c.m[k]; ok {
		it := e.Value.(*peerItem[V])
		c.listOf(it).Remove(e)
		delete(c.m, k)
	}
	c.push(k, v, false)
	for c.Len() > c.max {
		victim := c.own.Back()
		if l := c.learned.Back(); l != nil && (victim == nil ||
			l.Value.(*peerItem[V]).used < victim.Value.(*peerItem[V]).used) {
			victim = l
		}
		c.evict(victim)
	}
}

// PutLearned caches v for k, an address not cached, as learnt from a
// datagram (most recently used). To make room it evicts the least
// recently used learnt entry, never one this side resolved: when the
// cache is full of those, it caches nothing and returns false.
func (c *PeerCache[V]) PutLearned(k netip.AddrPort, v V) bool {
	if _, ok := c.m[k]; ok {
		return false
	}
	for c.learned.Len() > 0 && (c.learned.Len() >= c.maxLearned || c.Len() >= c.max) {
		c.evict(c.learned.Back())
	}
	if c.learned.Len() >= c.maxLearned || c.Len() >= c.max {
		return false
	}
	c.push(k, v, true)
	return true
}

// Remove drops k without calling onEvict.
func (c *PeerCache[V]) Remove(k netip.AddrPort) {
	if e, ok := c.m[k]; ok {
		c.listOf(e.Value.(*peerItem[V])).Remove(e)
		delete(c.m, k)
	}
}

// Len is the number of entries (of both lists: m holds every entry).
func (c *PeerCache[V]) Len() int { return len(c.m) }

// LenLearned is the number of entries learnt from datagrams.
func (c *PeerCache[V]) LenLearned() int { return c.learned.Len() }

// Each calls f for every entry, most recently used first.
func (c *PeerCache[V]) Each(f func(netip.AddrPort, V)) {
	a, b := c.own.Front(), c.learned.Front()
	for a != nil || b != nil {
		e := a
		if a == nil || (b != nil && b.Value.(*peerItem[V]).used > a.Value.(*peerItem[V]).used) {
			e, b = b, b.Next()
		} else {
			a = a.Next()
		}
		it := e.Value.(*peerItem[V])
		f(it.key, it.val)
	}
}
