package wire

// Datagrams (rdma.PacketConn): a UD queue pair's receive completion names
// the sender's GID and QP number, not the rdma_cm port its PacketConn is
// bound to, so every datagram starts with a small header that says who
// sent it (the address a reply goes to) and how large a datagram the sender
// accepts. docs/datagram-protocol.md describes the whole exchange:
// address resolution through rdma_cm's UDP port space (SIDR), the Q_Key,
// this header and how a receiver checks it against the GRH.
//
//	DatagramHeader (DatagramHeaderLen = 24 bytes, before the payload)
//	  off  size  field
//	    0     2  magic "GD" (0x4744)
//	    2     1  version (DatagramVersion, 1): a receiver drops other versions
//	    3     1  flags: none defined in version 1; sent as 0, ignored on receipt
//	    4     2  the sender's rdma_cm port (its PacketConn's, in RDMA_PS_UDP; >= 1)
//	    6     2  the largest payload the sender accepts (>= 1)
//	    8    16  the sender's IP address (IPv6, or IPv4-mapped ::ffff:a.b.c.d;
//	             not unspecified, not multicast)
//
// A receive buffer of a UD queue pair first gets the 40-byte GRH (RoCE and
// global IB routes): ParseGRH reads the addresses from it.

import (
	"encoding/binary"
	"net/netip"
)

// DatagramMagic opens every datagram header: "GD" big-endian.
const DatagramMagic uint16 = 0x4744

// DatagramVersion is the datagram header version this side sends and accepts.
const DatagramVersion uint8 = 1

// DatagramHeaderLen is the header's length; the payload follows it.
const DatagramHeaderLen = 24

// GRHLen is the size of the global route header a UD receive buffer starts with.
const GRHLen = 40

// DatagramHeader is what a datagram says about its sender.
type DatagramHeader struct {
	Port       uint16     // the sender's PacketConn port
	MaxPayload uint16     // the largest payload the sender accepts
	Addr       netip.Addr // the sender's IP address (unmapped on decode)
	Flags      uint8      // sent as 0 by version 1; unknown bits are ignored on receipt
}

// AddrPort is where a reply to the datagram goes.
func (h DatagramHeader) AddrPort() netip.AddrPort { return netip.AddrPortFrom(h.Addr, h.Port) }

// AppendTo appends the encoded header to b.
func (h DatagramHeader) AppendTo(b []byte) []byte {
	var out [DatagramHeaderLen]byte
	h.Put(out[:])
	return append(b, out[:]...)
}

// Put encodes the header into b[:DatagramHeaderLen] (b must be that long).
func (h DatagramHeader) Put(b []byte) {
	_ = b[DatagramHeaderLen-1]
	binary.BigEndian.PutUint16(b[0:], DatagramMagic)
	b[2] = DatagramVersion
	b[3] = h.Flags
	binary.BigEndian.PutUint16(b[4:], h.Port)
	binary.BigEndian.PutUint16(b[6:], h.MaxPayload)
	a := h.Addr.As16() // an IPv4 address becomes ::ffff:a.b.c.d
	copy(b[8:24], a[:])
}

