package ud

import "github.com/verbline/rdma/internal/wire"

// HdrSlot is each receive's first scatter/gather entry: the GRH the
// device writes, then the datagram header. The payload goes to a buffer
// of its own, which a Datagram hands to the user as it is.
const HdrSlot = wire.GRHLen + wire.DatagramHeaderLen

// ParseDatagram checks a received datagram: slot is its receive's first
// scatter/gather entry (the GRH, then the datagram header), byteLen the
// completion's length (GRH included), room the payload buffer's size,
// hasGRH whether the completion says a GRH came with it. It returns the
// datagram's header and, on RoCE (ethernet), its GRH, the IP header the
// network delivered; false for a datagram to drop: shorter than the
// header, longer than the buffers posted (no device reports that), a
// malformed header, or on RoCE no GRH or a GRH whose source is not the
// header's address (a sender claiming another address than the one it
// sent from). On InfiniBand the header's address is unproven (a GRH does
// not carry the sender's LID): the endpoint trusts only the completion's
// source LID and QP number.
func ParseDatagram(slot []byte, byteLen uint32, room int, hasGRH, ethernet bool) (wire.DatagramHeader, wire.GRH, bool) {
	if byteLen < HdrSlot || int64(byteLen)-HdrSlot > int64(room) || len(slot) < HdrSlot {
		return wire.DatagramHeader{}, wire.GRH{}, false
	}
	h, err := wire.ParseDatagramHeader(slot[wire.GRHLen:HdrSlot])
	if err != nil {
		return wire.DatagramHeader{}, wire.GRH{}, false
	}
	if !ethernet {
		return h, wire.GRH{}, true
	}
	if !hasGRH {
		return wire.DatagramHeader{}, wire.GRH{}, false
	}
	g, err := wire.ParseGRH(slot[:wire.GRHLen])
	if err != nil || g.SrcAddr() != h.Addr {
		return wire.DatagramHeader{}, wire.GRH{}, false
	}
	return h, g, true
}
