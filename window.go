//go:build linux && cgo

package rdma

import "fmt"

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
// pool when it closes.
//
// The same bookkeeping checks the peer: peerCredits counts the credits the
// peer holds (granted in the Hello and with every returned credit, spent by
// each credit-using message that arrives). A message beyond them, which
// lands in a receive posted for something else, is a protocol violation.

const (
	initialCredits     = 4 // the receive window a connection starts with
	initialSendBuffers = 1 // the send ring a connection starts with
)

// initialWindow is the credits a connection announces in its Hello.
func initialWindow(cfg *Config) int { return min(cfg.RecvBuffers, initialCredits) }

// windowState is the rings' growth and the peer's credits, guarded by
// Conn.mu.
type windowState struct {
	window      int  // credited receive buffers posted for the peer (its window)
	rvReserve   int  // receives posted for the peer's rendezvous done answers
	peerCredits int  // credits the peer holds, by our count
	peerStarved bool // the peer was down to half the window since it last grew
}

// windowTaken is called when the application takes a message or a
// notification: with the peer starved, that may be what lets the window
// grow (no receive is reposted while the application holds what it took).
func (c *Conn) windowTaken() {
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
func (c *Conn) grantedLocked() {
	c.peerCredits += c.pending
	c.pending = 0
}

// peerSpentLocked counts a credit-using message from the peer; one beyond
// its credits fails the connection (false).
func (c *Conn) peerSpentLocked() bool {
	c.peerCredits--
	if c.peerCredits < 0 {
		c.failLocked(fmt.Errorf("%w: peer sent a message beyond the credits it was granted", ErrProtocol))
		return false
	}
	if c.peerCredits <= c.window/2 && !c.peerStarved {
		c.peerStarved = true
		c.starvedHint.Store(true)
	}
	return true
}

// maybeGrowWindowLocked doubles the receive window if the window, not the
// reader, holds the peer back (see above). Called with c.mu held, right
// after reposting.
func (c *Conn) maybeGrowWindowLocked() {
	if !c.peerStarved || c.window >= c.cfg.RecvBuffers || c.qpDown {
		return
	}
	// What arrived and the application has not taken yet (received
	// messages it holds are taken: it keeps up, it just keeps them).
	if unread := c.rqLen + c.mq.queued() + c.nq.queued() + c.inLen; unread > max(1, c.window/4) {
		return // the application is behind: a larger window would only pin more
	}
	c.peerStarved = false
	c.starvedHint.Store(false)
	n := c.addRecvsLocked(min(c.window, c.cfg.RecvBuffers-c.window))
	c.window += n
	c.pending += n // granted with the next message, as reposted receives are
}

// growReserveLocked posts one more receive for the peer's rendezvous done
// answers, so one more large message may be outstanding. Called with c.mu
// held by a Send that found the reserve in use.
func (c *Conn) growReserveLocked() bool {
	if c.rvReserve >= maxRendezvous || c.qpDown || c.addRecvsLocked(1) == 0 {
		return false
	}
	c.rvReserve++
	return true
}

// addRecvsLocked takes up to n buffers from the pool and posts them as
// receives; it returns how many it posted (fewer if the pool is short:
// the rings just stay smaller).
func (c *Conn) addRecvsLocked(n int) int {
	wrs := c.recvWRs[len(c.recvWRs):] // scratch beyond what is being reposted (normally empty)
	for range n {
		b, err := c.dev.pool.Get(c.ep.bufSize)
		if err != nil {
			break
		}
		idx := len(c.ep.recv)
		b.SetRecyclerRef(&c.slotRefs[idx])
		c.ep.recv = append(c.ep.recv, b)
		wrs = append(wrs, c.ep.recvWR(idx))
	}
	if len(wrs) == 0 {
		return 0
	}
	if err := c.ep.qp.PostRecv(wrs); err != nil {
		c.failLocked(err) // the buffers are in the ring: freed with it
		return 0
	}
	c.recvPosted += len(wrs)
	return len(wrs)
}

// growSendRingLocked doubles the send ring (up to Config.SendBuffers).
// Called with c.mu and writeMu held, by a writer with credits and no free
// send buffer.
func (c *Conn) growSendRingLocked() {
	n := min(len(c.ep.send), c.ep.maxSend-len(c.ep.send))
	for range n {
		b, err := c.dev.pool.Get(c.ep.bufSize)
		if err != nil {
			return
		}
		c.sendFree = append(c.sendFree, len(c.ep.send))
		c.ep.send = append(c.ep.send, b)
	}
}

// ringBytes is the registered memory the connection's rings hold now.
func (c *Conn) ringBytes() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := uint64(len(c.ep.recv)+len(c.ep.send)) * uint64(c.ep.bufSize)
	if c.ep.rvDesc.Valid() {
		n += uint64(len(c.ep.rvDesc.Full()))
	}
	return n
}
