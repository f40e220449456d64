package tcpconn

import (
	"errors"
	"net"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/errs"
)

// Close delivers what was queued before it (within Options.CloseTimeout),
// then the end of stream, waits for the peer's acknowledgement where the
// system tells, and releases every buffer nobody took. Later calls return
// the first one's error.
func (t *Conn[C, N]) Close() error {
	t.closeOnce.Do(func() { t.closeErr = t.shutdown() })
	if t.closeErr != nil {
		return t.OpError("close", t.closeErr)
	}
	return nil
}

func (t *Conn[C, N]) shutdown() error {
	close(t.closing) // blocked callers leave; queue() sees it
	t.cancel()
	t.wmu.Lock() // ... and no producer is inside queue() after this
	t.closed = true
	t.wmu.Unlock()

	// The writer delivers what was queued before Close, within CloseTimeout.
	deadline := time.Now().Add(t.opt.CloseTimeout)
	t.nc.SetWriteDeadline(deadline)
	var err error
	select {
	case t.out <- outFrame{typ: frameStop}:
	case <-t.wdead:
		// The writer failed; it still drains (without writing) and ends at
		// the stop mark, which may wait for its room.
		t.out <- outFrame{typ: frameStop}
	}
	<-t.writerDone
	if t.writeFailed() {
		var ne net.Error
		if errors.As(t.werr, &ne) && ne.Timeout() {
			err = &errs.CloseTimeout{What: "data written before Close was not taken by the peer"}
		}
	} else {
		// The end of stream follows the frames written (a second shutdown
		// after CloseWrite's changes nothing), and the socket stays open
		// until the peer's TCP acknowledged all of it: closing it with
		// unread input resets the connection, which loses what is still
		// in flight.
		t.nc.CloseWrite()
		err = t.waitAcked(deadline)
	}
	t.nc.Close() // ends readLoop
	<-t.readerDone
	<-t.drained
	t.releaseUntaken()
	return err
}

// releaseUntaken gives back to the pool what nobody received, once the
// reader and the deliverer ended.
func (t *Conn[C, N]) releaseUntaken() {
	for b := range t.streamQ {
		t.handedOut(int64(b.Cap()))
		b.Release()
	}
	for b := range t.msgs {
		b.Release()
	}
	<-t.delivered
	t.readMu.Lock()
	if t.cur.Valid() {
		t.cur.Release()
		t.cur = buffer.Buf{}
	}
	t.readMu.Unlock()
}

// waitAcked waits until nothing this side sent awaits the peer's
// acknowledgement (its end of stream included), or the connection is gone,
// or deadline passes: then it returns a timeout. Where the system does not
// say (sendSettled's known is false) it returns nil at once, and Close
// delivers to the socket, as a net.TCPConn's does.
func (t *Conn[C, N]) waitAcked(deadline time.Time) error {
	wait := 50 * time.Microsecond
	for {
		settled, known := sendSettled(t.nc)
		if settled || !known {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return &errs.CloseTimeout{What: "data written before Close was not acknowledged by the peer"}
		}
		time.Sleep(min(wait, left))
		wait = min(2*wait, 10*time.Millisecond)
	}
}
