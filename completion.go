//go:build linux && cgo

package rdma

import (
	"fmt"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// handleCompletions applies a batch of completions to the connection's state,
// counts what arrived for the metrics and wakes waiters once. The device's
// poller calls it; it never blocks on a user (delivery channels are sized so
// a send into them cannot block).
func (c *engine) handleCompletions(wcs []verbs.WC) {
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return
	}
	c.recvWRs = c.recvWRs[:0]
	c.stream.uncredited = 0
	heard, recvs := false, false
	for i := range wcs {
		wc := &wcs[i]
		idx := int(wc.WRID & wrIdxMask)
		if wc.WRID&wrKindMask == wrRecv {
			c.recvPosted--
			heard = heard || wc.Status == verbs.WCSuccess
			recvs = true
			c.recvLocked(wc, idx)
			continue
		}
		c.sqRetireLocked(idx, wc) // send queue: idx is the request's position
	}
	if recvs && c.firstHeard != nil && !missFirst(heard) {
		// A message, or the flush of a connection that ended first (a
		// received message completes before the flushes behind it).
		c.firstEnded = !heard
		c.firstHeard()
		c.firstHeard = nil
	}
	if heard && !c.peerHeard {
		c.peerHeard = true
	}
	if heard && c.ka.timer != nil {
		c.ka.lastHeard = time.Now() // once per batch, and only with keepalive on
	}
	c.repostLocked()
	c.maybeSendCreditsLocked()
	if len(c.rdv.inval) > 0 || len(c.rdv.doneQ) > 0 || c.rdv.stalled > 0 {
		c.pumpRendezvousLocked() // completions made send-queue room
	}
	if (c.stream.eof && c.rdv.inLen == 0) || c.stream.rerr != nil {
		c.closeMessagesLocked() // the peer finished, or receives failed: no more messages
	}
	c.broadcast()
	c.counts.addArrived(&c.arrived)
	rel := c.toRelease
	c.toRelease = c.toRelease[:0]
	c.mu.Unlock()
	// Released outside c.mu: a Buf received on another connection and sent
	// on here recycles into that connection, which takes its own lock.
	for i := range rel {
		rel[i].Release()
		rel[i] = buffer.Buf{}
	}
}

// sendDoneLocked finishes one retired send-queue request: each kind goes
// to the view that posted it.
func (c *engine) sendDoneLocked(e sqEntry, wc *verbs.WC) {
	switch e.kind {
	case wrSendData:
		c.dataSentLocked(e.idx, wc)
	case wrSendCtl, wrSendRv, wrBind:
		c.sendFailedLocked(wc)
	case wrSendUnc:
		c.creditUpdateSentLocked(wc)
	case wrSendMsg:
		c.sendFailedLocked(wc)
		c.msgDoneLocked(e.idx, wcErr(wc))
	case wrInval:
		c.invalidatedLocked(e.idx, wc)
	case wrReadRv:
		c.readDoneLocked(e.idx, wc)
	case wrOneSided:
		c.oneSidedDoneLocked(e.idx, wc, &c.toRelease)
	}
}

// msgDoneLocked ends the zero-copy send in slot idx: the NIC (or, for a
// large message, the peer) is done with its buffer.
func (c *engine) msgDoneLocked(idx int, err error) {
	c.toRelease = append(c.toRelease, c.msgs.inFlight[idx])
	c.msgs.inFlight[idx] = buffer.Buf{}
	c.msgs.free = append(c.msgs.free, idx)
	if c.msgs.async[idx] {
		c.rma.asyncOut--
		c.rma.oq.Push(OpCompletion{ID: c.msgs.id[idx], Err: err})
	}
}

