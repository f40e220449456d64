package grpcrdma

import (
	"context"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/grpcrdma/internal/flow"
	"github.com/verbline/rdma/grpcrdma/internal/frame"
)

// inMsg is a received message waiting for its reader: either the received
// buffer itself (held) or a heap copy.
type inMsg struct {
	buf    buffer.Buf
	data   []byte
	held   bool
	tooBig bool // above the stream's limit: dropped on arrival
	size   int  // its length, counted in both windows until read
}

func (m *inMsg) release(t *transport) {
	if m.held {
		m.buf.Release()
		t.held.Add(-1)
		m.held = false
	}
	m.data = nil
}

// stream is one call's state on a transport, shared by the client and
// server sides: the receive queue the reader fills and the flow control
// of both directions.
type stream struct {
	t       *transport
	id      uint32
	send    *flow.Send // what this side may still send
	maxRecv int        // set before the first message can arrive
	slot    bool       // client: holds one of t.slots; guarded by t.mu

	mu        sync.Mutex // guards the fields below
	recv      flow.Recv
	queue     []inMsg
	queue0    [1]inMsg    // queue's first backing array: a unary call's one message needs no allocation
	header    metadata.MD // the peer's headers (client: response headers)
	gotHeader bool
	trailer   metadata.MD
	st        *status.Status // client: the status the server sent
	peerEnd   bool           // the peer sends nothing more
	err       error          // a status error that ended the stream here
	cancelled bool           // server: the client cancelled
	onCancel  func(codes.Code)
	wake      chan struct{} // a token when the fields above change
	done      chan struct{} // closed once err is set
}

