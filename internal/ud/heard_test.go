//go:build linux && cgo

package ud

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// hostEndpoint is an Endpoint with no device: enough of one for the
// receive path's header checks and peer-cache updates (ParseDatagram,
// heardLocked), whose peers have no address handle.
func hostEndpoint(ethernet bool, maxPeers int) *Endpoint[Datagram] {
	p := &Endpoint[Datagram]{ethernet: ethernet, replyBySIDR: !ethernet, maxPeers: maxPeers,
		maxPayload: 1000, qkey: 0x01234567, portNum: 1, ttlTicks: 1 << 40}
	p.gids = []verbs.GID{{Index: 1, Raw: netip.MustParseAddr("::ffff:10.0.0.1").As16(), Type: verbs.GIDTypeRoCEv2}}
	p.peers = NewPeerCache(maxPeers, p.evictLocked)
	return p
}

// resolvedPeer caches what this side's own resolution of addr found.
func resolvedPeer(p *Endpoint[Datagram], addr netip.AddrPort, qpn uint32, dlid uint16) *peerEntry {
	e := &peerEntry{addr: addr, qpn: qpn, qkey: p.qkey, maxPayload: 1000, resolved: true,
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
			p := hostEndpoint(ethernet, 8)
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
			got, ok := p.peers.Get(victim)
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
	p := hostEndpoint(true, 8)
	var mine []*peerEntry
	for i := range 4 {
		mine = append(mine, resolvedPeer(p, netip.AddrPortFrom(netip.MustParseAddr("10.0.0.3"), uint16(100+i)), uint32(10+i), 0))
	}
	src := netip.MustParseAddr("10.0.0.9")
	for port := 1; port <= 1000; port++ {
		p.heardLocked(netip.AddrPortFrom(src, uint16(port)), uint32(5000+port), 0, 1000, grhFrom(src))
	}
	for _, e := range mine {
		if got, ok := p.peers.Get(e.addr); !ok || got != e || e.evicted {
			t.Fatalf("resolved entry %v evicted by the flood", e.addr)
		}
	}
	if n := p.peers.Len(); n > 8 {
		t.Fatalf("%d entries, bound 8", n)
	}
	// The newest learnt sources are cached (up to half the cache).
	if _, ok := p.peers.Get(netip.AddrPortFrom(src, 1000)); !ok {
		t.Fatal("the latest source was not learnt")
	}
}
