//go:build linux && cgo

package rdma

import (
	"fmt"
	"syscall"
	"time"

	"github.com/verbline/rdma/internal/wire"
)

// Keepalive (Config.KeepAlive). A connection that has received nothing for
// the keepalive interval sends a probe: a zero-length SEND_WITH_IMM of kind
// KindKeepalive into one of the receives the peer keeps posted beyond our
// credits for control messages (wire.FeatureControlReserve; credit updates
// use them too, see stream.go). The peer's NIC acknowledges it whether or
// not the peer's application reads, so a slow reader is never taken for a
// dead peer; the peer's completion handler reposts the receive without
// granting a credit. A probe spends no credit, so it can be sent even when
// a silent peer holds all of them (a writer waiting for credit).
//
// A probe the peer's NIC never acknowledges fails after the transport's
// retries (AckTimeout x (RetryCount + 1)) with a retry-exceeded completion,
// which fails the connection with a *transportTimeout: every blocked call
// returns.

// ctlRecvReserve is how many receives each side posts beyond its credits
// (and the rendezvous reserve) for the peer's credit updates and probes.
// The peer has one outstanding at a time (ctlOut) and sends the next only
// after the previous one's completion; the second receive covers a peer
// whose completion handler has not reposted the first one yet.
const ctlRecvReserve = 2

// minProbeInterval is the shortest interval between two probes: a
// Config.KeepAlive below it probes at this interval. It is also the rate a
// peer's probes are held to (controlAllowedLocked).
const minProbeInterval = 10 * time.Millisecond

// keepaliveState is the keepalive's state, guarded by Conn.mu.
type keepaliveState struct {
	timer      *time.Timer   // nil when keepalive is off for this connection
	every      time.Duration // the probe interval: Config.KeepAlive, at least minProbeInterval
	lastHeard  time.Time     // the last receive completion (anything from the peer)
	ctlOut     bool          // a credit update or probe that spends no credit is posted and not completed
	probes     uint64        // probes sent
	peerProbes probeBudget   // the peer's probes
}

// probeBudget holds a peer's probes to one every minProbeInterval, after
// a burst: a token bucket.
type probeBudget struct {
	left int       // probes that may arrive now
	at   time.Time // when left last grew (zero before the first probe)
}

// take counts a probe arriving at now and reports whether it is within the
// budget, which starts at burst and grows by one every minProbeInterval,
// up to burst.
func (b *probeBudget) take(now time.Time, burst int) bool {
	if b.at.IsZero() {
		b.left, b.at = burst, now
	}
	if n := int64(now.Sub(b.at) / minProbeInterval); n > 0 {
		b.left = int(min(int64(burst), int64(b.left)+n))
		b.at = b.at.Add(time.Duration(n) * minProbeInterval)
	}
	if b.left <= 0 {
		return false
	}
	b.left--
	return true
}

// startKeepalive arms the keepalive timer if both sides negotiated the
// feature and the Config enables it. Called once the connection is up.
func (c *engine) startKeepalive() {
	if c.cfg.KeepAlive <= 0 || c.features&wire.FeatureControlReserve == 0 {
		return
	}
	c.mu.Lock()
	c.ka.lastHeard = time.Now()
	c.ka.every = max(c.cfg.KeepAlive, minProbeInterval)
	c.ka.timer = time.AfterFunc(c.ka.every, c.keepaliveTick)
	c.mu.Unlock()
}

// stopKeepaliveLocked stops the timer for good. Called with c.mu held.
func (c *engine) stopKeepaliveLocked() {
	if c.ka.timer != nil {
		c.ka.timer.Stop()
	}
}

// keepaliveTick runs when the connection may have been silent for the
// keepalive interval: it probes if so, and re-arms for the next check.
func (c *engine) keepaliveTick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.qpDown || c.released {
		return
	}
	// Ends of asynchronous requests posted unsignaled wait for a later
	// completion (asyncForceLocked); one that nobody asks for by calling
	// in waits no longer than this.
	c.flushAsyncLocked()
	next := c.ka.every - time.Since(c.ka.lastHeard)
	if next <= 0 {
		// Skipped while a credit update is in flight: its
		// acknowledgement, or its failure, says as much. Pending credits
		// ride along, as on any control message.
		if !c.ka.ctlOut && c.sendCtlLocked(wire.KindKeepalive) {
			c.ka.probes++
		}
		next = c.ka.every
	}
	c.ka.timer.Reset(next)
}

// controlAllowedLocked checks a credit update or probe that spent no
// credit (the peer has the control reserve) against its allowance, and
// fails the connection (false) beyond it. Credits bound neither, so each
// kind has a rule of its own, which a peer following the protocol never
// breaks:
//
//   - A credit update returns at least one credit (a peer sends one only
//     with credits pending), and what the peer returns never takes this
//     side's credits above the largest window (creditsInLocked): the
//     updates are at most as many as the messages this side sends plus
//     the growth of the peer's window.
//   - Probes come at most every minProbeInterval (the sender's shortest
//     keepalive interval, timed by its clock from its previous probe),
//     with a burst allowance of as many as this side has receives plus
//     two (the dialer's first probe, and rounding): a poller that was held
//     up finds at once every probe that arrived meanwhile, and those
//     cannot be more than the receives posted (a probe that finds none is
//     refused with an RNR NAK and its sender sends no other until it
//     completes).
func (c *engine) controlAllowedLocked(kind wire.Kind, credits uint32) bool {
	if kind == wire.KindCredit {
		if credits == 0 {
			c.failLocked(fmt.Errorf("%w: peer sent a credit update that returns no credit", ErrProtocol))
			return false
		}
		return true
	}
	if burst := len(c.ep.recv) + 2; !c.ka.peerProbes.take(time.Now(), burst) {
		c.failLocked(fmt.Errorf("%w: peer sent keepalive probes more often than one every %v (after a burst of %d)",
			ErrProtocol, minProbeInterval, burst))
		return false
	}
	return true
}

// transportTimeout is the error of a connection whose peer's NIC stopped
// acknowledging (a retry-exceeded completion): the peer's host is gone,
// unreachable, or partitioned away. Like TCP's keepalive failure it wraps
// syscall.ETIMEDOUT, and its Timeout() is true.
type transportTimeout struct {
	cause error // the work completion's error
}

func (e *transportTimeout) Error() string {
	return "connection timed out: the peer's NIC stopped acknowledging (transport retries exhausted: " +
		"its host is down, unreachable or partitioned away; Config.AckTimeout and RetryCount bound the wait): " + e.cause.Error()
}

func (e *transportTimeout) Unwrap() []error { return []error{syscall.ETIMEDOUT, e.cause} }
func (e *transportTimeout) Timeout() bool   { return true }
func (e *transportTimeout) Temporary() bool { return true }