// ParseDatagramHeader decodes the header at the start of b (bytes after it
// are the payload, not looked at). It never panics; its errors match
// ErrNotOurs (too short, wrong magic), ErrVersion (another header version)
// or ErrMalformed (a field out of range) under errors.Is.
func ParseDatagramHeader(b []byte) (DatagramHeader, error) {
	var h DatagramHeader
	if len(b) < DatagramHeaderLen {
		return h, errorf(ErrNotOurs, "not a verbline datagram (%d bytes, the header needs %d)", len(b), DatagramHeaderLen)
	}
	if m := binary.BigEndian.Uint16(b); m != DatagramMagic {
		return h, errorf(ErrNotOurs, "not a verbline datagram (magic 0x%04x)", m)
	}
	if v := b[2]; v != DatagramVersion {
		return h, errorf(ErrVersion, "verbline datagram header version %d, this side speaks %d", v, DatagramVersion)
	}
	h.Flags = b[3]
	h.Port = binary.BigEndian.Uint16(b[4:])
	h.MaxPayload = binary.BigEndian.Uint16(b[6:])
	h.Addr = netip.AddrFrom16([16]byte(b[8:24])).Unmap()
	switch {
	case h.Port == 0:
		return DatagramHeader{}, errorf(ErrMalformed, "datagram header: source port 0")
	case h.MaxPayload == 0:
		return DatagramHeader{}, errorf(ErrMalformed, "datagram header: largest payload 0")
	case h.Addr.IsUnspecified() || h.Addr.IsMulticast():
		return DatagramHeader{}, errorf(ErrMalformed, "datagram header: source address %s is not a unicast address", h.Addr)
	}
	return h, nil
}

// GRH is what ParseGRH reads from a global route header.
type GRH struct {
	// IPv4: the header is RoCE v2 over IPv4 (an IPv4 header in the last 20
	// of the 40 bytes); else an IPv6 header or an IB GRH.
	IPv4 bool
	// Src and Dst are the source and destination GIDs (IPv4-mapped for
	// IPv4, as the GID table holds them).
	Src, Dst [16]byte
	// TrafficClass (IPv6 / IB) or TOS (IPv4), and the hop limit or TTL.
	TrafficClass, HopLimit uint8
}

// SrcAddr is the source GID as an IP address (unmapped: an IPv4 sender's is IPv4).
func (g *GRH) SrcAddr() netip.Addr { return netip.AddrFrom16(g.Src).Unmap() }

// DstAddr is the destination GID as an IP address (unmapped).
func (g *GRH) DstAddr() netip.Addr { return netip.AddrFrom16(g.Dst).Unmap() }

// ParseGRH reads the 40-byte global route header a UD receive buffer starts
// with. For RoCE v2 over IPv4 the first 20 bytes are undefined and the IPv4
// header fills the last 20; it is told apart from an IPv6 header (or an IB
// GRH) the way libibverbs' ibv_init_ah_from_wc does: by the version nibble,
// and when both could be valid by the IPv4 header's length and checksum. It
// never panics; its errors match ErrMalformed.
func ParseGRH(b []byte) (GRH, error) {
	var g GRH
	if len(b) < GRHLen {
		return g, errorf(ErrMalformed, "global route header: %d bytes, want %d", len(b), GRHLen)
	}
	v6 := b[0]>>4 == 6
	ip4 := b[20:40]
	switch {
	case !v6 && ip4[0]>>4 == 4:
		g.IPv4 = true
	case !v6:
		return g, errorf(ErrMalformed, "global route header: neither IPv6 (version %d) nor IPv4 (version %d)", b[0]>>4, ip4[0]>>4)
	default:
		// An IPv6 header's version is 6; an IPv4 packet's first 20 bytes
		// are undefined and may hold a 6 there by chance: believe the IPv4
		// header when its length is 5 words and its checksum is right.
		g.IPv4 = ip4[0] == 0x45 && ipv4Checksum(ip4) == binary.BigEndian.Uint16(ip4[10:])
	}
	if g.IPv4 {
		g.TrafficClass, g.HopLimit = ip4[1], ip4[8]
		g.Src = netip.AddrFrom4([4]byte(ip4[12:16])).As16()
		g.Dst = netip.AddrFrom4([4]byte(ip4[16:20])).As16()
		return g, nil
	}
	g.TrafficClass = byte(binary.BigEndian.Uint32(b) >> 20)
	g.HopLimit = b[7]
	copy(g.Src[:], b[8:24])
	copy(g.Dst[:], b[24:40])
	return g, nil
}

// ipv4Checksum is the header checksum of the 20-byte IPv4 header h, computed
// with its checksum field taken as zero.
func ipv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i < 20; i += 2 {
		if i == 10 {
			continue
		}
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
