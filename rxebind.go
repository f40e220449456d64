//go:build linux && cgo

package rdma

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
