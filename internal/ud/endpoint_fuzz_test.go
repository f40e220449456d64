//go:build linux && cgo

package ud

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// Fuzzing the datagram receive path: recvLocked on an Endpoint with no
// device (its receive ring from an unregistered pool), fed completions
// whose GRH, datagram header, length, source QP and source LID come from
// the fuzzer.

const (
	fuzzRecv     = 4
	fuzzMaxPeers = 8
	fuzzRoom     = 1000 // payload buffer size (the Soft-RoCE MTU's payload)
)

var (
	fuzzLocal    = netip.MustParseAddr("10.0.0.1")
	fuzzResolved = netip.MustParseAddr("10.0.0.2") // the host of the entries this side resolved
)

// fuzzEndpoint is hostEndpoint with a receive ring and three entries
// this side resolved (10.0.0.2:7000..7002, QPs 100..102, LIDs 5..7).
// Its buffers go back to pool at the test's end.
func fuzzEndpoint(t *testing.T, pool *buffer.Pool, ethernet bool) (*Endpoint[Datagram], []*peerEntry) {
	p := hostEndpoint(ethernet, fuzzMaxPeers)
	var err error
	if p.recvHdr, err = pool.Get(fuzzRecv * HdrSlot); err != nil {
		t.Fatal(err)
	}
	for range fuzzRecv {
		b, err := pool.Get(fuzzRoom)
		if err != nil {
			t.Fatal(err)
		}
		p.recv = append(p.recv, b)
	}
	t.Cleanup(func() {
		p.recvHdr.Release()
		for _, b := range p.recv {
			b.Release()
		}
	})
	p.lent = make([]bool, fuzzRecv)
	p.msgs = make(chan Datagram, fuzzRecv)
	var mine []*peerEntry
	for i := range 3 {
		mine = append(mine, resolvedPeer(p, netip.AddrPortFrom(fuzzResolved, uint16(7000+i)), uint32(100+i), uint16(5+i)))
	}
	return p, mine
}

// fuzzGRH writes an IPv6 GRH from src to fuzzLocal (as RoCE v2 delivers one
// from an IPv4-mapped GID).
func fuzzGRH(slot []byte, src netip.Addr) {
	clear(slot[:wire.GRHLen])
	slot[0] = 6 << 4
	slot[7] = 64
	s16 := netip.AddrFrom16(src.As16()).As16()
	d16 := fuzzLocal.As16()
	copy(slot[8:24], s16[:])
	copy(slot[24:40], d16[:])
}

// fuzzAddrs are the addresses a forced-valid datagram claims.
var fuzzAddrs = []netip.Addr{fuzzResolved, netip.MustParseAddr("10.0.0.9"), fuzzLocal}

