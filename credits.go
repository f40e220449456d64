//go:build linux && cgo

package rdma

// The credit-return policy: when this side returns the credits it owes its
// peer, in a credit update of its own or with its next send (window.go
// grows and shrinks what there is to return).

import (
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// creditsUrgentLocked reports whether pending credits should go back in a
// message of their own now rather than ride on the next data message: only
// when the peer is down to half its window by our count (it may soon wait
// for them: data needs two). Until then they wait for a data message to
// carry them, so a Conn ping-pong, whose replies carry the credits, sends no
// update at all. A write-with-immediate ping-pong, whose notifications
// cannot carry credits (the immediate is the application's), sends one
// update per half window, and each one finds the peer starved, so the
// window grows (window.go) and updates get rarer. The threshold is not a
// quarter window: that would keep a window of 8 from ever reaching half,
// so it would never grow, and would send an update every second round trip
// (a doorbell, a signaled completion and a receive more on each side).
//
// A 1.0/1.1 peer spends a credit on each credit update it receives and
// earns one back when it reposts it: there at least 2 must be pending, so
// that a lone update's receive never triggers an update in return.
func (c *engine) creditsUrgentLocked() bool {
	min := 1
	if c.features&wire.FeatureControlReserve == 0 {
		min = 2
	}
	return c.stream.pending >= min && c.win.peerCredits <= c.win.size/2
}

// flushCredits returns every pending credit now, below the threshold: a
// receiver about to sleep must not sit on credits its peer may be waiting
// for (the last one before a wait, as for signaled sends). If a credit
// update is in flight already, its completion sends the rest.
func (c *engine) flushCredits() {
	c.mu.Lock()
	if c.stream.pending > 0 && !c.qpDown && c.creditsUrgentLocked() {
		c.sendCtlLocked(wire.KindCredit)
	}
	c.mu.Unlock()
}

// maybeSendCreditsLocked returns pending credits in a credit update when
// the peer may need them (creditsUrgentLocked).
func (c *engine) maybeSendCreditsLocked() {
	if c.creditsUrgentLocked() {
		c.sendCtlLocked(wire.KindCredit)
	}
}

// sendCtlLocked posts a zero-length control message carrying all pending
// credits, and reports whether it did. Credit updates and probes to a peer
// that keeps receives for them (wire.FeatureControlReserve) spend no
// credit, one at a time: receiving one earns the peer no credit to return,
// so two sides returning credits cannot bounce updates back and forth.
// Otherwise (end of stream, or a 1.0/1.1 peer) the message spends a
// credit, and may spend the last one: data never does, so one is always
// left for it. End of stream and the uncredited messages ask for their
// completion (Close waits for every send to retire; the next uncredited
// one waits for the previous). Called with c.mu held.
func (c *engine) sendCtlLocked(kind wire.Kind) bool {
	if c.qpDown || c.sqUsedLocked() >= c.ep.sqDepth {
		return false
	}
	uncredited := kind != wire.KindFIN && c.features&wire.FeatureControlReserve != 0
	if uncredited && c.ka.ctlOut || !uncredited && c.stream.credits < 1 {
		return false
	}
	wrKind := uint64(wrSendCtl)
	if uncredited {
		wrKind = wrSendUnc
	}
	if c.postLocked(verbs.SendWR{Opcode: verbs.OpSendWithImm, Imm: wire.EncodeImm(kind, uint32(c.stream.pending))},
		wrKind, 0, kind == wire.KindFIN || uncredited) != nil {
		return false
	}
	if uncredited {
		c.ka.ctlOut = true
	} else {
		c.stream.credits--
	}
	c.grantedLocked()
	return true
}

// creditUpdateSentLocked retires a credit update sent with no reserved
// credit of its own (wrSendUnc): another may go now.
func (c *engine) creditUpdateSentLocked(wc *verbs.WC) {
	c.ka.ctlOut = false
	c.sendFailedLocked(wc)
	if c.creditsUrgentLocked() {
		// Credits earned while the update was in flight, which a reader
		// going to sleep may have tried to flush.
		c.sendCtlLocked(wire.KindCredit)
	}
}
