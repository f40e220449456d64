//go:build linux && cgo

package rdma

import (
	"fmt"
	"sync/atomic"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// Trailers: a connection on a device without immediate data (iWARP) carries
// each send's 32-bit header (kind and credits, wire.EncodeImm) as the last
// four bytes of its payload (docs/protocol.md, section 3). The views build
// their requests as everywhere else (SEND_WITH_IMM with the header in Imm);
// sqPushLocked turns each into a plain SEND whose second scatter/gather
// entry is the header, written into a slot of the connection's trailer
// ring that belongs to the request's send-queue position, so it stays put
// until the request retires and zero-copy payloads stay untouched. The
// receive side reads the header back from the end of the received bytes.
// A write with immediate becomes a write and a KindNotify message behind it
// (postOneSided).

// trailerSlot is the room per send-queue position in the trailer ring: a
// notify's payload (wire.NotifyLen) and the trailer, 8-byte aligned.
const trailerSlot = 16

// trailerAt is where the trailer sits in its slot: after a notify's payload.
const trailerAt = wire.NotifyLen

// forceTrailers, set by tests, makes every new connection require trailers
// as a device without immediate data does, so that the path runs on
// devices that have them.
var forceTrailers atomic.Bool

// needsTrailers reports whether this side must ask for trailers: its
// device cannot send or receive immediate data (decided once, in
// newEndpoint).
func (c *engine) needsTrailers() bool { return c.ep.needTrailers }

// startTrailers readies a connection that agreed on trailers: the trailer
// ring, one slot per send-queue position (in the rendezvous descriptors'
// buffer where this side needed trailers, else a buffer of its own), and
// the payload room of sends and inline requests, each a trailer smaller.
// Called from setPeer, before anything is posted.
func (c *engine) startTrailers() error {
	e := c.ep
	if e.needTrailers {
		e.trailers, e.trailerOff = e.rvDesc, e.trailerRingOff()
	} else {
		ring, err := c.dev.Pool.Get(len(c.sendq.entries) * trailerSlot)
		if err != nil {
			return err
		}
		e.trailers, e.trailerOff, e.ownTrailers = ring, 0, true
	}
	c.trailers = true
	c.peerBufSize -= wire.TrailerLen
	c.inlineMax = max(c.inlineMax-wire.TrailerLen, 0)
	return nil
}

// trailerLocked moves a send's header from its immediate data into a
// trailer, in the ring slot of send-queue position pos. Other requests
// pass unchanged. Called from sqPushLocked with c.mu held.
func (c *engine) trailerLocked(wr *verbs.SendWR, pos int) {
	if wr.Opcode != verbs.OpSendWithImm {
		return
	}
	ring := c.ep.trailers
	at := c.ep.trailerOff + pos*trailerSlot + trailerAt
	wire.PutTrailer(ring.Full()[at:at+wire.TrailerLen], wr.Imm)
	wr.Opcode, wr.Imm = verbs.OpSend, 0
	wr.TailAddr, wr.TailLen, wr.TailLKey = ring.Addr()+uint64(at), wire.TrailerLen, ring.LKey()
	if int(wr.Len)+wire.TrailerLen <= c.ep.maxInline {
		// Copied into the request at post time (the views inline payloads
		// up to inlineMax, which leaves room for the trailer, so this
		// never takes inlining back from a payload whose buffer they free).
		wr.Flags |= verbs.SendInline
	}
}

// notifyPayloadLocked writes a KindNotify message's payload (the user's
// immediate value and the write's length) into the ring slot of
// send-queue position pos and points wr at it. Called with c.mu held.
func (c *engine) notifyPayloadLocked(wr *verbs.SendWR, pos int, n wire.Notify) {
	ring := c.ep.trailers
	at := c.ep.trailerOff + pos*trailerSlot
	n.AppendTo(ring.Full()[at:at])
	wr.Addr, wr.Len, wr.LKey = ring.Addr()+uint64(at), wire.NotifyLen, ring.LKey()
}

// postWriteNotifyLocked posts a write with immediate on a connection with
// trailers: the RDMA WRITE of operation idx (its completion ends the
// operation, with the write's own error if it fails) and behind it, in
// the same post list, the KindNotify message carrying the immediate value
// (retired as a control message: it fails the connection if it fails).
// RC delivers the notify after the write's bytes are placed. Called with
// c.mu held; the caller checked that the send queue has room for both.
func (c *engine) postWriteNotifyLocked(wr verbs.SendWR, kind uint64, idx int, force bool) error {
	write := wr
	write.Opcode, write.Imm = verbs.OpRDMAWrite, 0
	c.sqPushLocked(&write, kind, idx, force)
	notify := verbs.SendWR{Opcode: verbs.OpSendWithImm, Imm: wire.EncodeImm(wire.KindNotify, uint32(c.stream.pending))}
	c.notifyPayloadLocked(&notify, c.sqNextPosLocked(), wire.Notify{Imm: wr.Imm, Len: wr.Len})
	c.sqPushLocked(&notify, wrSendCtl, 0, false)
	c.sendq.pair = [2]verbs.SendWR{write, notify}
	if err := c.postSendsLocked(c.sendq.pair[:]); err != nil {
		c.sqPopLocked(2)
		c.failLocked(err)
		return err
	}
	c.grantedLocked()
	return nil
}

// recvTrailer reads the header of a received send from its trailer: the
// payload's length and the header. A receive too short for a trailer, or
// longer than the posted receive (posted bytes of bufs[idx]), is malformed.
func recvTrailer(bufs []buffer.Buf, idx int, byteLen uint32, posted int) (uint32, uint32, error) {
	if int64(byteLen) > int64(posted) {
		// No device completes a receive with more than it posted.
		return 0, 0, fmt.Errorf("peer sent %d bytes into a %d-byte receive", byteLen, posted)
	}
	n, imm, err := wire.SplitTrailer(bufs[idx].Full()[:byteLen])
	return uint32(n), imm, err
}
