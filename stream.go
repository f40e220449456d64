//go:build linux && cgo

package rdma

import (
	"io"
	"net"
	"os"
	"syscall"
	"time"

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
	finSent  bool
	werr     error
}

type rxMsg struct {
	buf int // receive buffer index
	off int // bytes already read
	n   int // bytes received
}

// creditThreshold is how many reposted receives we collect before returning
// them in a message of their own (they also ride on every data message).
func (c *Conn) creditThreshold() int { return max(1, c.cfg.RecvBuffers/4) }

// Read reads data from the connection. It returns io.EOF once the peer has
// closed (or half-closed) and every byte it wrote has been read.
func (c *Conn) Read(b []byte) (int, error) {
	n, err := c.read(b)
	if err != nil && err != io.EOF {
		err = c.opError("read", err)
	}
	return n, err
}

func (c *Conn) read(b []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	var w poller.Waiter
	defer w.End()
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return 0, net.ErrClosed
		}
		if c.rdDeadline.expired() {
			c.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		}
		if c.rqLen > 0 {
			if len(b) == 0 {
				c.mu.Unlock()
				return 0, nil
			}
			n := c.copyOut(b)
			c.mu.Unlock()
			return n, nil
		}
		if c.eof {
			c.mu.Unlock()
			return 0, io.EOF
		}
		if c.rerr != nil {
			err := c.rerr
			c.mu.Unlock()
			return 0, err
		}
		if len(b) == 0 {
			c.mu.Unlock()
			return 0, nil
		}
		c.mu.Unlock()
		if c.spinWait(&w, &c.rdSpin) {
			continue
		}
		c.flushCredits()
		select {
		case <-c.rdSig:
		case <-c.rdDeadline.wait():
		case <-c.closing:
		}
	}
}

// copyOut copies queued received bytes into b, reposting every buffer it
// empties in one batch. Called with c.mu held.
func (c *Conn) copyOut(b []byte) int {
	n := 0
	c.recvWRs = c.recvWRs[:0]
	for c.rqLen > 0 && n < len(b) {
		m := &c.rq[c.rqHead]
		k := copy(b[n:], c.ep.recv[m.buf].Full()[m.off:m.n])
		n += k
		m.off += k
		if m.off == m.n {
			c.recvWRs = append(c.recvWRs, c.ep.recvWR(m.buf))
			c.rqHead = (c.rqHead + 1) % len(c.rq)
			c.rqLen--
		}
	}
	c.repostLocked()
	return n
}

// repostLocked posts the receives collected in c.recvWRs and returns credits
// if enough have piled up. Called with c.mu held.
func (c *Conn) repostLocked() {
	if len(c.recvWRs) == 0 || c.qpDown {
		return
	}
	if err := c.ep.qp.PostRecv(c.recvWRs); err != nil {
		c.failLocked(err)
		return
	}
	c.recvPosted += len(c.recvWRs)
	c.pending += len(c.recvWRs) - c.uncredited
	c.uncredited = 0
	c.recvWRs = c.recvWRs[:0]
	c.maybeSendCreditsLocked()
}

// flushCredits returns every pending credit now, below the threshold: a
// receiver about to sleep must not sit on credits its peer may be waiting
// for (the last one before a wait, as for signaled sends).
func (c *Conn) flushCredits() {
	c.mu.Lock()
	if c.pending > 0 && c.credits >= 1 && !c.qpDown {
		c.sendCtlLocked(wire.KindCredit)
	}
	c.mu.Unlock()
}

// maybeSendCreditsLocked returns pending credits in a control message when
// enough have accumulated. A control message may use the last credit: data
// never does, so one is always left for this (otherwise both sides could sit
// on credits neither can send).
func (c *Conn) maybeSendCreditsLocked() {
	if c.pending >= c.creditThreshold() && c.credits >= 1 {
		c.sendCtlLocked(wire.KindCredit)
	}
}

// sendCtlLocked posts a zero-length control message carrying all pending
// credits. Called with c.mu held; the caller checked c.credits >= 1. End of
// stream asks for its completion: Close waits for every send to retire.
func (c *Conn) sendCtlLocked(kind wire.Kind) bool {
	if c.qpDown || c.sqUsedLocked() >= c.ep.sqDepth {
		return false
	}
	if c.postLocked(verbs.SendWR{Opcode: verbs.OpSendWithImm, Imm: wire.EncodeImm(kind, uint32(c.pending))},
		wrSendCtl, 0, kind == wire.KindFIN) != nil {
		return false
	}
	c.credits--
	c.pending = 0
	return true
}

