//go:build linux && cgo

package rdma

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

func TestPeerCacheLRU(t *testing.T) {
	ap := func(i int) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), uint16(i)) }
	var evicted []string
	c := newPeerCache[int](3, func(k netip.AddrPort, v int) { evicted = append(evicted, fmt.Sprint(k.Port(), "=", v)) })
	order := func() []uint16 {
		var out []uint16
		c.each(func(k netip.AddrPort, _ int) { out = append(out, k.Port()) })
		return out
	}
	for i := 1; i <= 3; i++ {
		c.put(ap(i), i*10)
	}
	if !slices.Equal(order(), []uint16{3, 2, 1}) || c.len() != 3 || len(evicted) != 0 {
		t.Fatalf("order %v, len %d, evicted %v", order(), c.len(), evicted)
	}
	if v, ok := c.get(ap(1)); !ok || v != 10 {
		t.Fatalf("get 1: %d %v", v, ok)
	}
	// 1 was used last: 2 is the least recently used and goes first.
	c.put(ap(4), 40)
	if !slices.Equal(order(), []uint16{4, 1, 3}) || !slices.Equal(evicted, []string{"2=20"}) {
		t.Fatalf("after put 4: order %v, evicted %v", order(), evicted)
	}
	if _, ok := c.get(ap(2)); ok {
		t.Fatal("evicted entry still found")
	}
	// Replacing a value neither evicts nor reports the old one.
	c.put(ap(3), 33)
	if v, _ := c.get(ap(3)); v != 33 || len(evicted) != 1 || !slices.Equal(order(), []uint16{3, 4, 1}) {
		t.Fatalf("replace: %d, evicted %v, order %v", v, evicted, order())
	}
	// remove does not report either.
	c.remove(ap(4))
	c.remove(ap(99))
	if c.len() != 2 || len(evicted) != 1 || !slices.Equal(order(), []uint16{3, 1}) {
		t.Fatalf("remove: len %d, evicted %v, order %v", c.len(), evicted, order())
	}
	// Many puts keep it at its bound, evicting in LRU order.
	for i := 10; i < 20; i++ {
		c.put(ap(i), i)
	}
	if c.len() != 3 || !slices.Equal(order(), []uint16{19, 18, 17}) || len(evicted) != 1+9 {
		t.Fatalf("bounded: len %d, order %v, %d evicted", c.len(), order(), len(evicted))
	}
}

// hostPacketConn is a PacketConn with no device: enough of one for the
// receive path's header checks and peer-cache updates (parseDatagram,
// heardLocked), whose peers have no address handle.
func hostPacketConn(ethernet bool, maxPeers int) *udEndpoint {
	p := &udEndpoint{ethernet: ethernet, replyBySIDR: !ethernet, maxPeers: maxPeers,
		maxPayload: 1000, qkey: 0x01234567, portNum: 1, ttlTicks: 1 << 40}
	p.gids = []verbs.GID{{Index: 1, Raw: netip.MustParseAddr("::ffff:10.0.0.1").As16(), Type: verbs.GIDTypeRoCEv2}}
	p.peers = newPeerCache(maxPeers, p.evictLocked)
	return p
}

// resolvedPeer caches what this side's own resolution of addr found.
func resolvedPeer(p *udEndpoint, addr netip.AddrPort, qpn uint32, dlid uint16) *udPeer {
	e := &udPeer{addr: addr, qpn: qpn, qkey: p.qkey, maxPayload: 1000, resolved: true,
		attr: verbs.AHAttr{DLID: dlid, IsGlobal: p.ethernet, DGID: addr.Addr().As16()}}
	p.addPeerLocked(e)
	return e
}

// grhFrom is the GRH of a RoCE v2 datagram from src to 10.0.0.1.
func grhFrom(src netip.Addr) *wire.GRH {
	return &wire.GRH{IPv4: true, Src: src.As16(), Dst: netip.MustParseAddr("::ffff:10.0.0.1").As16(), HopLimit: 64}
}

