//go:build linux && cgo

package rdma

import (
	"io"
	"net"
	"os"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/errs"
	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// The stream view: Read and Write move bytes as TCP does, in chunks of at
// most the peer's receive buffer size. Write copies into registered send
// buffers and posts them as SEND_WITH_IMM messages (the immediate carries
// the kind and returned credits); Read copies out of the receive buffers
// the NIC filled and reposts them, which earns the peer its credits back.
// A sender only fills receive buffers the peer granted (the last credit is
// held back for control messages), so the NIC never meets a receiver
// without a posted buffer.

// streamState is the stream view's state, guarded by Conn.mu.
type streamState struct {
	// Receive side: completed receives in arrival order, a ring of buffer indices.
	rq      []rxMsg
	rqHead  int
	rqLen   int
	pending int // receives reposted but not yet granted back to the peer
	// uncredited counts the receives in recvWRs that are not credits (they
	// took a rendezvous done, which the peer sends without one).
	uncredited int
	eof        bool // the peer sent end-of-stream
	rerr       error
	// Send side.
	credits  int    // peer receive buffers we may still fill
	sendSeq  uint64 // data sends posted
	sendDone uint64 // data sends completed (RC completes in order)
	sendFree []int  // send buffers (indices into ep.send) not in flight
	finSent  bool
	werr     error
}

type rxMsg struct {
	buf int // receive buffer index
	off int // bytes already read
	n   int // bytes received
}

func (c *engine) read(b []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	var w poller.Waiter
	defer w.End()
	queued, err := c.awaitData(&w, len(b) > 0)
	if err != nil || !queued {
		return 0, err
	}
	n := 0
	if len(b) > 0 {
		n = c.copyOut(b)
	}
	c.mu.Unlock()
	return n, nil
}

// writeTo is WriteTo's loop: it returns w's error apart from its own.
func (c *engine) writeTo(w io.Writer) (total int64, werr, err error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	var wt poller.Waiter
	defer wt.End()
	for {
		if _, err := c.awaitData(&wt, true); err != nil {
			if err == io.EOF {
				err = nil
			}
			return total, nil, err
		}
		m := c.stream.rq[c.stream.rqHead]
		idx := m.buf
		chunk := c.ep.recv[idx].Full()[m.off:m.n]
		// Lent while w reads it: a concurrent Close's release must not
		// give it back to the pool (recycleRecv's rule, below).
		c.msgs.lent[idx] = true
		c.mu.Unlock()
		wt.End() // the next chunk's wait is one of its own, with a fresh spin budget (as each Read's)
		var n int
		n, werr = w.Write(chunk)
		if n < 0 || n > len(chunk) {
			n, werr = 0, errInvalidWrite
		} else if werr == nil && n < len(chunk) {
			werr = io.ErrShortWrite
		}
		total += int64(n)
		c.mu.Lock()
		c.msgs.lent[idx] = false
		if c.released { // Close ran meanwhile
			freed := c.ringFreed // else release frees it with the ring
			if freed {
				c.ep.recv[idx].Free()
			}
			c.mu.Unlock()
			if freed {
				c.dev.BufReturned()
			}
			return total, werr, net.ErrClosed
		}
		c.consumeLocked(n) // the head is still this chunk: only the reader (readMu) takes it
		c.mu.Unlock()
		if werr != nil {
			return total, werr, nil
		}
	}
}

// awaitData waits until received data is queued, driving the CQ while it
// waits, and then returns true with c.mu held. Otherwise it returns
// without c.mu: the reason reading stops (io.EOF at the end of stream,
// Close, the deadline, a receive error), or, with block false, nothing
// when no data is queued. The caller holds readMu.
func (c *engine) awaitData(w *poller.Waiter, block bool) (bool, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return false, net.ErrClosed
		}
		if c.rdDeadline.Expired() {
			c.mu.Unlock()
			return false, os.ErrDeadlineExceeded
		}
		if c.stream.rqLen > 0 {
			return true, nil
		}
		if c.stream.eof {
			c.mu.Unlock()
			return false, io.EOF
		}
		if c.stream.rerr != nil {
			err := c.stream.rerr
			c.mu.Unlock()
			return false, err
		}
		c.mu.Unlock()
		if !block {
			return false, nil
		}
		if c.spinWait(w, &c.rdSpin) {
			continue
		}
		c.flushCredits()
		select {
		case <-c.rdSig:
		case <-c.rdDeadline.Wait():
		case <-c.closing:
		}
	}
}

