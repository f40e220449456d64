package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
)

func validDatagramHeader() DatagramHeader {
	return DatagramHeader{Port: 7471, MaxPayload: 1000, Addr: netip.MustParseAddr("169.254.77.1")}
}

func TestDatagramHeaderRoundTrip(t *testing.T) {
	for _, h := range []DatagramHeader{
		validDatagramHeader(),
		{Port: 1, MaxPayload: 1, Addr: netip.MustParseAddr("fe80::1")},
		{Port: 65535, MaxPayload: 65535, Addr: netip.MustParseAddr("10.0.0.2"), Flags: 0x80},
	} {
		b := h.AppendTo([]byte("prefix"))
		if len(b) != len("prefix")+DatagramHeaderLen {
			t.Fatalf("encoded %d bytes", len(b)-len("prefix"))
		}
		got, err := ParseDatagramHeader(append(b[len("prefix"):], "payload"...))
		if err != nil {
			t.Fatalf("%+v: %v", h, err)
		}
		if got != h {
			t.Fatalf("decoded %+v, want %+v", got, h)
		}
		if got.AddrPort() != netip.AddrPortFrom(h.Addr, h.Port) {
			t.Fatalf("AddrPort %v", got.AddrPort())
		}
	}
	// The layout is the documented one.
	b := validDatagramHeader().AppendTo(nil)
	want := []byte{'G', 'D', 1, 0, 0x1d, 0x2f, 0x03, 0xe8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 169, 254, 77, 1}
	if !bytes.Equal(b, want) {
		t.Fatalf("encoded % x\nwant    % x", b, want)
	}
}

func TestDatagramHeaderErrors(t *testing.T) {
	good := validDatagramHeader().AppendTo(nil)
	mod := func(f func([]byte)) []byte {
		b := bytes.Clone(good)
		f(b)
		return b
	}
	for _, c := range []struct {
		name string
		b    []byte
		kind error
	}{
		{"empty", nil, ErrNotOurs},
		{"short", good[:DatagramHeaderLen-1], ErrNotOurs},
		{"magic", mod(func(b []byte) { b[0] = 'X' }), ErrNotOurs},
		{"version", mod(func(b []byte) { b[2] = 2 }), ErrVersion},
		{"port 0", mod(func(b []byte) { b[4], b[5] = 0, 0 }), ErrMalformed},
		{"max payload 0", mod(func(b []byte) { b[6], b[7] = 0, 0 }), ErrMalformed},
		{"unspecified", mod(func(b []byte) { copy(b[8:], make([]byte, 16)) }), ErrMalformed},
		{"v4 unspecified", mod(func(b []byte) { copy(b[20:], []byte{0, 0, 0, 0}) }), ErrMalformed},
		{"multicast", mod(func(b []byte) { copy(b[20:], []byte{224, 0, 0, 1}) }), ErrMalformed},
	} {
		_, err := ParseDatagramHeader(c.b)
		if !errors.Is(err, c.kind) {
			t.Errorf("%s: %v, want %v", c.name, err, c.kind)
		}
	}
}

// ipv4GRH is a RoCE v2 receive buffer's first 40 bytes for an IPv4 packet:
// 20 undefined bytes (filled with fill), then the IPv4 header.
func ipv4GRH(fill byte, src, dst [4]byte) []byte {
	b := bytes.Repeat([]byte{fill}, GRHLen)
	h := b[20:]
	h[0] = 0x45
	h[1] = 0x02 // TOS
	binary.BigEndian.PutUint16(h[2:], 20+8+12+24+64+4)
	h[8] = 64 // TTL
	h[9] = 17 // UDP
	copy(h[12:], src[:])
	copy(h[16:], dst[:])
	binary.BigEndian.PutUint16(h[10:], 0)
	binary.BigEndian.PutUint16(h[10:], ipv4Checksum(h))
	return b
}

func ipv6GRH(src, dst netip.Addr, tclass, hop uint8) []byte {
	b := make([]byte, GRHLen)
	binary.BigEndian.PutUint32(b, 6<<28|uint32(tclass)<<20|0x12345)
	binary.BigEndian.PutUint16(b[4:], 100)
	b[6] = 0x1b
	b[7] = hop
	s, d := src.As16(), dst.As16()
	copy(b[8:], s[:])
	copy(b[24:], d[:])
	return b
}

