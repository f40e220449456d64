package tcpconn

import (
	"errors"
	"io"
	"net"
	"os"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/deadline"
	"github.com/verbline/rdma/internal/errs"
	"github.com/verbline/rdma/internal/tcpframe"
)

// readLoop reads frames until the connection ends or Close. After Close it
// reads and drops the socket's input until the peer's end of stream or
// until Close closes the socket: the peer's writes keep moving while Close
// waits for the peer to acknowledge what this side wrote (so two sides
// closing at once both deliver), and the socket is not left with unread
// input, which makes the kernel reset the connection when it is closed.
func (t *Conn[C, N]) readLoop() {
	defer close(t.drained)
	fr := tcpframe.Reader{Conn: t.src, Lim: t.lim, Stall: t.opt.HandshakeTimeout,
		Get: func(n int) (buffer.Buf, error) { return t.pool.GetWait(t.ctx, n) }}
	var err error
	closing := false
	for err == nil {
		if closing = !t.waitRoom(); closing {
			break
		}
		var typ byte
		var b buffer.Buf
		typ, b, err = fr.Next()
		if err != nil {
			closing = deadline.IsClosed(t.closing)
			break
		}
		q := t.streamQ
		if typ == tcpframe.TypeMessage {
			q = t.msgsIn
		}
		n := int64(b.Cap())
		t.held.Add(n)
		select {
		case q <- b:
		case <-t.closing:
			b.Release()
			t.handedOut(n)
			closing = true
		}
	}
	if closing {
		err = net.ErrClosed
	}
	if errors.Is(err, errs.ErrProtocol) {
		t.src.Close() // the peer broke the protocol: the connection ends both ways
	}
	t.rerr = SockErr(err)
	close(t.streamQ)
	close(t.msgsIn)
	close(t.notes)
	close(t.readerDone)
	if closing {
		t.src.SetReadDeadline(time.Time{}) // a frame's deadline does not bound the drain
		io.Copy(io.Discard, t.src)
	}
}

// waitRoom waits until the frames received and not handed out hold less
// than the connection's budget. It returns false if Close came first.
func (t *Conn[C, N]) waitRoom() bool {
	for t.held.Load() >= t.recvBudget {
		select {
		case <-t.room:
		case <-t.closing:
			return false
		}
	}
	return !deadline.IsClosed(t.closing)
}

// handedOut takes n bytes of a frame's buffer out of the budget (the
// application took the frame, or it was dropped) and wakes the reader.
func (t *Conn[C, N]) handedOut(n int64) {
	t.held.Add(-n)
	select {
	case t.room <- struct{}{}:
	default:
	}
}

// deliverLoop hands the messages readLoop received to Recv and Messages(),
// in order, one at a time: a message counts in the budget until it is
// taken. After Close it drops what is left. It closes msgs after the last.
func (t *Conn[C, N]) deliverLoop() {
	defer close(t.delivered)
	defer close(t.msgs)
	for b := range t.msgsIn {
		n := int64(b.Cap())
		select {
		case t.msgs <- b:
		case <-t.closing:
			b.Release()
		}
		t.handedOut(n)
	}
}

// reader is the stream as a plain io.Reader (so io.Copy in WriteTo does
// not come back to WriteTo).
type reader[C, N any] struct{ t *Conn[C, N] }

func (r reader[C, N]) Read(b []byte) (int, error) { return r.t.Read(b) }

// WriteTo writes the stream to w until the peer's end of stream.
func (t *Conn[C, N]) WriteTo(w io.Writer) (int64, error) { return io.Copy(w, reader[C, N]{t}) }

// Read reads the stream: io.EOF after the peer's end of stream, else an
// error wrapped in a *net.OpError.
func (t *Conn[C, N]) Read(b []byte) (int, error) {
	n, err := t.readStream(b)
	if err != nil && err != io.EOF {
		err = t.OpError("read", err)
	}
	return n, err
}

func (t *Conn[C, N]) readStream(b []byte) (int, error) {
	t.readMu.Lock()
	defer t.readMu.Unlock()
	for {
		if deadline.IsClosed(t.closing) {
			return 0, net.ErrClosed
		}
		if t.rdDeadline.Expired() {
			return 0, os.ErrDeadlineExceeded
		}
		if t.cur.Valid() {
			if len(b) == 0 {
				return 0, nil
			}
			n := copy(b, t.cur.Bytes()[t.curOff:])
			t.curOff += n
			if t.curOff == t.cur.Len() {
				t.cur.Release()
				t.cur = buffer.Buf{}
			}
			return n, nil
		}
		var c buffer.Buf
		var ok bool
		select {
		case c, ok = <-t.streamQ:
		default:
			if len(b) == 0 {
				return 0, nil
			}
			select {
			case c, ok = <-t.streamQ:
			case <-t.rdDeadline.Wait():
				continue
			case <-t.closing:
				continue
			}
		}
		if !ok {
			return 0, t.endErr()
		}
		t.handedOut(int64(c.Cap()))
		t.cur, t.curOff = c, 0
	}
}

// endErr is why the peer's frames ended: io.EOF after its CloseWrite or
// Close, else the error. Called once readerDone is closed (the queues are).
func (t *Conn[C, N]) endErr() error {
	<-t.readerDone
	switch {
	case deadline.IsClosed(t.closing):
		return net.ErrClosed
	case t.rerr == nil || t.rerr == io.EOF:
		return io.EOF
	}
	return t.rerr
}
