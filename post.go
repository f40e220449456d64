//go:build linux && cgo

package rdma

// Posting: receives taken back are posted with the next send, in one call
// into C (one doorbell), and binds go out in one post list with the sends
// behind them. The send queue's own accounting and signalling policy are
// in sendqueue.go.

import "github.com/verbline/rdma/internal/verbs"

// repostLocked takes back the receives collected in c.recvWRs and
// returns credits if the peer may need them. Their credits count from
// here (pending), but the post itself waits for this side's next send,
// which carries them in the same call into C (postSendsLocked): a
// ping-pong's reply then costs one crossing, not two (what a crossing
// costs: BenchmarkCostPollEmpty, docs/performance.md). That is safe:
// credits reach the peer only in sends, and every send posts recvReady
// first. Receives that take the peer's control messages (uncredited: the
// peer sends into them without a grant) are posted at once, and a waiter
// posts what is left before it spins (postReadyLocked). Called with c.mu
// held.
func (c *engine) repostLocked() {
	if len(c.recvWRs) == 0 || c.qpDown {
		return
	}
	c.recvReady = append(c.recvReady, c.recvWRs...)
	c.stream.pending += len(c.recvWRs) - c.stream.uncredited
	unc := c.stream.uncredited
	c.stream.uncredited = 0
	c.recvWRs = c.recvWRs[:0]
	if unc > 0 {
		c.postReadyLocked()
	} else {
		c.recvDeferred.Store(true)
	}
	c.maybeGrowWindowLocked()
	c.maybeSendCreditsLocked()
}

// postReadyLocked posts the receives repostLocked took back. Called with
// c.mu held.
func (c *engine) postReadyLocked() {
	if len(c.recvReady) == 0 {
		return
	}
	wrs := c.takeReadyLocked()
	if c.qpDown {
		return
	}
	if err := c.ep.qp.PostRecv(wrs); err != nil {
		c.failLocked(err)
		return
	}
	c.recvPosted += len(wrs)
}

// takeReadyLocked empties recvReady and returns what it held (valid until
// the next repost). Called with c.mu held.
func (c *engine) takeReadyLocked() []verbs.RecvWR {
	wrs := c.recvReady
	c.recvReady = c.recvReady[:0]
	c.recvDeferred.Store(false)
	return wrs
}

// postReady is postReadyLocked for a waiter about to poll or park.
func (c *engine) postReady() {
	if c.recvDeferred.Load() {
		c.mu.Lock()
		c.postReadyLocked()
		c.mu.Unlock()
	}
}

// postSendsLocked posts wrs, with the receives waiting in recvReady ahead
// of them in the same call. Called with c.mu held.
func (c *engine) postSendsLocked(wrs []verbs.SendWR) error {
	if len(c.recvReady) == 0 {
		return c.ep.qp.PostSend(wrs)
	}
	recvs := c.takeReadyLocked()
	posted, err := c.ep.qp.PostRecvSend(recvs, wrs)
	if posted {
		c.recvPosted += len(recvs)
	}
	return err
}

// postBindSendLocked posts a window bind followed by wrs in one post list,
// with the receives waiting in recvReady ahead of them in the same call.
// Called with c.mu held.
func (c *engine) postBindSendLocked(bind *verbs.BindWR, wrs []verbs.SendWR) error {
	var recvs []verbs.RecvWR
	if n := len(c.recvReady); n > 0 && n <= verbs.MaxPostList {
		recvs = c.takeReadyLocked()
	}
	posted, err := c.ep.qp.PostBindSend(recvs, bind, wrs)
	if posted {
		c.recvPosted += len(recvs)
	}
	return err
}

// Soft-RoCE (rxe) in Linux 6.1 re-executes a memory-window bind when it
// retransmits: a retry (a lost packet or ACK, go-back-N) rewinds its
// requester to the oldest work request not yet completed (req_retry in
// rxe_req.c sets req.wqe_index to the consumer index) and walks forward
// from there; a bind already executed but not yet completed, because an
// earlier SEND or READ still waits for its ACK, is handed to
// rxe_do_local_ops again. The second bind fails (the window's key has
// moved on and it is no longer free: rxe_bind_mw, rxe_check_bind_mw), and
// the failure path sets the requester's private state to QP_STATE_ERROR
// without moving the QP to the error state: from then on the requester
// sends nothing, neither the retry nor anything posted later, while the
// QP still reads RTS and the completer, whose retransmission timer is not
// re-armed, waits forever for an ACK of the request being retried. No
// error completion ever arrives. That is the silent hang of rendezvous
// over a lossy wire (docs/reliability.md); internal/rxebug
// reproduces it with plain verbs on one host.
//
// A bind is safe when every request posted before it has completed: rxe
// executes it at the head of the send queue and completes it before it
// can decide on any retry. So on rxe a window is bound only into a send
// queue this side knows to be empty (every request retired by a polled
// completion); bindReadyLocked says when, and makes sure a completion is
// coming when the newest request went unsignaled. Whether a device is
// Soft-RoCE is the device's to say (Device.QuietBind, internal/device's
// quirks.go).

// bindReadyLocked reports whether a memory window may be bound on this
// connection's send queue now. If not, the caller waits for completions
// (each batch of them broadcasts) and asks again. Called with c.mu held.
func (c *engine) bindReadyLocked() bool {
	if c.sendq.inFlight == 0 || c.qpDown || !c.dev.QuietBind() {
		return true
	}
	if c.sendq.unsig > 0 && c.sqUsedLocked() < c.ep.sqDepth {
		// The newest request asked for no completion, so none may come to
		// retire the queue: a signaled zero-length write does.
		c.postFlushLocked()
	}
	return false
}
