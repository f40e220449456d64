package grpcrdma

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/grpcrdma/internal/flow"
	"github.com/verbline/rdma/grpcrdma/internal/frame"
)

// maxHeld is how many received buffers the transport lets streams hold
// until their application reads them (the zero-copy path). Each holds one of
// the connection's receive buffers, and with it the peer's credit: past
// this count a message is copied to the heap and its buffer released at
// once, so a stream nobody reads never stops the connection's other streams.
const maxHeld = 2

// transport multiplexes calls over one rdma.Conn: a reader goroutine
// decodes every frame, hands stream frames to their stream and never blocks
// (it sends nothing; stream owners do).
type transport struct {
	conn     *rdma.Conn
	server   bool
	local    limits         // what this side accepts; immutable
	peer     frame.Settings // what the peer accepts; immutable after the handshake
	peerInfo *peer.Peer
	maxFrame int // the largest frame the connection sends
	ctx      context.Context
	cancel   context.CancelFunc

	connSend *flow.Send // what this side may still send over all streams (the peer's connection window)

	recvMu      sync.Mutex // guards the fields below: the connection window this side grants
	connRecv    flow.Recv
	connInc     uint32 // returned and not yet sent in a WINDOW frame
	connSending bool   // a goroutine is sending connInc

	held     atomic.Int32 // received buffers held by streams
	copied   atomic.Int64 // messages copied out of their receive buffer (past maxHeld)
	refusing atomic.Int32 // refusals being sent

	onStream func(*stream, frame.Block) // server: a new stream's first frame; runs on the reader
	onIdle   func(*transport)           // server: draining and no stream left

	openMu sync.Mutex // client: held while a stream gets its id and sends its first frame

	mu       sync.Mutex // guards the fields below
	streams  map[uint32]*stream
	lastID   uint32 // server: highest stream id opened by the peer; client: last id issued
	draining bool   // server: GOAWAY sent; client: GOAWAY received; no new streams
	goAwayID uint32 // client: the last stream id the server serves
	err      error  // why the transport closed; set once
	done     chan struct{}

	slots      chan struct{} // client: a token per stream the server lets run at once
	readerDone chan struct{}
}

// handshake exchanges SETTINGS on a new connection: both sides send theirs
// first and then wait for the peer's, so neither waits for the other.
func handshake(ctx context.Context, c *rdma.Conn, local limits, server bool) (frame.Settings, error) {
	ms := uint32(0)
	if server {
		ms = uint32(local.maxStreams)
	}
	s := frame.Settings{
		Major: frame.Major, Minor: frame.Minor,
		StreamWindow: uint32(local.streamWindow), ConnWindow: uint32(local.connWindow), MaxStreams: ms,
		MaxBlock: uint32(local.maxBlock), MaxRecvMessage: uint32(min(local.maxRecvMsg, 1<<32-1)),
	}
	b, err := c.Alloc(frame.HeaderLen + frame.SettingsLen)
	if err != nil {
		return frame.Settings{}, err
	}
	frame.Header{Type: frame.TypeSettings}.Put(b.Bytes())
	s.Append(b.Bytes()[frame.HeaderLen:frame.HeaderLen])
	if err := c.Send(ctx, b); err != nil {
		return frame.Settings{}, err
	}
	m, err := c.Recv(ctx)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return frame.Settings{}, fmt.Errorf("grpcrdma handshake: the peer closed the connection: %w", err)
		}
		return frame.Settings{}, err
	}
	defer m.Release()
	f, err := frame.Parse(m.Bytes(), frame.Limits{MaxBlock: local.maxBlock})
	if err != nil {
		return frame.Settings{}, fmt.Errorf("%w: grpcrdma handshake: %w", rdma.ErrProtocol, err)
	}
	if f.Type != frame.TypeSettings {
		return frame.Settings{}, fmt.Errorf("%w: grpcrdma handshake: first frame is %v, want SETTINGS", rdma.ErrProtocol, f.Type)
	}
	ps, err := frame.ParseSettings(f.Message)
	if err != nil {
		return frame.Settings{}, fmt.Errorf("%w: grpcrdma handshake: %w", rdma.ErrProtocol, err)
	}
	if !server && ps.MaxStreams == 0 {
		return frame.Settings{}, fmt.Errorf("%w: grpcrdma handshake: the server serves no stream", rdma.ErrProtocol)
	}
	return ps, nil
}