func newStream(t *transport, id uint32) *stream {
	s := &stream{
		t:       t,
		id:      id,
		send:    flow.NewSend(t.peer.StreamWindow),
		maxRecv: t.local.maxRecvMsg,
		recv:    flow.NewRecv(uint32(t.local.streamWindow)),
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	s.queue = s.queue0[:0]
	return s
}

func (s *stream) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// deliver takes a STREAM frame from the reader; it owns b. An error is
// the peer's protocol violation.
func (s *stream) deliver(f frame.Frame, blk frame.Block, b buffer.Buf) error {
	finished, err := s.deliverLocked(f, blk, b)
	if finished {
		// Forgotten before the reader reads on: a connection that ends
		// right after the status does not fail a call that completed.
		s.t.remove(s)
	}
	return err
}

func (s *stream) deliverLocked(f frame.Frame, blk frame.Block, b buffer.Buf) (finished bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.signal()
	if s.peerEnd {
		b.Release()
		return false, fmt.Errorf("stream %d: a frame after the peer's end of stream", s.id)
	}
	if f.Flags&frame.FlagHeaders != 0 {
		if s.gotHeader {
			b.Release()
			return false, fmt.Errorf("stream %d: headers twice", s.id)
		}
		s.gotHeader = true
		s.header = blk.Header
		if s.header == nil && !s.t.server {
			s.header = metadata.MD{} // the caller's grpc.Header gets a map it may write to
		}
	} else if !s.gotHeader && f.Flags&frame.FlagStatus == 0 {
		b.Release()
		return false, fmt.Errorf("stream %d: a frame before the headers", s.id)
	}
	if f.Flags&frame.FlagMessage != 0 {
		n := len(f.Message)
		if err := s.recv.Received(n); err != nil {
			b.Release()
			return false, fmt.Errorf("stream %d: %w", s.id, err)
		}
		m := inMsg{data: f.Message, size: n}
		switch {
		case s.err != nil:
			// Ended here: nobody reads it.
			s.recv.Consumed(n)
			s.t.returned(n)
			b.Release()
		case n > s.maxRecv:
			// Dropped now; the reader learns of it in order, and returns
			// its bytes to the window then.
			b.Release()
			s.queue = append(s.queue, inMsg{tooBig: true, size: n})
		case s.t.held.Add(1) <= maxHeld:
			m.buf, m.held = b, true
			s.queue = append(s.queue, m)
		default:
			s.t.held.Add(-1)
			s.t.copied.Add(1)
			m.data = append([]byte(nil), f.Message...)
			b.Release()
			s.queue = append(s.queue, m)
		}
	} else {
		b.Release()
	}
	if f.Flags&frame.FlagEnd != 0 {
		s.peerEnd = true
	}
	if f.Flags&frame.FlagStatus != 0 {
		s.peerEnd = true
		s.trailer = blk.Trailer
		if s.trailer == nil {
			s.trailer = metadata.MD{}
		}
		s.st = statusFromBlock(blk)
		return true, nil
	}
	return false, nil
}

// next waits for the next message; at the peer's end it returns io.EOF, or
// the stream's error. done, if closed, ends the wait with errDone.
func (s *stream) next(ctx context.Context) (inMsg, error) {
	for {
		s.mu.Lock()
		if len(s.queue) > 0 {
			m := s.queue[0]
			s.queue[0] = inMsg{}
			s.queue = s.queue[1:]
			s.mu.Unlock()
			return m, nil
		}
		err, end := s.err, s.peerEnd
		s.mu.Unlock()
		if err != nil {
			return inMsg{}, err
		}
		if end {
			return inMsg{}, io.EOF
		}
		select {
		case <-s.wake:
		case <-s.done:
		case <-ctx.Done():
			return inMsg{}, status.FromContextError(ctx.Err()).Err()
		}
	}
}

// consumed returns n read bytes to the peer's windows once enough are.
func (s *stream) consumed(n int) {
	s.t.returned(n)
	s.mu.Lock()
	inc := s.recv.Consumed(n)
	live := !s.peerEnd && s.err == nil
	s.mu.Unlock()
	if inc > 0 && live {
		s.t.sendControl(frame.Header{Type: frame.TypeWindow, Stream: s.id, Value: inc}, nil)
	}
}

// waitHeader waits until the peer's headers, its end or an error.
func (s *stream) waitHeader(ctx context.Context) (metadata.MD, error) {
	for {
		s.mu.Lock()
		h, got, end, err := s.header, s.gotHeader, s.peerEnd, s.err
		s.mu.Unlock()
		if got {
			return h, nil
		}
		if err != nil {
			return nil, err
		}
		if end {
			return metadata.MD{}, nil
		}
		select {
		case <-s.wake:
		case <-s.done:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
}

// fail ends the stream here with a status error: blocked and later
// operations return it; queued messages are dropped. It reports whether
// this call ended it.
func (s *stream) fail(err error) bool {
	if !s.end(err) {
		return false
	}
	s.t.remove(s)
	return true
}

// end is fail without forgetting the stream: its owner sends its last
// frame before it lets the transport forget it (and maybe close).
func (s *stream) end(err error) bool {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return false
	}
	s.err = err
	q := s.queue
	s.queue = nil
	s.mu.Unlock()
	s.dropped(q)
	close(s.done)
	return true
}

// dropped releases messages nobody will read and gives their bytes back to
// the connection window (the stream's no longer matters).
func (s *stream) dropped(q []inMsg) {
	n := 0
	for i := range q {
		q[i].release(s.t)
		n += q[i].size
	}
	s.t.returned(n)
}

// ended reports whether the stream is over here or at the peer.
func (s *stream) ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peerEnd || s.err != nil
}

// peerCancel handles the peer's CANCEL.
func (s *stream) peerCancel(code codes.Code, msg string) {
	if msg == "" {
		msg = "grpcrdma: the peer cancelled the call"
	}
	s.mu.Lock()
	s.cancelled = true
	f := s.onCancel
	s.mu.Unlock()
	if f != nil {
		f(code)
	}
	s.fail(status.Error(code, msg))
}

// drop releases whatever the stream still queues.
func (s *stream) drop() {
	s.mu.Lock()
	q := s.queue
	s.queue = nil
	s.mu.Unlock()
	s.dropped(q)
}