func TestParseGRH(t *testing.T) {
	src, dst := [4]byte{169, 254, 77, 2}, [4]byte{169, 254, 77, 1}
	// Undefined bytes that look like IPv6 (version nibble 6) must not fool
	// the parser: the IPv4 header's checksum decides.
	for _, fill := range []byte{0, 0x60, 0xff} {
		g, err := ParseGRH(ipv4GRH(fill, src, dst))
		if err != nil {
			t.Fatal(err)
		}
		if !g.IPv4 || g.SrcAddr() != netip.AddrFrom4(src) || g.DstAddr() != netip.AddrFrom4(dst) || g.HopLimit != 64 || g.TrafficClass != 2 {
			t.Fatalf("fill %#x: %+v (src %v dst %v)", fill, g, g.SrcAddr(), g.DstAddr())
		}
		if g.Src != netip.AddrFrom4(src).As16() {
			t.Fatalf("source GID %x is not IPv4-mapped", g.Src)
		}
	}
	// A corrupt IPv4 checksum behind an IPv6-looking start: IPv6.
	b := ipv4GRH(0x60, src, dst)
	b[30] ^= 1
	if g, err := ParseGRH(b); err != nil || g.IPv4 {
		t.Fatalf("bad checksum: %+v, %v", g, err)
	}
	s6, d6 := netip.MustParseAddr("fe80::2"), netip.MustParseAddr("fe80::1")
	g, err := ParseGRH(ipv6GRH(s6, d6, 0xa0, 255))
	if err != nil {
		t.Fatal(err)
	}
	if g.IPv4 || g.SrcAddr() != s6 || g.DstAddr() != d6 || g.TrafficClass != 0xa0 || g.HopLimit != 255 {
		t.Fatalf("IPv6: %+v", g)
	}
	for _, bad := range [][]byte{nil, make([]byte, 39), make([]byte, 40)} {
		if _, err := ParseGRH(bad); !errors.Is(err, ErrMalformed) {
			t.Fatalf("%d bytes: %v", len(bad), err)
		}
	}
}

func FuzzParseDatagramHeader(f *testing.F) {
	good := validDatagramHeader().AppendTo(nil)
	f.Add(good)
	f.Add(append(bytes.Clone(good), "payload"...))
	f.Add(good[:10])
	f.Add([]byte{})
	f.Add(make([]byte, DatagramHeaderLen))
	v2 := bytes.Clone(good)
	v2[2] = 2
	f.Add(v2)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseDatagramHeader(b)
		if err != nil {
			if !errors.Is(err, ErrNotOurs) && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrMalformed) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if h.Port == 0 || h.MaxPayload == 0 || !h.Addr.IsValid() || h.Addr.Is4In6() || h.Addr.IsUnspecified() || h.Addr.IsMulticast() {
			t.Fatalf("accepted an invalid header %+v", h)
		}
		// What was accepted encodes back to the same header bytes (an
		// IPv4-mapped address decodes unmapped and encodes mapped again).
		if again := h.AppendTo(nil); !bytes.Equal(again, b[:DatagramHeaderLen]) {
			t.Fatalf("re-encoded % x, input % x", again, b[:DatagramHeaderLen])
		}
	})
}

func FuzzParseGRH(f *testing.F) {
	f.Add(ipv4GRH(0, [4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}))
	f.Add(ipv4GRH(0x60, [4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}))
	f.Add(ipv6GRH(netip.MustParseAddr("fe80::2"), netip.MustParseAddr("fe80::1"), 0, 64))
	f.Add([]byte{})
	f.Add(make([]byte, GRHLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := ParseGRH(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if len(b) < GRHLen {
			t.Fatalf("accepted %d bytes", len(b))
		}
		if g.IPv4 {
			// An IPv4 sender's GIDs are IPv4-mapped and its header is
			// where RoCE v2 puts it.
			if !netip.AddrFrom16(g.Src).Is4In6() || !netip.AddrFrom16(g.Dst).Is4In6() || b[20]>>4 != 4 {
				t.Fatalf("IPv4 GRH %+v from % x", g, b[:GRHLen])
			}
			return
		}
		if b[0]>>4 != 6 || !bytes.Equal(g.Src[:], b[8:24]) || !bytes.Equal(g.Dst[:], b[24:40]) {
			t.Fatalf("IPv6 GRH %+v from % x", g, b[:GRHLen])
		}
	})
}
