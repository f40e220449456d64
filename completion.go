//go:build linux && cgo

package rdma

import (
	"fmt"
	"syscall"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// handleCompletions applies a batch of completions to the connection's state
// and wakes waiters once. The device's poller calls it; it never blocks on a
// user (delivery channels are sized so a send into them cannot block).
func (c *Conn) handleCompletions(wcs []verbs.WC) {
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return
	}
	c.recvWRs = c.recvWRs[:0]
	c.uncredited = 0
	heard := false
	for i := range wcs {
		wc := &wcs[i]
		idx := int(wc.WRID & wrIdxMask)
		if wc.WRID&wrKindMask == wrRecv {
			c.recvPosted--
			heard = heard || wc.Status == verbs.WCSuccess
			c.recvLocked(wc, idx)
			continue
		}
		c.sqRetireLocked(idx, wc) // send queue: idx is the request's position
	}
	if heard && c.firstHeard != nil {
		c.firstHeard()
		c.firstHeard = nil
	}
	if heard && c.kaTimer != nil {
		c.lastHeard = time.Now() // once per batch, and only with keepalive on
	}
	c.repostLocked()
	c.maybeSendCreditsLocked()
	if len(c.rvInval) > 0 || len(c.rvDone) > 0 || c.rvStalled > 0 {
		c.pumpRendezvousLocked() // completions made send-queue room
	}
	if (c.eof && c.inLen == 0) || c.rerr != nil {
		c.closeMessagesLocked() // the peer finished, or receives failed: no more messages
	}
	c.broadcast()
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

// msgDoneLocked ends the zero-copy send in slot idx: the NIC (or, for a
// large message, the peer) is done with its buffer.
func (c *Conn) msgDoneLocked(idx int, err error) {
	c.toRelease = append(c.toRelease, c.msgSend[idx])
	c.msgSend[idx] = buffer.Buf{}
	c.msgFree = append(c.msgFree, idx)
	if c.msgAsync[idx] {
		c.asyncOut--
		c.oq.push(OpCompletion{ID: c.msgID[idx], Err: err})
	}
}

// recvLocked handles one receive completion for receive buffer idx.
func (c *Conn) recvLocked(wc *verbs.WC, idx int) {
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
		if c.msgsClosed {
			c.recvWRs = append(c.recvWRs, c.ep.recvWR(idx))
			return
		}
		c.deliverNotificationLocked(idx, wc)
		return
	}
	if !wc.HasImm() {
		c.failLocked(fmt.Errorf("%w: peer sent a message without a header", ErrProtocol))
		return
	}
	kind, credits, err := wire.DecodeImm(wc.Imm)
	if err != nil {
		c.failLocked(fmt.Errorf("%w: %v", ErrProtocol, err))
		return
	}
	if (kind == wire.KindKeepalive || kind == wire.KindCredit) && c.features&wire.FeatureControlReserve != 0 {
		// A credit update or probe, in a receive kept for them beyond the
		// credits: repost that without granting a credit (the credits it
		// carries count). Spending no credit, each kind has an allowance
		// of its own.
		if !c.controlAllowedLocked(kind, credits) || !c.creditsInLocked(credits) {
			return
		}
		c.uncredited++
		c.recvWRs = append(c.recvWRs, c.ep.recvWR(idx))
		return
	}
	if kind == wire.KindRendezvousDone {
		// It came in a receive kept for it beyond the credits: repost that
		// without granting a credit.
		c.rendezvousDoneLocked(credits)
		c.uncredited++
		c.recvWRs = append(c.recvWRs, c.ep.recvWR(idx))
		return
	}
	if !c.peerSpentLocked() || !c.creditsInLocked(credits) {
		return
	}
	switch {
	case kind == wire.KindData && wc.ByteLen > 0 && !c.eof:
		tail := (c.rqHead + c.rqLen) % len(c.rq)
		c.rq[tail] = rxMsg{buf: idx, n: int(wc.ByteLen)}
		c.rqLen++
		return
	case kind == wire.KindMessage && !c.eof && !c.msgsClosed:
		c.deliverMessageLocked(idx, int(wc.ByteLen))
		return
	case kind == wire.KindRendezvous && !c.eof && !c.msgsClosed:
		c.rendezvousInLocked(idx, int(wc.ByteLen))
		return
	case kind == wire.KindFIN:
		c.eof = true
	}
	// Control messages carry no bytes to hold: repost at once.
	c.recvWRs = append(c.recvWRs, c.ep.recvWR(idx))
}

func (c *Conn) recvFailedLocked(wc *verbs.WC) {
	if wc.Status == verbs.WCWRFlushErr {
		// The QP went to ERR (our close, or the peer's disconnect): after the
		// data already received, a reader sees the end.
		if c.rerr == nil && !c.eof {
			c.rerr = syscall.ECONNRESET
		}
		c.qpDownLocked()
		return
	}
	c.failLocked(wcErr(wc))
}

func (c *Conn) sendFailedLocked(wc *verbs.WC) {
	if wc.Status == verbs.WCSuccess {
		return
	}
	if wc.Status == verbs.WCWRFlushErr {
		if c.werr == nil {
			c.werr = syscall.ECONNRESET
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
