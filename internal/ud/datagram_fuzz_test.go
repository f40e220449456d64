package ud

import (
	"net/netip"
	"testing"

	"github.com/verbline/rdma/internal/wire"
)

// FuzzParseDatagram: arbitrary GRH and header bytes, lengths and flags.
// Invariants: no panic; an accepted datagram fits the buffers posted, its
// header parses again to the same value, and on RoCE it came with a GRH
// whose source is the header's address.
func FuzzParseDatagram(f *testing.F) {
	h := wire.DatagramHeader{Port: 7000, MaxPayload: 1000, Addr: netip.MustParseAddr("10.0.0.2")}
	valid := make([]byte, HdrSlot)
	valid[0] = 6 << 4
	valid[7] = 64
	src := netip.AddrFrom16(h.Addr.As16()).As16()
	copy(valid[8:24], src[:])
	copy(valid[wire.GRHLen:], h.AppendTo(nil))
	f.Add(valid, uint32(HdrSlot+10), 1000, true, true)
	f.Add(valid, uint32(HdrSlot+10), 1000, false, false)
	f.Add(valid[:10], uint32(5), 0, true, true)
	f.Fuzz(func(t *testing.T, slot []byte, byteLen uint32, room int, hasGRH, ethernet bool) {
		got, g, ok := ParseDatagram(slot, byteLen, room, hasGRH, ethernet)
		if !ok {
			return
		}
		if byteLen < HdrSlot || int64(byteLen)-HdrSlot > int64(room) || len(slot) < HdrSlot {
			t.Fatalf("accepted %d bytes (%d in the slot) into a %d-byte buffer", byteLen, len(slot), room)
		}
		again, err := wire.ParseDatagramHeader(slot[wire.GRHLen:HdrSlot])
		if err != nil || again != got {
			t.Fatalf("accepted header %+v parses again as %+v, %v", got, again, err)
		}
		if ethernet && (!hasGRH || g.SrcAddr() != got.Addr) {
			t.Fatalf("on RoCE accepted a datagram from %v claiming %v (GRH %v)", g.SrcAddr(), got.Addr, hasGRH)
		}
	})
}