func newTransport(c *rdma.Conn, local limits, ps frame.Settings, server bool) *transport {
	ctx, cancel := context.WithCancel(context.Background())
	t := &transport{
		conn:       c,
		server:     server,
		local:      local,
		peer:       ps,
		peerInfo:   &peer.Peer{Addr: c.RemoteAddr(), LocalAddr: c.LocalAddr()},
		maxFrame:   c.MaxMessageSize(),
		connSend:   flow.NewSend(ps.ConnWindow),
		connRecv:   flow.NewRecv(uint32(local.connWindow)),
		ctx:        ctx,
		cancel:     cancel,
		streams:    map[uint32]*stream{},
		done:       make(chan struct{}),
		readerDone: make(chan struct{}),
	}
	if !server {
		t.slots = make(chan struct{}, min(ps.MaxStreams, 1<<20))
	}
	return t
}

func (t *transport) start() { go t.readLoop() }

func (t *transport) readLoop() {
	defer close(t.readerDone)
	for {
		b, err := t.conn.Recv(context.Background())
		if err != nil {
			t.close(err)
			return
		}
		if err := t.handle(b); err != nil {
			t.close(fmt.Errorf("%w: grpcrdma: %w", rdma.ErrProtocol, err))
			return
		}
	}
}

// handle processes one received frame; an error is the peer's protocol
// violation. It owns b: it releases it or passes it to a stream.
func (t *transport) handle(b buffer.Buf) error {
	f, err := frame.Parse(b.Bytes(), frame.Limits{MaxBlock: t.local.maxBlock})
	if err != nil {
		b.Release()
		return err
	}
	switch f.Type {
	case frame.TypeStream:
		return t.handleStream(f, b)
	case frame.TypeWindow, frame.TypeCancel:
		var msg string
		if f.Type == frame.TypeCancel {
			msg = string(f.Message)
		}
		b.Release()
		if f.Stream == 0 { // WINDOW: the connection's
			return t.connSend.Return(f.Value)
		}
		s, err := t.lookup(f.Stream)
		if s == nil || err != nil {
			return err
		}
		if f.Type == frame.TypeWindow {
			return s.send.Return(f.Value)
		}
		s.peerCancel(codes.Code(f.Value), msg)
		return nil
	case frame.TypeGoAway:
		b.Release()
		if t.server {
			return nil // a client's GOAWAY says nothing a server acts on
		}
		t.goAway(f.Value)
		return nil
	default: // SETTINGS
		b.Release()
		return fmt.Errorf("%v frame after the handshake", f.Type)
	}
}

// lookup returns stream id's stream, nil if it has ended, or an error if
// the peer names a stream that never was.
func (t *transport) lookup(id uint32) (*stream, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.streams[id]; s != nil {
		return s, nil
	}
	if id > t.lastID {
		return nil, fmt.Errorf("frame for stream %d, which was never opened (last %d)", id, t.lastID)
	}
	return nil, nil // ended: frames crossing its end are dropped
}

// received accounts a message's n bytes against the connection window
// this side grants, or reports the peer's violation.
func (t *transport) received(n int) error {
	t.recvMu.Lock()
	defer t.recvMu.Unlock()
	if err := t.connRecv.Received(n); err != nil {
		return fmt.Errorf("connection: %w", err)
	}
	return nil
}

// returned gives n message bytes back to the connection window: read by
// the application, or dropped. A WINDOW frame goes out once half the
// window is back, from one goroutine at a time (the reader may call this,
// and must never wait for a send).
func (t *transport) returned(n int) {
	if n == 0 {
		return
	}
	t.recvMu.Lock()
	t.connInc += t.connRecv.Consumed(n)
	start := t.connInc > 0 && !t.connSending
	if start {
		t.connSending = true
	}
	t.recvMu.Unlock()
	if start {
		go t.sendConnWindow()
	}
}

func (t *transport) sendConnWindow() {
	for {
		t.recvMu.Lock()
		inc := t.connInc
		t.connInc = 0
		if inc == 0 {
			t.connSending = false
			t.recvMu.Unlock()
			return
		}
		t.recvMu.Unlock()
		t.sendControl(frame.Header{Type: frame.TypeWindow, Value: inc}, nil)
	}
}