// recvLocked handles one receive completion for receive buffer idx.
func (c *engine) recvLocked(wc *verbs.WC, idx int) {
	if wc.Status != verbs.WCSuccess {
		c.recvFailedLocked(wc)
		return
	}
	if wc.Opcode == verbs.WCRecvRDMAWithImm {
		// The peer's WriteRemoteImm: the immediate is the user's, the
		// receive buffer is held by the notification until it is released.
		// After the end (a protocol error, or a peer writing after its
		// FIN) Notifications() is closed: drop it, repost the buffer.
		if !c.peerSpentLocked() {
			return
		}
		if c.msgs.closed {
			c.recvWRs = append(c.recvWRs, c.ep.recvWR(idx))
			return
		}
		c.deliverNotificationLocked(idx, wc.Imm, wc.ByteLen)
		return
	}
	credits, n, act := c.admitRecvLocked(wc, idx)
	switch act {
	case rxFailed:
		return
	case rxControl:
		// A credit update or probe, in a receive kept for them beyond the
		// credits: repost that without granting a credit.
		c.stream.uncredited++
		c.recvWRs = append(c.recvWRs, c.ep.recvWR(idx))
		return
	case rxRendezvousDone:
		// It came in a receive kept for it beyond the credits: repost that
		// without granting a credit.
		c.rendezvousDoneLocked(credits)
		c.stream.uncredited++
		c.recvWRs = append(c.recvWRs, c.ep.recvWR(idx))
		return
	case rxData:
		tail := (c.stream.rqHead + c.stream.rqLen) % len(c.stream.rq)
		c.stream.rq[tail] = rxMsg{buf: idx, n: int(n)}
		c.stream.rqLen++
		c.arrived.bytes += uint64(n)
		return
	case rxMessage:
		c.deliverMessageLocked(idx, int(n))
		c.arrived.bytes += uint64(n)
		c.arrived.msgs++
		return
	case rxRendezvous:
		c.rendezvousInLocked(idx, int(n))
		c.arrived.msgs++ // its bytes when the READ completes (readDoneLocked)
		return
	case rxNotify:
		// A write with immediate on a connection with trailers: the
		// notify's payload carries the immediate value and the length.
		note, err := wire.ParseNotify(c.ep.recv[idx].Full()[:n])
		if err != nil {
			c.failLocked(fmt.Errorf("%w: %w", ErrProtocol, err))
			return
		}
		c.deliverNotificationLocked(idx, note.Imm, note.Len)
		return
	case rxFIN:
		c.stream.eof = true
	}
	// Control messages carry no bytes to hold: repost at once.
	c.recvWRs = append(c.recvWRs, c.ep.recvWR(idx))
}

// rxAction is what a received send asks of the connection (recvLocked).
type rxAction uint8

const (
	rxFailed         rxAction = iota // malformed or beyond an allowance: the connection failed with ErrProtocol
	rxControl                        // a credit update or probe in the control reserve: repost, no credit spent
	rxRendezvousDone                 // the peer read a large message: its id is in the credits field
	rxData                           // stream bytes: queue the receive buffer
	rxMessage                        // a message: deliver the receive buffer
	rxRendezvous                     // a large message's announcement: read it
	rxNotify                         // a write's notify (trailers): deliver it as a Notification
	rxFIN                            // the peer sends no more: repost
	// rxRepost: it spent a credit and carries nothing to hold (a credit
	// update or probe without the control reserve, empty data, anything
	// after the end): repost.
	rxRepost
)

// rxView is the part of a connection's state classifyRecv reads.
type rxView struct {
	controlReserve bool // FeatureControlReserve was negotiated
	trailers       bool // headers travel in trailers (the header was read from one)
	eof            bool // the peer's FIN arrived
	msgsClosed     bool // messages end (a failure, or the end reached)
	room           int  // the receive buffers' posted length (less a trailer with trailers)
}

