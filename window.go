//go:build linux && cgo

package rdma

import (
	"fmt"
	"time"

	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// The rings grow with traffic, as TCP autotunes its window, so that an idle
// connection pins little registered memory (the default Config: 4 credited
// receive buffers, 2 for the peer's control messages and 1 send buffer of
// 32 KiB, and 4 KiB of rendezvous descriptors: 228 KiB) while a busy one
// reaches the Config's sizes:
//
//   - The receive window (the credits granted to the peer) doubles, up to
//     Config.RecvBuffers, when the peer was down to half of it (by our
//     count) and the application has since taken what arrived (at most a
//     quarter of the window is unread): then the window, not the reader,
//     limits the peer. A slow reader does not grow it, nor does a
//     ping-pong whose replies return the credits at once. The new
//     receives are posted and granted as ordinary returned credits, which
//     every 1.x peer accepts.
//   - The send ring doubles, up to Config.SendBuffers, when a writer has
//     credits but no free send buffer.
//   - The rendezvous reserve (receives beyond the credits for the peer's
//     "done" answers, rendezvous.go) grows by one, up to maxRendezvous,
//     when a large Send finds every reserved answer in use.
//
// Nothing shrinks while the connection lives: the memory goes back to the
// pool when it closes. Where the buffers come from is rings.go.
//
// The same bookkeeping checks the peer: peerCredits counts the credits the
// peer holds (granted in the Hello and with every returned credit, spent by
// each credit-using message that arrives). A message beyond them, which
// lands in a receive posted for something else, is a protocol violation.
// In the other direction, the credits this side holds never exceed the
// peer's window, and no window exceeds maxWindow: a peer that grants more
// would have this side send into receives it never posted, so the grant
// itself ends the connection (creditsInLocked).

const (
	initialCredits     = 4 // the receive window a connection starts with
	initialSendBuffers = 1 // the send ring a connection starts with
	// maxWindow is the largest receive window a side may grant: the most
	// the Hello's credits field holds. The window stops growing there
	// whatever Config.RecvBuffers says.
	maxWindow = 1<<16 - 1
)

// initialWindow is the credits a connection announces in its Hello.
func initialWindow(cfg *Config) int { return min(cfg.RecvBuffers, initialCredits) }

// windowState is the rings' growth and the peer's credits, guarded by
// Conn.mu.
type windowState struct {
	size        int       // credited receive buffers posted for the peer (its window)
	rvReserve   int       // receives posted for the peer's rendezvous done answers
	peerCredits int       // credits the peer holds, by our count
	peerStarved bool      // the peer was down to half the window since it last grew
	poolGrowing bool      // growPoolLocked's goroutine is registering an arena
	poolFullAt  time.Time // when growPoolLocked last found the pool at its limit
}

// poolRetry is how long rings do not ask a pool at its limit to grow again.
const poolRetry = 100 * time.Millisecond

// windowTaken is called when the application takes a message or a
// notification: with the peer starved, that may be what lets the window
// grow (no receive is reposted while the application holds what it took).
func (c *engine) windowTaken() {
	if !c.starvedHint.Load() {
		return
	}
	c.mu.Lock()
	if !c.released {
		c.maybeGrowWindowLocked()
		c.maybeSendCreditsLocked()
	}
	c.mu.Unlock()
}

// grantedLocked records that the pending credits went out in a message
// just posted.
func (c *engine) grantedLocked() {
	c.win.peerCredits += c.stream.pending
	c.stream.pending = 0
}

// creditsInLocked adds n credits the peer returned; credits beyond the
// largest window a peer may have fail the connection (false).
func (c *engine) creditsInLocked(n uint32) bool {
	c.stream.credits += int(n)
	if c.stream.credits > maxWindow {
		c.failLocked(fmt.Errorf("%w: peer granted credits for %d receives; no receive window exceeds %d",
			ErrProtocol, c.stream.credits, maxWindow))
		return false
	}
	return true
}

// peerSpentLocked counts a credit-using message from the peer; one beyond
// its credits fails the connection (false).
func (c *engine) peerSpentLocked() bool {
	c.win.peerCredits--
	if c.win.peerCredits < 0 {
		c.failLocked(fmt.Errorf("%w: peer sent a message beyond the credits it was granted", ErrProtocol))
		return false
	}
	if c.win.peerCredits <= c.win.size/2 && !c.win.peerStarved {
		c.win.peerStarved = true
		c.starvedHint.Store(true)
	}
	return true
}

// maybeGrowWindowLocked doubles the receive window if the window, not the
// reader, holds the peer back (see above). Called with c.mu held, right
// after reposting.
func (c *engine) maybeGrowWindowLocked() {
	limit := min(c.cfg.RecvBuffers, maxWindow)
	if !c.win.peerStarved || c.win.size >= limit || c.qpDown {
		return
	}
	// What arrived and the application has not taken yet (received
	// messages it holds are taken: it keeps up, it just keeps them).
	if unread := c.stream.rqLen + c.msgs.mq.Queued() + c.msgs.nq.Queued() + c.rdv.inLen; unread > max(1, c.win.size/4) {
		return // the application is behind: a larger window would only pin more
	}
	n := c.addRecvsLocked(min(c.win.size, limit-c.win.size))
	if n == 0 {
		return // still starved: tried again once the pool has grown
	}
	c.win.peerStarved = false
	c.starvedHint.Store(false)
	c.win.size += n
	c.stream.pending += n // granted with the next message, as reposted receives are
}

// growReserveLocked posts one more receive for the peer's rendezvous done
// answers, so one more large message may be outstanding. Called with c.mu
// held by a Send that found the reserve in use.
func (c *engine) growReserveLocked() bool {
	if c.win.rvReserve >= maxRendezvous || c.qpDown || c.addRecvsLocked(1) == 0 {
		return false
	}
	c.win.rvReserve++
	return true
}

// The credit-return policy: when this side returns the credits it owes its
// peer, in a credit update of its own or with its next send (the growth
// above decides how many there are to return).

// creditsUrgentLocked reports whether pending credits should go back in a
// message of their own now rather than ride on the next data message: only
// when the peer is down to half its window by our count (it may soon wait
// for them: data needs two). Until then they wait for a data message to
// carry them, so a Conn ping-pong, whose replies carry the credits, sends no
// update at all. A write-with-immediate ping-pong, whose notifications
// cannot carry credits (the immediate is the application's), sends one
// update per half window, and each one finds the peer starved, so the
// window grows (above) and updates get rarer. The threshold is not a
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