// acquire takes n bytes of both windows a message goes through, the
// stream's and the connection's, waiting as flow.Send.Acquire does. A
// context that ends the wait is a status error (DeadlineExceeded,
// Canceled), as gRPC reports it.
func (t *transport) acquire(ctx context.Context, s *stream, errDone error, n int) error {
	err := s.send.Acquire(ctx, s.done, errDone, n)
	if err == nil {
		if err = t.connSend.Acquire(ctx, s.done, errDone, n); err != nil {
			s.send.Return(uint32(n)) // never sent: not the peer's to return
		}
	}
	if err != nil && err != errDone && ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	return err
}

func (t *transport) handleStream(f frame.Frame, b buffer.Buf) error {
	if f.Flags&frame.FlagMessage != 0 {
		// Counted before anything else: every path below that drops the
		// message gives its bytes back.
		if err := t.received(len(f.Message)); err != nil {
			b.Release()
			return fmt.Errorf("stream %d: %w", f.Stream, err)
		}
	}
	var blk frame.Block
	if len(f.Block) > 0 {
		var err error
		if blk, err = frame.ParseBlock(f.Block); err != nil {
			b.Release()
			return err
		}
		blk.Details = append([]byte(nil), blk.Details...) // the block dies with b
	}
	if !t.server && f.Flags&frame.FlagEnd != 0 {
		b.Release()
		return fmt.Errorf("stream %d: END from a server", f.Stream)
	}
	if t.server {
		if f.Flags&frame.FlagStatus != 0 {
			b.Release()
			return fmt.Errorf("stream %d: STATUS from a client", f.Stream)
		}
		t.mu.Lock()
		if f.Stream > t.lastID {
			if f.Flags&frame.FlagHeaders == 0 {
				t.mu.Unlock()
				b.Release()
				return fmt.Errorf("stream %d opened without headers", f.Stream)
			}
			t.lastID = f.Stream
			s := newStream(t, f.Stream)
			refuse := t.draining || len(t.streams) >= t.local.maxStreams || t.err != nil
			if !refuse {
				t.streams[s.id] = s
			}
			t.mu.Unlock()
			if refuse {
				t.returned(len(f.Message))
				b.Release()
				if t.refusing.Add(1) > maxRefusing {
					// A client that keeps opening calls it was told not to
					// would have this side hold a goroutine for each.
					return fmt.Errorf("stream %d: %d calls refused and not yet answered", f.Stream, maxRefusing)
				}
				go t.refuse(s.id)
				return nil
			}
			// The headers are the stream's; what else the frame carries is
			// delivered after the server has set the stream up.
			t.onStream(s, blk)
			return s.deliver(f, blk, b)
		}
		t.mu.Unlock()
	}
	s, err := t.lookup(f.Stream)
	if s == nil || err != nil {
		t.returned(len(f.Message))
		b.Release()
		return err
	}
	return s.deliver(f, blk, b)
}

// refuse ends a stream the server does not run (limit reached, or
// draining) with a status the client can retry on.
func (t *transport) refuse(id uint32) {
	st := status.New(codes.Unavailable, "grpcrdma: stream refused: the server is draining or at its concurrent stream limit")
	blk := appendStatus(nil, st, nil)
	t.sendFrame(t.ctx, frame.Header{Type: frame.TypeStream, Flags: frame.FlagStatus, Stream: id, Value: uint32(len(blk))}, blk, nil)
	t.refusing.Add(-1)
}

// maxRefusing bounds the refusals being sent at once on a connection.
const maxRefusing = 64

// goAway handles the server's GOAWAY on a client: streams above last were
// not served and fail with Unavailable; no new stream starts here.
func (t *transport) goAway(last uint32) {
	t.mu.Lock()
	t.draining = true
	t.goAwayID = last
	var failed []*stream
	for id, s := range t.streams {
		if id > last {
			failed = append(failed, s)
		}
	}
	t.mu.Unlock()
	for _, s := range failed {
		s.fail(errUnserved)
	}
	t.maybeIdle()
}

// remove forgets a stream that ended, and gives back its slot.
func (t *transport) remove(s *stream) {
	if t.forget(s) {
		t.maybeIdle()
	}
}

// forget is remove without the idle check, for a server stream whose
// STATUS is still to go out: it no longer counts against the stream limit
// (the client may open the next call as soon as it sees the STATUS), but
// the transport must not close before the STATUS is sent.
func (t *transport) forget(s *stream) bool {
	t.mu.Lock()
	ok := s.id != 0 && t.streams[s.id] == s
	if ok {
		delete(t.streams, s.id)
	}
	slot := s.slot
	s.slot = false
	t.mu.Unlock()
	if slot {
		<-t.slots
	}
	return ok
}

