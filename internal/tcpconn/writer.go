package tcpconn

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/deadline"
	"github.com/verbline/rdma/internal/errs"
	"github.com/verbline/rdma/internal/tcpframe"
)

// outFrame is one frame for the writer, or a CloseWrite / Close mark.
type outFrame struct {
	typ   byte       // tcpframe.TypeStream, tcpframe.TypeMessage, or frameFIN / frameStop (local only)
	buf   buffer.Buf // the payload (a stream chunk's copy, or the message itself)
	async bool       // a PostSend: its end goes to opDone with id
	id    uint64
}

// The marks share outFrame.typ with the wire's frame types, above them:
// the writer sends no header for them, and a peer's frame of these types
// is refused as unknown (TestFrameMarksRefused).
const (
	frameFIN  = 0xfe // CloseWrite: shut down TCP's writing side after the frames before it
	frameStop = 0xff // Close: the writer ends after the frames before it
)

// writeLoop writes queued frames, several per system call when they queue
// up, until Close's stop mark.
func (t *Conn[C, N]) writeLoop() {
	defer close(t.writerDone)
	batch := make([]outFrame, 0, 64)
	hdrs := make([][tcpframe.HeaderLen]byte, 64)
	var iov net.Buffers
	for {
		batch = append(batch[:0], <-t.out)
	gather:
		for len(batch) < cap(batch) && batch[len(batch)-1].typ < frameFIN {
			select {
			case f := <-t.out:
				batch = append(batch, f)
			default:
				break gather
			}
		}
		iov = iov[:0]
		for i, f := range batch {
			if f.typ >= frameFIN {
				continue
			}
			tcpframe.PutHeader(&hdrs[i], f.typ, f.buf.Len())
			iov = append(iov, hdrs[i][:])
			if f.buf.Len() > 0 {
				iov = append(iov, f.buf.Bytes())
			}
		}
		var err error
		if len(iov) > 0 && !t.writeFailed() {
			_, err = iov.WriteTo(t.nc)
			if err != nil {
				t.failWrite(SockErr(err))
			}
		}
		if t.writeFailed() {
			err = t.werr
		}
		for _, f := range batch {
			switch f.typ {
			case frameFIN:
				if err == nil {
					if err = t.nc.CloseWrite(); err != nil {
						t.failWrite(SockErr(err))
					}
				}
			case frameStop:
				return
			default:
				f.buf.Release()
				if f.async {
					t.opDone <- t.completion(f.id, t.wrapAsync(err))
					t.asyncOut.Add(-1)
				}
			}
		}
	}
}

func (t *Conn[C, N]) wrapAsync(err error) error {
	if err == nil {
		return nil
	}
	return t.OpError("send", err)
}

func (t *Conn[C, N]) failWrite(err error) {
	t.werrOnce.Do(func() {
		t.werr = err
		close(t.wdead)
	})
}

func (t *Conn[C, N]) writeFailed() bool { return deadline.IsClosed(t.wdead) }

// queue hands f to the writer, waiting for room (bounded by ctx, the write
// deadline and Close). On failure f is the caller's still.
func (t *Conn[C, N]) queue(ctx context.Context, f outFrame) error {
	t.wmu.RLock()
	defer t.wmu.RUnlock()
	if err := t.writeErr(); err != nil {
		return err
	}
	return t.queueLocked(ctx, f)
}

// queueFIN queues the end-of-stream mark once closeWrite set finSent,
// which queue would refuse.
func (t *Conn[C, N]) queueFIN(ctx context.Context) error {
	t.wmu.RLock()
	defer t.wmu.RUnlock()
	if t.closed {
		return net.ErrClosed
	}
	return t.queueLocked(ctx, outFrame{typ: frameFIN})
}

// queueLocked waits for room for f in the writer's queue. Called with wmu
// held shared.
func (t *Conn[C, N]) queueLocked(ctx context.Context, f outFrame) error {
	select {
	case t.out <- f:
		return nil
	default:
	}
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	select {
	case t.out <- f:
		return nil
	case <-t.closing:
		return net.ErrClosed
	case <-t.wdead:
		return t.werr
	case <-t.wrDeadline.Wait():
		return os.ErrDeadlineExceeded
	case <-done:
		return ctx.Err()
	}
}

// writeErr says why nothing can be written now, or nil. Called with wmu held.
func (t *Conn[C, N]) writeErr() error {
	switch {
	case t.closed || deadline.IsClosed(t.closing):
		return net.ErrClosed
	case t.finSent:
		return syscall.EPIPE // after CloseWrite, as for TCP
	case t.writeFailed():
		return t.werr
	case t.wrDeadline.Expired():
		return os.ErrDeadlineExceeded
	}
	return nil
}

// Write queues b as stream frames of at most the peer's chunk size, copied
// into pool buffers, and returns once all are queued.
func (t *Conn[C, N]) Write(b []byte) (int, error) {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	if len(b) == 0 {
		t.wmu.RLock()
		err := t.writeErr()
		t.wmu.RUnlock()
		if err != nil {
			return 0, t.OpError("write", err)
		}
		return 0, nil
	}
	written := 0
	for len(b) > 0 {
		k := min(len(b), t.peerChunk)
		c, err := t.pool.Get(k)
		if err != nil {
			return written, t.OpError("write", err)
		}
		copy(c.Bytes(), b[:k])
		if err := t.queue(context.Background(), outFrame{typ: tcpframe.TypeStream, buf: c}); err != nil {
			c.Release()
			return written, t.OpError("write", err)
		}
		written += k
		b = b[k:]
	}
	return written, nil
}

// CloseWrite queues the end-of-stream mark after everything written,
// waiting at most Options.CloseTimeout for room in the send queue (as the
// RDMA CloseWrite waits for a credit); the writer shuts down TCP's writing
// side once the frames before it are written.
func (t *Conn[C, N]) CloseWrite() error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	// Marked first, under the exclusive lock: no producer is inside queue()
	// then, and every later one sees finSent (EPIPE), so nothing can be
	// queued behind the FIN (else a Send racing CloseWrite could queue a
	// message that the peer would see after EOF).
	t.wmu.Lock()
	fin := t.finSent
	err := t.writeErr()
	if err == nil {
		t.finSent = true
	}
	t.wmu.Unlock()
	if fin {
		return nil
	}
	if err != nil {
		return t.OpError("close", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.opt.CloseTimeout)
	defer cancel()
	if err := t.queueFIN(ctx); err != nil {
		t.wmu.Lock()
		t.finSent = false // not sent: a later CloseWrite tries again
		t.wmu.Unlock()
		if errors.Is(err, context.DeadlineExceeded) {
			err = &errs.CloseTimeout{What: "the send queue stayed full, so the end-of-stream mark could not be queued"}
		}
		return t.OpError("close", err)
	}
	return nil
}