// TestPeerCacheForgedDatagram: a datagram changes only what it proves. On
// InfiniBand (the header's address unproven; the source LID and QP number
// given by the fabric) and on RoCE (the address proven by the GRH, the
// port not), a datagram claiming a destination this side resolved neither
// evicts nor rewrites that entry: not its QP number, not its max payload.
// A contradicting one only makes the next send resolve the address again.
func TestPeerCacheForgedDatagram(t *testing.T) {
	victim := netip.MustParseAddrPort("10.0.0.2:7000")
	for _, ethernet := range []bool{false, true} {
		t.Run(fmt.Sprint("ethernet=", ethernet), func(t *testing.T) {
			p := hostPacketConn(ethernet, 8)
			e := resolvedPeer(p, victim, 100, 5)
			var g *wire.GRH
			if ethernet {
				g = grhFrom(victim.Addr())
			}
			// Another node whose QP has the victim's number (IB: another
			// LID), announcing a 1-byte max payload.
			p.heardLocked(victim, 100, 9, 1, g)
			// Another QP claiming the victim's address.
			p.heardLocked(victim, 300, 9, 1000, g)
			got, ok := p.peers.get(victim)
			if !ok || got != e || e.evicted || e.qpn != 100 || e.maxPayload != 1000 {
				t.Fatalf("after forged datagrams: cached %v (same entry %v), evicted %v, qpn %d, maxPayload %d",
					ok, got == e, e.evicted, e.qpn, e.maxPayload)
			}
			if !e.doubted {
				t.Fatal("a contradicting datagram does not make the entry resolved again")
			}
		})
	}
}

// TestPeerCacheLearnedFlood: entries learnt from datagrams (RoCE) evict
// only each other and take at most half the cache: a flood of datagrams
// from many ports evicts no destination this side resolved.
func TestPeerCacheLearnedFlood(t *testing.T) {
	p := hostPacketConn(true, 8)
	var mine []*udPeer
	for i := range 4 {
		mine = append(mine, resolvedPeer(p, netip.AddrPortFrom(netip.MustParseAddr("10.0.0.3"), uint16(100+i)), uint32(10+i), 0))
	}
	src := netip.MustParseAddr("10.0.0.9")
	for port := 1; port <= 1000; port++ {
		p.heardLocked(netip.AddrPortFrom(src, uint16(port)), uint32(5000+port), 0, 1000, grhFrom(src))
	}
	for _, e := range mine {
		if got, ok := p.peers.get(e.addr); !ok || got != e || e.evicted {
			t.Fatalf("resolved entry %v evicted by the flood", e.addr)
		}
	}
	if n := p.peers.len(); n > 8 {
		t.Fatalf("%d entries, bound 8", n)
	}
	// The newest learnt sources are cached (up to half the cache).
	if _, ok := p.peers.get(netip.AddrPortFrom(src, 1000)); !ok {
		t.Fatal("the latest source was not learnt")
	}
}

// TestPeerCacheKinds: a put evicts the least recently used entry of either
// kind; a putLearned evicts only learnt entries, keeps them within half the
// cache, and caches nothing when entries this side resolved fill it.
func TestPeerCacheKinds(t *testing.T) {
	ap := func(i int) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), uint16(i)) }
	var evicted []uint16
	c := newPeerCache[int](4, func(k netip.AddrPort, _ int) { evicted = append(evicted, k.Port()) })
	c.put(ap(1), 1)
	for i := 2; i <= 4; i++ {
		if !c.putLearned(ap(i), i) {
			t.Fatalf("putLearned %d refused", i)
		}
	}
	// At most 4/2 learnt: 2 went for 4.
	if c.len() != 3 || c.lenLearned() != 2 || !slices.Equal(evicted, []uint16{2}) {
		t.Fatalf("len %d, learnt %d, evicted %v", c.len(), c.lenLearned(), evicted)
	}
	if c.putLearned(ap(3), 33) {
		t.Fatal("putLearned replaced a cached entry")
	}
	c.get(ap(1)) // 3 is now the least recently used
	c.put(ap(5), 5)
	c.put(ap(6), 6)
	if !slices.Equal(evicted, []uint16{2, 3}) || c.len() != 4 {
		t.Fatalf("put: evicted %v, len %d", evicted, c.len())
	}
	// A put of a learnt address makes it resolved.
	c.put(ap(4), 44)
	if c.lenLearned() != 0 || c.len() != 4 {
		t.Fatalf("after resolving 4: learnt %d, len %d", c.lenLearned(), c.len())
	}
	if c.putLearned(ap(7), 7) || c.len() != 4 || len(evicted) != 2 {
		t.Fatalf("a full cache of resolved entries took a learnt one: len %d, evicted %v", c.len(), evicted)
	}
	var order []uint16
	c.each(func(k netip.AddrPort, _ int) { order = append(order, k.Port()) })
	if !slices.Equal(order, []uint16{4, 6, 5, 1}) {
		t.Fatalf("order %v", order)
	}
}
