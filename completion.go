package rdma

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gordma/rdma/internal/verbs"
	"github.com/gordma/rdma/internal/wire"
)

// completionLoop polls the connection's CQ in batches. After PollSpin without
// completions it arms the CQ and parks in the Go netpoller on the completion
// channel's fd, so an idle connection costs no CPU and no OS thread.
func (c *Conn) completionLoop() {
	defer close(c.loopDone)
	wcs := make([]verbs.WC, 64)
	rc, err := c.compFile.SyscallConn()
	if err != nil {
		c.mu.Lock()
		c.failLocked(err)
		c.mu.Unlock()
		return
	}
	for !c.stopLoop.Load() {
		var n int
		var err error
		if c.cfg.PollSpin > 0 {
			n, err = c.ep.cq.PollSpin(wcs, c.cfg.PollSpin)
		} else {
			n, err = c.ep.cq.Poll(wcs)
		}
		if err == nil && n == 0 {
			// Arm, then poll once more: a completion that arrived before the
			// arm raises no event.
			if err = c.ep.cq.ReqNotify(); err == nil {
				n, err = c.ep.cq.Poll(wcs)
			}
		}
		if err != nil {
			c.mu.Lock()
			c.failLocked(err)
			c.mu.Unlock()
			return
		}
		if n > 0 {
			c.handle(wcs[:n])
			continue
		}
		var gerr error
		werr := rc.Read(func(uintptr) bool {
			ok, err := c.ep.compCh.GetEvent()
			if err != nil {
				gerr = err
				return true
			}
			return ok
		})
		if werr != nil || gerr != nil {
			return // stopCompletionLoop closed the file
		}
		c.ep.cq.GotEvent()
	}
}

func (c *Conn) startCompletionLoop() error {
	fd, err := unix.FcntlInt(uintptr(c.ep.compCh.Fd()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("dup completion channel fd: %w", err)
	}
	c.compFile = os.NewFile(uintptr(fd), "rdma-completions")
	go c.completionLoop()
	return nil
}

func (c *Conn) stopCompletionLoop() {
	c.stopLoop.Store(true)
	if c.compFile != nil {
		c.compFile.Close()
	}
}

// handle applies a batch of completions to the connection's state and wakes
// waiters once. It never blocks on a user.
func (c *Conn) handle(wcs []verbs.WC) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recvWRs = c.recvWRs[:0]
	for i := range wcs {
		wc := &wcs[i]
		idx := int(wc.WRID & 0xffffffff)
		switch wc.WRID & wrKindMask {
		case wrRecv:
			c.recvPosted--
			if wc.Status != verbs.WCSuccess {
				c.recvFailedLocked(wc)
				continue
			}
			if !wc.HasImm() {
				c.failLocked(fmt.Errorf("%w: peer sent a message without a header", ErrProtocol))
				continue
			}
			kind, credits, err := wire.DecodeImm(wc.Imm)
			if err != nil {
				c.failLocked(fmt.Errorf("%w: %v", ErrProtocol, err))
				continue
			}
			c.credits += int(credits)
			if kind == wire.KindData && wc.ByteLen > 0 && !c.eof {
				tail := (c.rqHead + c.rqLen) % len(c.rq)
				c.rq[tail] = rxMsg{buf: idx, n: int(wc.ByteLen)}
				c.rqLen++
				continue
			}
			if kind == wire.KindFIN {
				c.eof = true
			}
			// Control messages carry no bytes to hold: repost at once.
			c.recvWRs = append(c.recvWRs, c.ep.recvWR(idx))
		case wrSendData:
			c.sendDone++
			c.sqInFlight--
			c.sendFailedLocked(wc)
		case wrSendCtl:
			c.sqInFlight--
			c.sendFailedLocked(wc)
		}
	}
	c.repostLocked()
	c.maybeSendCreditsLocked()
	c.broadcast()
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
	c.failLocked(wc.Err())
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
	err := wc.Err()
	if wc.Status == verbs.WCRetryExcErr {
		err = fmt.Errorf("peer unreachable (transport retries exhausted): %w", err)
	}
	c.failLocked(err)
}