// FuzzDatagramReceive: arbitrary bytes in, as a series of receive
// completions. Each record is a mode byte, the source QP (4 bytes), the
// source LID (2), the completion's length (2) and the 64 bytes of GRH and
// header. Mode bits: 0 the completion has a GRH, 1 rewrite the header as a
// valid one (addressed from bits 4-5, the port and max payload from the
// record), 2 rewrite the GRH as one from the header's address, 3 bound the
// length to what a device reports, 6 give it the source QP and LID of the
// entry for the address claimed, 7 a failed completion. Invariants: no
// panic; a valid datagram (bits 1, 3, and on RoCE 0 and 2) is delivered
// whole with its sender; every other completion is delivered only if
// ParseDatagram accepts it and is otherwise counted as dropped and its
// buffer reposted; the cache stays within its bounds (learnt entries
// within half of it, none on InfiniBand) and the entries this side
// resolved stay, unchanged, whatever the datagrams claim.
func FuzzDatagramReceive(f *testing.F) {
	rec := func(mode byte, qp uint32, lid, n uint16, slot []byte) []byte {
		b := []byte{mode}
		b = binary.BigEndian.AppendUint32(b, qp)
		b = binary.BigEndian.AppendUint16(b, lid)
		b = binary.BigEndian.AppendUint16(b, n)
		s := make([]byte, HdrSlot)
		copy(s, slot)
		return append(b, s...)
	}
	valid := make([]byte, HdrSlot)
	wire.DatagramHeader{Port: 7000, MaxPayload: 1, Addr: fuzzResolved}.Put(valid[wire.GRHLen:])
	fuzzGRH(valid, fuzzResolved)
	f.Add(false, rec(0x0b, 300, 9, 80, valid))                                     // IB: a forged source for a resolved entry
	f.Add(true, rec(0x0f, 300, 0, 80, valid))                                      // RoCE: another QP claims a resolved port
	f.Add(true, append(rec(0x4f, 0, 0, 64, valid), rec(0x1f, 7, 0, 1064, nil)...)) // matching, then learnt from 10.0.0.9
	f.Add(false, rec(0x80, 1, 1, 100, valid))                                      // a failed completion
	f.Add(true, rec(0x01, 1, 1, 63, valid))                                        // shorter than the header
	f.Add(true, rec(0x01, 1, 1, 0xffff, valid))                                    // longer than the buffers
	f.Add(true, rec(0x00, 1, 1, 80, valid))                                        // RoCE without a GRH
	f.Add(false, []byte("GD\x01\x00 arbitrary"))
	var flood []byte
	for i := range 40 {
		flood = append(flood, rec(0x1f|byte(i%3)<<4&0x30, uint32(1000+i), 0, uint16(64+i), nil)...)
	}
	f.Add(true, flood)
	if !(&verbs.WC{Flags: 1}).HasGRH() {
		f.Fatal("IBV_WC_GRH is not 1")
	}
	pool, err := buffer.NewPool(nil, buffer.Options{Classes: []int{fuzzRoom}, SlabSize: 64 << 10, MaxBytes: 1 << 20})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, ethernet bool, data []byte) {
		p, mine := fuzzEndpoint(t, pool, ethernet)
		want := make([]peerEntry, len(mine))
		for i, e := range mine {
			want[i] = *e
		}
		const recLen = 9 + HdrSlot
		for step := 0; len(data) > 0 && step < 64; step++ {
			r := make([]byte, recLen)
			data = data[copy(r, data):]
			mode := r[0]
			wc := verbs.WC{WRID: wrRecv | uint64(step%fuzzRecv), Status: verbs.WCSuccess,
				SrcQP: binary.BigEndian.Uint32(r[1:]) & 0xffffff, SLID: uint32(binary.BigEndian.Uint16(r[5:])),
				ByteLen: uint32(binary.BigEndian.Uint16(r[7:]))}
			slot := r[9:]
			if mode&1 != 0 {
				wc.Flags |= 1
			}
			claim := netip.AddrPortFrom(fuzzAddrs[int(mode>>4&3)%len(fuzzAddrs)], 7000+uint16(slot[0]%4))
			if mode&2 != 0 {
				wire.DatagramHeader{Port: claim.Port(), MaxPayload: max(1, binary.BigEndian.Uint16(slot[2:])),
					Addr: claim.Addr()}.Put(slot[wire.GRHLen:])
			}
			if mode&4 != 0 {
				if h, err := wire.ParseDatagramHeader(slot[wire.GRHLen:]); err == nil {
					fuzzGRH(slot, h.Addr)
				}
			}
			if mode&8 != 0 {
				wc.ByteLen = HdrSlot + wc.ByteLen%(fuzzRoom+1)
			}
			if mode&0x40 != 0 {
				if e, ok := p.peers.Get(claim); ok {
					wc.SrcQP, wc.SLID = e.qpn, uint32(e.attr.DLID)
				}
			}
			if mode&0x80 != 0 {
				wc.Status = verbs.WCLocLenErr
			}
			idx := int(wc.WRID & wrIdxMask)
			hdrSlot := p.recvHdr.Full()[idx*HdrSlot : (idx+1)*HdrSlot]
			copy(hdrSlot, slot)
			wellFormed := mode&0x8a == 0x0a && (!ethernet || mode&5 == 5)
			h, _, accepted := ParseDatagram(slot, wc.ByteLen, fuzzRoom, wc.HasGRH(), ethernet)
			if wellFormed && !accepted {
				t.Fatalf("step %d: a valid datagram (mode %#x, %d bytes) is not accepted", step, mode, wc.ByteLen)
			}
			dropped := p.dropped.Load()
			p.recvWRs = p.recvWRs[:0]
			p.recvLocked(&wc, idx)
			select {
			case d := <-p.msgs:
				if wc.Status != verbs.WCSuccess || !accepted {
					t.Fatalf("step %d: delivered a datagram ParseDatagram refuses (mode %#x)", step, mode)
				}
				if d.From != h.AddrPort() || d.Buf.Len() != int(wc.ByteLen)-HdrSlot || d.Buf.Len() < 0 {
					t.Fatalf("step %d: delivered %d bytes from %v; want %d from %v", step, d.Buf.Len(), d.From, int(wc.ByteLen)-HdrSlot, h.AddrPort())
				}
				p.lent[idx] = false // taken back, as recycleRecv does
			default:
				if wc.Status == verbs.WCSuccess && accepted {
					t.Fatalf("step %d: a datagram ParseDatagram accepts was not delivered (mode %#x)", step, mode)
				}
				if p.dropped.Load() != dropped+1 || len(p.recvWRs) != 1 {
					t.Fatalf("step %d: a refused datagram: dropped %d -> %d, %d reposted", step, dropped, p.dropped.Load(), len(p.recvWRs))
				}
			}
			if n, l := p.peers.Len(), p.peers.LenLearned(); n > fuzzMaxPeers || l > fuzzMaxPeers/2 || (!ethernet && l > 0) {
				t.Fatalf("step %d: %d entries, %d learnt", step, n, l)
			}
			for i, e := range mine {
				if got := cachedPeer(p, e.addr); got != e || e.evicted || e.qpn != want[i].qpn ||
					e.maxPayload != want[i].maxPayload || e.attr != want[i].attr || !e.resolved {
					t.Fatalf("step %d: the resolved entry for %v changed: %+v, was %+v", step, e.addr, *e, want[i])
				}
			}
			p.peers.Each(func(_ netip.AddrPort, e *peerEntry) {
				if e.maxPayload < 1 || e.maxPayload > p.maxPayload {
					t.Fatalf("step %d: entry for %v accepts %d bytes", step, e.addr, e.maxPayload)
				}
			})
		}
	})
}

// cachedPeer is the entry cached for addr, nil if none, without marking it
// used (a Get would change the cache's order under test).
func cachedPeer(p *Endpoint[Datagram], addr netip.AddrPort) *peerEntry {
	var found *peerEntry
	p.peers.Each(func(k netip.AddrPort, e *peerEntry) {
		if k == addr {
			found = e
		}
	})
	return found
}