// releaseSlot gives back a slot taken for a stream that never started.
func (t *transport) releaseSlot() { <-t.slots }

// open gives a client stream its id and sends its first frame: ids are
// issued and sent under openMu, so they reach the server in order.
func (t *transport) open(ctx context.Context, s *stream, h frame.Header, block []byte, e *encoded) error {
	t.openMu.Lock()
	defer t.openMu.Unlock()
	t.mu.Lock()
	if t.err != nil || t.draining {
		t.mu.Unlock()
		if e != nil {
			e.free()
		}
		return errNotOpened
	}
	t.lastID++
	s.id = t.lastID
	t.streams[s.id] = s
	t.mu.Unlock()
	h.Stream = s.id
	return t.sendFrame(ctx, h, block, e)
}

// maybeIdle tells the owner of a draining transport that its last stream
// ended.
func (t *transport) maybeIdle() {
	t.mu.Lock()
	idle := t.draining && len(t.streams) == 0 && t.err == nil
	t.mu.Unlock()
	if idle {
		if t.onIdle != nil {
			t.onIdle(t)
		} else {
			go t.close(errors.New("grpcrdma: connection drained"))
		}
	}
}

// errClosed returns the status error a call on a closed transport fails with.
func (t *transport) errClosed() error {
	t.mu.Lock()
	err := t.err
	t.mu.Unlock()
	return closedStatus(err)
}

func closedStatus(err error) error {
	if errors.Is(err, rdma.ErrProtocol) {
		return status.Errorf(codes.Internal, "grpcrdma: connection closed: %v", err)
	}
	return status.Errorf(codes.Unavailable, "grpcrdma: connection closed: %v", err)
}

// close ends the transport and every stream on it, once.
func (t *transport) close(err error) {
	t.mu.Lock()
	if t.err != nil {
		t.mu.Unlock()
		return
	}
	if err == nil {
		err = errors.New("grpcrdma: connection closed")
	}
	t.err = err
	streams := make([]*stream, 0, len(t.streams))
	for _, s := range t.streams {
		streams = append(streams, s)
	}
	t.mu.Unlock()
	// Streams first: a handler that sees its context end must find its
	// call over, not send a status of its own.
	st := closedStatus(err)
	for _, s := range streams {
		s.fail(st)
	}
	t.cancel()
	t.conn.Close()
	close(t.done)
}

// alive reports whether new streams may start on t.
func (t *transport) usable() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err == nil && !t.draining
}

// sendFrame sends one frame: h, the header block, then msg's bytes. It
// builds the frame in a buffer from the connection's pool, so the message
// is marshalled straight into registered memory. ctx bounds the wait for
// the connection's credit.
func (t *transport) sendFrame(ctx context.Context, h frame.Header, block []byte, msg *encoded) error {
	if h.Type == frame.TypeStream && len(block) > int(t.peer.MaxBlock) {
		if msg != nil {
			msg.free()
		}
		return status.Errorf(codes.ResourceExhausted, "grpcrdma: metadata of %d bytes, above the %d the peer accepts", len(block), t.peer.MaxBlock)
	}
	n := frame.HeaderLen + len(block)
	if msg != nil {
		n += msg.n
	}
	if n > t.maxFrame {
		if msg != nil {
			msg.free()
		}
		return status.Errorf(codes.ResourceExhausted, "grpcrdma: a frame of %d bytes is larger than the connection's largest message (%d)", n, t.maxFrame)
	}
	b, err := t.conn.Alloc(n)
	if err != nil {
		if msg != nil {
			msg.free()
		}
		return status.Errorf(codes.ResourceExhausted, "grpcrdma: no buffer for a frame of %d bytes: %v", n, err)
	}
	p := b.Bytes()
	h.Put(p)
	copy(p[frame.HeaderLen:], block)
	if msg != nil {
		if err := msg.writeTo(p[frame.HeaderLen+len(block):]); err != nil {
			b.Release()
			return err
		}
	}
	if err := t.conn.Send(ctx, b); err != nil {
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		t.close(err)
		return t.errClosed()
	}
	return nil
}

// sendControl sends a frame without a block or message (WINDOW, CANCEL,
// GOAWAY), bounded by the transport's life.
func (t *transport) sendControl(h frame.Header, payload []byte) {
	t.sendFrame(t.ctx, h, payload, nil)
}
