package tcpconn

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/errs"
	"github.com/verbline/rdma/internal/tcpframe"
)

// The message view, with the RDMA one's rules: a Buf given to Send is the
// connection's whatever the outcome; a received Buf is the receiver's
// until its Release.

// Alloc returns a buffer of n bytes from the connections' pool.
func (t *Conn[C, N]) Alloc(n int) (buffer.Buf, error) {
	if err := t.checkOpen("alloc"); err != nil {
		return buffer.Buf{}, err
	}
	b, err := t.pool.Get(n)
	if err != nil {
		return buffer.Buf{}, t.OpError("alloc", err)
	}
	return b, nil
}

// Send queues b as one message frame (bounded by ctx, the write deadline
// and Close).
func (t *Conn[C, N]) Send(ctx context.Context, b buffer.Buf) error { return t.send(ctx, b, false, 0) }

// PostSend is Send whose end also arrives on Completions() with id, once
// the frame is written to the socket (or writing failed).
func (t *Conn[C, N]) PostSend(ctx context.Context, b buffer.Buf, id uint64) error {
	return t.send(ctx, b, true, id)
}

func (t *Conn[C, N]) send(ctx context.Context, b buffer.Buf, async bool, id uint64) error {
	if !b.Valid() {
		return t.OpError("send", buffer.ErrReleased)
	}
	if b.Len() > t.peerMaxMsg {
		n := b.Len()
		b.Release()
		return t.OpError("send", fmt.Errorf("%w: %d bytes, limit %d", errs.ErrMessageTooLarge, n, t.peerMaxMsg))
	}
	if async {
		if t.asyncOut.Add(1)+int64(len(t.opDone)) > int64(cap(t.opDone)) {
			t.asyncOut.Add(-1)
			b.Release()
			return t.OpError("send", errs.ErrCompletionsFull)
		}
	}
	if err := t.queue(ctx, outFrame{typ: tcpframe.TypeMessage, buf: b, async: async, id: id}); err != nil {
		if async {
			t.asyncOut.Add(-1)
		}
		b.Release()
		return t.OpError("send", err)
	}
	return nil
}

// Recv waits for the next message (bounded by ctx, the read deadline and
// Close); at the end, io.EOF or the connection's error.
func (t *Conn[C, N]) Recv(ctx context.Context) (buffer.Buf, error) {
	if err := t.checkOpen("recv"); err != nil {
		return buffer.Buf{}, err
	}
	b, ok, err := wait(t, ctx, t.msgs, "recv")
	if err != nil || ok {
		return b, err
	}
	if err := t.endErr(); err != io.EOF {
		return buffer.Buf{}, t.OpError("recv", err)
	}
	return buffer.Buf{}, io.EOF
}

// RecvCompletion waits for the next PostSend's end.
func (t *Conn[C, N]) RecvCompletion(ctx context.Context) (C, error) {
	select {
	case oc := <-t.opDone: // ends queued before a Close are still returned
		return oc, nil
	default:
	}
	if err := t.checkOpen("recv completion"); err != nil {
		var zero C
		return zero, err
	}
	oc, _, err := wait(t, ctx, t.opDone, "recv completion")
	return oc, err
}

// wait takes the next value from ch (ok false: ch is closed), bounded by
// ctx, the read deadline and Close.
func wait[T, C, N any](t *Conn[C, N], ctx context.Context, ch <-chan T, op string) (v T, ok bool, err error) {
	if t.rdDeadline.Expired() {
		return v, false, t.OpError(op, os.ErrDeadlineExceeded)
	}
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	select {
	case v, ok = <-ch:
		return v, ok, nil
	case <-t.rdDeadline.Wait():
		return v, false, t.OpError(op, os.ErrDeadlineExceeded)
	case <-t.closing:
		return v, false, t.OpError(op, net.ErrClosed)
	case <-done:
		return v, false, t.OpError(op, ctx.Err())
	}
}