// copyOut copies queued data into b and takes back the receives it
// emptied. Called with c.mu held and data queued.
func (c *engine) copyOut(b []byte) int {
	n := 0
	c.recvWRs = c.recvWRs[:0]
	for c.stream.rqLen > 0 && n < len(b) {
		m := &c.stream.rq[c.stream.rqHead]
		k := copy(b[n:], c.ep.recv[m.buf].Full()[m.off:m.n])
		n += k
		c.takeLocked(m, k)
	}
	c.repostLocked()
	return n
}

// consumeLocked marks n bytes of the oldest queued chunk read (WriteTo
// wrote them out) and takes its receive back once it is empty. Called with c.mu
// held and data queued.
func (c *engine) consumeLocked(n int) {
	c.recvWRs = c.recvWRs[:0]
	c.takeLocked(&c.stream.rq[c.stream.rqHead], n)
	c.repostLocked()
}

// takeLocked marks k more bytes of m, the oldest queued chunk, read; an
// emptied chunk leaves the queue and its receive joins c.recvWRs for the
// repost. Called with c.mu held.
func (c *engine) takeLocked(m *rxMsg, k int) {
	m.off += k
	if m.off == m.n {
		c.recvWRs = append(c.recvWRs, c.ep.recvWR(m.buf))
		c.stream.rqHead = (c.stream.rqHead + 1) % len(c.stream.rq)
		c.stream.rqLen--
	}
}

// closeWrite is Conn.CloseWrite on the engine.
func (c *engine) closeWrite() error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	return c.sendFIN(c.cfg.CloseTimeout)
}

// write is Conn.Write on the engine: it reserves send buffers and credits
// for as many chunks as it can, copies the chunks outside c.mu and posts
// them in one call, until b is written; what it wrote is counted for the
// metrics.
func (c *engine) write(b []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	written := 0
	var w poller.Waiter
	defer w.End()
	for {
		c.mu.Lock()
		if err := c.writeErrLocked(); err != nil || len(b) == 0 {
			c.mu.Unlock()
			c.counts.wrote(written)
			return written, err
		}
		slots, sendBufs := c.reserveChunksLocked()
		c.mu.Unlock()
		if len(slots) == 0 {
			c.awaitWriteRoom(&w)
			continue
		}
		// Copy outside the lock; the completion loop keeps running.
		wrs := c.fillChunks(b, slots, sendBufs)
		for i := range wrs {
			n := int(wrs[i].Len)
			b = b[n:]
			written += n
		}
		c.mu.Lock()
		err := c.postChunksLocked(wrs, slots)
		c.mu.Unlock()
		if err != nil || len(b) == 0 {
			c.counts.wrote(written)
			return written, err // all posted: no second look at the state
		}
	}
}

// reserveChunksLocked takes send buffers, send-queue positions and credits
// for as many chunks as are free now (none: an empty slots), leaving the
// last credit for control messages. Only the writer (writeMu) posts data,
// so what it takes stays its own until postChunksLocked. sendBufs is the
// send ring as it is now: it may grow (a new slice) once c.mu is dropped.
func (c *engine) reserveChunksLocked() (slots []int, sendBufs []buffer.Buf) {
	if len(c.stream.sendFree) == 0 && c.stream.credits > 1 {
		c.growSendRingLocked() // send buffers, not credits, limit the stream
	}
	room := c.ep.sqDepth - ctlReserve/2 - c.sqUsedLocked()
	k := min(len(c.stream.sendFree), room, c.stream.credits-1)
	c.counts.creditCheck(c.stream.credits < 2) // metrics: data leaves the last credit for control messages
	if k <= 0 {
		return nil, nil
	}
	c.stream.sendSeq += uint64(k)
	c.stream.credits -= k
	c.sendq.reserved += k // queue positions are taken at the post, in posting order
	slots = append(c.writeSlots[:0], c.stream.sendFree[len(c.stream.sendFree)-k:]...)
	c.writeSlots = slots[:0] // grown once to what a Write needs, then reused
	c.stream.sendFree = c.stream.sendFree[:len(c.stream.sendFree)-k]
	return slots, c.ep.send
}