// classifyRecv is the decision of recvLocked for a successful receive
// completion of a send (not an RDMA write with immediate), as a pure
// function: from the message's header (hasImm: the completion had one, or
// it was read from the trailer), the length of its payload and the
// connection's view, the message's kind, the credits it returns (a
// rendezvous done's id) and what it asks. A malformed completion (no
// header, an unknown kind, more bytes than a receive holds, a notify on a
// connection without trailers) yields rxFailed and an error matching
// ErrProtocol. It does not check credits and allowances (admitRecvLocked
// does).
func classifyRecv(hasImm bool, imm, byteLen uint32, v rxView) (wire.Kind, uint32, rxAction, error) {
	if !hasImm {
		return 0, 0, rxFailed, fmt.Errorf("%w: peer sent a message without a header", ErrProtocol)
	}
	kind, credits, err := wire.DecodeImm(imm)
	if err != nil {
		return 0, 0, rxFailed, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	if int64(byteLen) > int64(v.room) {
		// No device completes a receive with more than it posted.
		return 0, 0, rxFailed, fmt.Errorf("%w: peer sent %d bytes into a %d-byte receive", ErrProtocol, byteLen, v.room)
	}
	if kind == wire.KindNotify && !v.trailers {
		return 0, 0, rxFailed, fmt.Errorf("%w: peer sent a notify on a connection without trailers", ErrProtocol)
	}
	switch {
	case (kind == wire.KindKeepalive || kind == wire.KindCredit) && v.controlReserve:
		return kind, credits, rxControl, nil
	case kind == wire.KindRendezvousDone:
		return kind, credits, rxRendezvousDone, nil
	case kind == wire.KindData && byteLen > 0 && !v.eof:
		return kind, credits, rxData, nil
	case kind == wire.KindMessage && !v.eof && !v.msgsClosed:
		return kind, credits, rxMessage, nil
	case kind == wire.KindRendezvous && !v.eof && !v.msgsClosed:
		return kind, credits, rxRendezvous, nil
	case kind == wire.KindNotify && !v.msgsClosed:
		return kind, credits, rxNotify, nil
	case kind == wire.KindFIN:
		return kind, credits, rxFIN, nil
	}
	return kind, credits, rxRepost, nil
}

// admitRecvLocked classifies a successful receive completion of a send
// into receive buffer idx (classifyRecv, with the header from the
// immediate data or, on a connection with trailers, from the payload's
// end) and applies its credits: a credit update or probe in the control
// reserve is checked against its allowance; every other kind but
// rendezvous done spends one of the peer's credits. The credits it returns
// count (creditsInLocked). It returns the credits field (a rendezvous
// done's id), the payload's length and the action; rxFailed: the
// connection failed (ErrProtocol).
func (c *engine) admitRecvLocked(wc *verbs.WC, idx int) (uint32, uint32, rxAction) {
	v := rxView{controlReserve: c.features&wire.FeatureControlReserve != 0,
		eof: c.stream.eof, msgsClosed: c.msgs.closed, room: c.ep.bufSize}
	hasImm, imm, n := wc.HasImm(), wc.Imm, wc.ByteLen
	if c.trailers {
		var err error
		if n, imm, err = recvTrailer(c.ep.recv, idx, wc.ByteLen, c.ep.bufSize); err != nil {
			c.failLocked(fmt.Errorf("%w: %w", ErrProtocol, err))
			return 0, 0, rxFailed
		}
		hasImm, v.trailers, v.room = true, true, c.ep.bufSize-wire.TrailerLen
	}
	kind, credits, act, err := classifyRecv(hasImm, imm, n, v)
	switch act {
	case rxFailed:
		c.failLocked(err)
		return credits, n, rxFailed
	case rxControl:
		// Spending no credit, each kind has an allowance of its own.
		if !c.controlAllowedLocked(kind, credits) || !c.creditsInLocked(credits) {
			return credits, n, rxFailed
		}
		return credits, n, act
	case rxRendezvousDone:
		return credits, n, act
	}
	if !c.peerSpentLocked() || !c.creditsInLocked(credits) {
		return credits, n, rxFailed
	}
	return credits, n, act
}

func (c *engine) recvFailedLocked(wc *verbs.WC) {
	if wc.Status == verbs.WCWRFlushErr {
		// The QP went to ERR (our close, or the peer's disconnect): after the
		// data already received, a reader sees the end.
		if c.stream.rerr == nil && !c.stream.eof {
			c.stream.rerr = c.brokenErrLocked()
		}
		c.qpDownLocked()
		return
	}
	c.failLocked(wcErr(wc))
}

func (c *engine) sendFailedLocked(wc *verbs.WC) {
	if wc.Status == verbs.WCSuccess {
		return
	}
	if wc.Status == verbs.WCWRFlushErr {
		if c.stream.werr == nil {
			c.stream.werr = c.brokenErrLocked()
		}
		c.qpDownLocked()
		return
	}
	err := wcErr(wc)
	if wc.Status == verbs.WCRetryExcErr {
		err = &transportTimeout{cause: err}
	}
	c.failLocked(err)
}