// Write writes b to the connection, split into chunks of at most the peer's
// receive buffer size and pipelined over the send buffers. It returns once
// every byte is in a posted send buffer (as TCP's returns once the bytes are
// in the socket buffer).
func (c *Conn) Write(b []byte) (int, error) {
	n, err := c.write(b)
	if err != nil {
		err = c.opError("write", err)
	}
	return n, err
}

func (c *Conn) write(b []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	written := 0
	var w poller.Waiter
	defer w.End()
	for {
		c.mu.Lock()
		if err := c.writeErrLocked(); err != nil {
			c.mu.Unlock()
			return written, err
		}
		if len(b) == 0 {
			c.mu.Unlock()
			return written, nil
		}
		// Reserve send buffers and credits for as many chunks as we can.
		free := c.ep.nSend - int(c.sendSeq-c.sendDone)
		room := c.ep.sqDepth - ctlReserve/2 - c.sqUsedLocked()
		k := min(free, room, c.credits-1)
		if k <= 0 {
			c.mu.Unlock()
			if c.spinWait(&w, &c.wrSpin) {
				continue
			}
			select {
			case <-c.wrSig:
			case <-c.wrDeadline.wait():
			case <-c.closing:
			}
			continue
		}
		first := c.sendSeq
		c.sendSeq += uint64(k) // reserved: only this writer (writeMu) posts data
		c.credits -= k
		c.sqReserved += k // queue positions are taken at the post, in posting order
		c.mu.Unlock()

		// Copy outside the lock; the completion loop keeps running.
		wrs := c.sendWRs[:0]
		for i := 0; i < k && len(b) > 0; i++ {
			slot := int((first + uint64(i)) % uint64(c.ep.nSend))
			sb := c.ep.send[slot]
			m := copy(sb.Full()[:c.peerBufSize], b)
			b = b[m:]
			written += m
			wr := verbs.SendWR{Addr: sb.Addr(), Len: uint32(m), LKey: sb.LKey(), Opcode: verbs.OpSendWithImm}
			if m <= c.ep.maxInline {
				wr.Flags = verbs.SendInline // copied into the request: no DMA read of the buffer
			}
			wrs = append(wrs, wr)
		}
		c.mu.Lock()
		unused := k - len(wrs)
		c.sendSeq -= uint64(unused)
		c.credits += unused
		c.sqReserved -= k
		// Every data message carries the credits pending so far.
		wrs[0].Imm = wire.EncodeImm(wire.KindData, uint32(c.pending))
		c.pending = 0
		for i := 1; i < len(wrs); i++ {
			wrs[i].Imm = wire.EncodeImm(wire.KindData, 0)
		}
		var err error
		if c.qpDown {
			err = c.writeErrLocked()
			if err == nil {
				err = net.ErrClosed
			}
		} else {
			for i := range wrs {
				c.sqPushLocked(&wrs[i], wrSendData, 0, false)
			}
			err = c.ep.qp.PostSend(wrs)
			if err != nil {
				c.sqPopLocked(len(wrs))
				c.failLocked(err)
			}
		}
		c.mu.Unlock()
		if err != nil {
			return written, err
		}
	}
}

// writeErrLocked reports why writing is impossible now, or nil.
func (c *Conn) writeErrLocked() error {
	switch {
	case c.closed:
		return net.ErrClosed
	case c.finSent:
		return syscall.EPIPE // after CloseWrite, as for TCP
	case c.werr != nil:
		return c.werr
	case c.wrDeadline.expired():
		return os.ErrDeadlineExceeded
	}
	return nil
}

// CloseWrite shuts down the writing side: the peer reads every byte written
// before it and then io.EOF, and can still write back.
func (c *Conn) CloseWrite() error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if err := c.sendFIN(c.cfg.CloseTimeout); err != nil {
		return c.opError("close", err)
	}
	return nil
}

// sendFIN queues the end-of-stream mark after all data, waiting for a credit
// for at most timeout. The caller holds writeMu.
func (c *Conn) sendFIN(timeout time.Duration) error {
	until := time.Now().Add(timeout)
	var w poller.Waiter
	defer w.End()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.finSent {
			return nil
		}
		if c.werr != nil {
			return c.werr
		}
		if c.qpDown {
			return net.ErrClosed
		}
		if c.credits >= 1 && c.sendCtlLocked(wire.KindFIN) {
			c.finSent = true
			c.broadcast()
			return nil
		}
		if !c.closeWaitLocked(&w, until) {
			return &closeTimeout{"the peer granted no receive buffer for the end-of-stream mark"}
		}
	}
}