// awaitWriteRoom waits for send buffers, queue room or credits to come
// back, or for the write deadline or Close (which the caller's next look
// at writeErrLocked reports). The caller holds writeMu, not c.mu.
func (c *engine) awaitWriteRoom(w *poller.Waiter) {
	if c.spinWait(w, &c.wrSpin) {
		return
	}
	select {
	case <-c.wrSig:
	case <-c.wrDeadline.Wait():
	case <-c.closing:
	}
}

// fillChunks copies the front of b into the reserved send buffers, one
// chunk of at most the peer's receive buffer each, and builds their
// requests (without immediates: postChunksLocked sets them). It may use
// fewer buffers than reserved. The caller holds writeMu, not c.mu.
func (c *engine) fillChunks(b []byte, slots []int, sendBufs []buffer.Buf) []verbs.SendWR {
	wrs := c.sendWRs[:0]
	for i := 0; i < len(slots) && len(b) > 0; i++ {
		sb := sendBufs[slots[i]]
		m := copy(sb.Full()[:c.peerBufSize], b)
		b = b[m:]
		wr := verbs.SendWR{Addr: sb.Addr(), Len: uint32(m), LKey: sb.LKey(), Opcode: verbs.OpSendWithImm}
		if m <= c.inlineMax {
			wr.Flags = verbs.SendInline // copied into the request: no DMA read of the buffer
		}
		wrs = append(wrs, wr)
	}
	c.sendWRs = wrs[:0] // as writeSlots
	return wrs
}

// postChunksLocked gives back what fillChunks left unused of the
// reservation, frees the buffers of inline chunks, stamps the first chunk
// with the credits pending so far and posts the chunks in one list. A
// failed post fails the connection.
func (c *engine) postChunksLocked(wrs []verbs.SendWR, slots []int) error {
	unused := len(slots) - len(wrs)
	c.stream.sendSeq -= uint64(unused)
	c.stream.credits += unused
	c.sendq.reserved -= len(slots)
	c.stream.sendFree = append(c.stream.sendFree, slots[len(wrs):]...)
	for i := range wrs {
		if wrs[i].Flags&verbs.SendInline != 0 {
			// The payload was copied into the request at post time (below,
			// under c.mu): the buffer is free once posted.
			c.stream.sendFree = append(c.stream.sendFree, slots[i])
			slots[i] = -1
		}
	}
	// Every data message carries the credits pending so far.
	wrs[0].Imm = wire.EncodeImm(wire.KindData, uint32(c.stream.pending))
	c.grantedLocked()
	for i := 1; i < len(wrs); i++ {
		wrs[i].Imm = wire.EncodeImm(wire.KindData, 0)
	}
	if c.qpDown {
		if err := c.writeErrLocked(); err != nil {
			return err
		}
		return net.ErrClosed
	}
	for i := range wrs {
		c.sqPushLocked(&wrs[i], wrSendData, slots[i], false)
	}
	err := c.postSendsLocked(wrs)
	if err != nil {
		c.sqPopLocked(len(wrs))
		c.failLocked(err)
	}
	return err
}

// sendFIN queues the end-of-stream mark after all data, waiting for a credit
// for at most timeout. The caller holds writeMu.
func (c *engine) sendFIN(timeout time.Duration) error {
	until := time.Now().Add(timeout)
	var w poller.Waiter
	defer w.End()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.stream.finSent {
			return nil
		}
		if c.stream.werr != nil {
			return c.stream.werr
		}
		if c.qpDown {
			return net.ErrClosed
		}
		if c.sendCtlLocked(wire.KindFIN) {
			c.stream.finSent = true
			c.broadcast()
			return nil
		}
		if !c.closeWaitLocked(&w, until) {
			return &errs.CloseTimeout{What: "the peer granted no receive buffer for the end-of-stream mark"}
		}
	}
}

// dataSentLocked retires a stream data send: its send buffer (idx, -1 for
// an inline send, which gave it back at once) is free again.
func (c *engine) dataSentLocked(idx int, wc *verbs.WC) {
	c.stream.sendDone++
	if idx >= 0 {
		c.stream.sendFree = append(c.stream.sendFree, idx)
	}
	c.sendFailedLocked(wc)
}
