//go:build linux && cgo

package rdma

import (
	"github.com/verbline/rdma/internal/verbs"
)

// The send queue in posting order. RC completes a QP's send work requests
// in order, so most are posted unsignaled (no completion of their own) and
// one signaled completion retires every unsignaled request posted before it,
// as perftest's --cq-mod and ib_send_bw do: fewer completions to poll and
// dispatch per message. An error completion is generated whether or not a
// request was signaled, so failures are never missed.
//
// A request asks for a completion when someone needs it (an asynchronous
// operation's outcome, a READ's data, a window invalidation, end of
// stream), every signalEvery requests, and whenever a resource a waiter
// could be waiting for runs low (send buffers, send-queue entries, message
// slots): then every request is signaled, so a writer that finds a resource
// exhausted always has a signaled request in flight that will free it.

// signalEvery is how many send-queue requests may go without a completion.
const signalEvery = 16

// sendQueue is the send queue's bookkeeping, guarded by Conn.mu.
type sendQueue struct {
	inFlight   int // send-queue entries posted and not retired
	reserved   int // send-queue entries a writer reserved and has not posted yet
	entries    []sqEntry
	head       int             // the oldest entry not retired
	unsig      int             // requests posted since the last signaled one
	asyncUnsig bool            // an asynchronous request is among them (its end waits for a signaled one)
	ctlWR      [1]verbs.SendWR // scratch for single posts (a local would escape to the heap)
	pair       [2]verbs.SendWR // scratch for a write and its notify (trailer.go)
	bind       verbs.BindWR    // scratch for a window bind (rendezvous.go)
}

// sqEntry is one posted send-queue work request: what to do when it retires.
type sqEntry struct {
	kind uint64 // wrSendData, wrSendCtl, ...
	idx  int    // the kind's own index (send slot, receive buffer, operation)
	// read: an RDMA READ, which on a device whose sends complete locally
	// (Caps.SendsCompleteLocally) retires only by its own completion;
	// done: retired there, and waiting for the READs before it.
	read, done bool
}

// sqUsedLocked is how many send-queue entries are taken: posted and not
// retired, plus those a writer reserved and has not posted yet.
func (c *engine) sqUsedLocked() int { return c.sendq.inFlight + c.sendq.reserved }

// sqPushLocked appends a request about to be posted to the queue and sets
// its wr_id (the kind and the queue position) and its signaled flag; on a
// connection with trailers, a send's header moves into its trailer
// (trailer.go). Called with c.mu held; the caller checked that the queue
// has room.
func (c *engine) sqPushLocked(wr *verbs.SendWR, kind uint64, idx int, force bool) {
	pos := c.sqNextPosLocked()
	read := wr.Opcode == verbs.OpRDMARead
	c.sendq.entries[pos] = sqEntry{kind: kind, idx: idx, read: read}
	c.sendq.inFlight++
	wr.WRID = c.ep.wrid(kind, pos)
	if c.trailers {
		c.trailerLocked(wr, pos)
	}
	// After this side's end of stream nothing may follow to retire an
	// unsignaled request (a rendezvous done answer, a credit update to a
	// 1.1 peer), and Close waits for every request to retire: signal them
	// all.
	// SignalFrom: a provider that may read a large request's buffer after an
	// unsignaled completion (Soft-iWARP: internal/device's quirks.go); the
	// trailer (set above) counts in its length.
	// A READ on a device whose sends complete locally must complete
	// itself: a later request's completion does not mean it is done.
	if force || c.stream.finSent || c.sendq.unsig+1 >= signalEvery || c.sqLowLocked() ||
		c.dev.SignalFrom > 0 && int(wr.Len+wr.TailLen) >= c.dev.SignalFrom || read && c.dev.Caps.SendsCompleteLocally {
		wr.Flags |= verbs.SendSignaled
		c.sendq.unsig = 0
		c.sendq.asyncUnsig = false
	} else {
		wr.Flags &^= verbs.SendSignaled
		c.sendq.unsig++
		c.sendq.asyncUnsig = c.sendq.asyncUnsig || kind == wrSendMsg && c.msgs.async[idx] || kind == wrOneSided && c.rma.ops[idx].async
	}
}

// asyncForceLocked reports whether an asynchronous request (PostSend,
// PostWriteRemote, PostWriteRemoteImm, PostReadRemote) must ask for its own
// completion. Its end reaches Completions() or RecvCompletion either way: a
// request posted unsignaled is retired, and its end delivered, by the
// completion of a later one (RC completes in order). So it may go unsignaled
// while a later signaled request is sure to follow: every signalEvery
// requests one is (sqPushLocked), and RecvCompletion, before it waits,
// posts one when nothing signaled follows an end it may wait for
// (flushAsyncLocked). Signaled are: every asynchronous request once the user
// took the Completions() channel (its user waits without calling into the
// library); one posted with no other asynchronous request in flight (a
// ping-pong's, whose end would otherwise cost a flush each time); and,
// lowSlots, those that take the last free operation slot or leave half of
// them, so a writer keeping every slot busy gets half back while the other
// half are in flight.
func (c *engine) asyncForceLocked(lowSlots bool) bool {
	return c.rma.oq.ViaChan() || c.rma.asyncOut == 0 || lowSlots
}

// flushAsyncLocked makes sure the ends of asynchronous requests posted
// unsignaled will arrive: if no signaled request follows them, it posts a
// signaled RDMA WRITE of zero bytes, whose completion retires them (it needs
// no receive and no credit at the peer, and a zero-length RDMA operation is
// not required to carry a valid R_Key: IBA C9-88; rxe's check_rkey accepts
// it). Called with c.mu held.
func (c *engine) flushAsyncLocked() {
	if c.sendq.asyncUnsig && !c.qpDown && c.sqUsedLocked() < c.ep.sqDepth {
		c.postFlushLocked()
	}
}

// postFlushLocked posts a signaled zero-length RDMA WRITE: its completion
// retires every request posted before it.
func (c *engine) postFlushLocked() {
	c.postLocked(verbs.SendWR{Opcode: verbs.OpRDMAWrite}, wrSendCtl, 0, true)
}

// sqLowLocked reports whether a resource that only send completions give
// back is running low.
func (c *engine) sqLowLocked() bool {
	return c.ep.sqDepth-c.sqUsedLocked() < signalEvery ||
		len(c.stream.sendFree) < min(signalEvery, len(c.ep.send)) ||
		c.msgs.free != nil && len(c.msgs.free) < signalEvery // nil: the message view never sent
}

// sqNextPosLocked is the queue position the next pushed request takes.
func (c *engine) sqNextPosLocked() int {
	return (c.sendq.head + c.sendq.inFlight) % len(c.sendq.entries)
}

// sqPopLocked takes back the last n pushed requests (their post failed).
func (c *engine) sqPopLocked(n int) { c.sendq.inFlight -= min(n, c.sendq.inFlight) }

// sqRetireLocked handles the completion of the request at queue position
// pos: every older request retires successfully first (RC completes in
// order, and a failed one would have produced its own completion), then
// the one at pos with wc's status.
func (c *engine) sqRetireLocked(pos int, wc *verbs.WC) {
	if c.dev.Caps.SendsCompleteLocally {
		c.sqRetireUnorderedLocked(pos, wc)
		return
	}
	ok := verbs.WC{Status: verbs.WCSuccess}
	for c.sendq.inFlight > 0 {
		at := c.sendq.head
		e := c.sendq.entries[at]
		c.sendq.head = (c.sendq.head + 1) % len(c.sendq.entries)
		c.sendq.inFlight--
		if at == pos {
			c.sendDoneLocked(e, wc)
			return
		}
		c.sendDoneLocked(e, &ok)
	}
}

// sqRetireUnorderedLocked is sqRetireLocked where sends complete locally
// (Caps.SendsCompleteLocally: iWARP): the request at pos and every older
// one but a READ still waiting for its own completion retire; the queue's
// head then moves past what has retired.
func (c *engine) sqRetireUnorderedLocked(pos int, wc *verbs.WC) {
	ok := verbs.WC{Status: verbs.WCSuccess}
	n := len(c.sendq.entries)
	for i := 0; i < c.sendq.inFlight; i++ {
		at := (c.sendq.head + i) % n
		e := &c.sendq.entries[at]
		if at == pos {
			if !e.done {
				e.done = true
				c.sendDoneLocked(*e, wc)
			}
			break
		}
		if !e.done && !e.read {
			e.done = true
			c.sendDoneLocked(*e, &ok)
		}
	}
	for c.sendq.inFlight > 0 && c.sendq.entries[c.sendq.head].done {
		c.sendq.entries[c.sendq.head] = sqEntry{}
		c.sendq.head = (c.sendq.head + 1) % n
		c.sendq.inFlight--
	}
}

// postLocked posts one send-queue work request of the given kind and
// index (through ctlWR: a local would escape to the heap); force asks for
// its completion. A failed post ends the connection. Called with c.mu held;
// the caller checked that the send queue has room.
func (c *engine) postLocked(wr verbs.SendWR, kind uint64, idx int, force bool) error {
	c.sqPushLocked(&wr, kind, idx, force)
	c.sendq.ctlWR[0] = wr
	if err := c.postSendsLocked(c.sendq.ctlWR[:]); err != nil {
		c.sqPopLocked(1)
		c.failLocked(err)
		return err
	}
	return nil
}
