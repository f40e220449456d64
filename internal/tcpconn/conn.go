// Package tcpconn is the TCP fallback's connection: the inside of a
// TCP-backed rdma.Conn, its stream and message view framed over one TCP
// connection (internal/tcpframe) with the semantics of the RDMA ones. The
// root package's fallback dialer and listener make one (Dial, Accept) and
// its Conn defers every call to it.
//
// The package cannot import the root package, whose types it hands out.
// Conn is generic over the root's completion type C, made by a func the
// root passes, and its notification type N (a channel never sent on,
// closed when the reader ends): Completions() and Notifications() are then
// the root's channel types as they are, with no copy and no goroutine in
// between. Options carries the few Config values a connection uses. The
// errors both transports return are internal/errs' values, which the root
// package exports, so errors.Is answers the same from either.
package tcpconn

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/deadline"
	"github.com/verbline/rdma/internal/tcpframe"
)

// Options are what a connection takes from the root package's Config
// (its defaults applied), and the pool its buffers come from.
type Options struct {
	// RecvBuffers x BufferSize is the receive budget; SendBuffers bounds
	// the writer's queue and Completions(); BufferSize is also the largest
	// stream frame this side accepts.
	RecvBuffers, SendBuffers, BufferSize int
	// MaxMessageSize caps the largest message this side accepts (0: the
	// pool's largest buffer; never below BufferSize).
	MaxMessageSize int
	// KeepAlive > 0 turns TCP keepalive on with this period; < 0 turns it off.
	KeepAlive time.Duration
	// HandshakeTimeout bounds the listener's hello exchange and a peer's
	// pause inside a frame.
	HandshakeTimeout time.Duration
	// CloseTimeout bounds Close's delivery and CloseWrite's wait for room.
	CloseTimeout time.Duration
	// Pool is the TCP-backed connections' pool, not registered with a device.
	Pool *buffer.Pool
}

// RecvBudget is the bytes of pool buffers a connection's received frames
// may hold before its reader waits for the application: RecvBuffers x
// BufferSize, what an RDMA connection's receive ring holds.
func (o *Options) RecvBudget() int64 {
	return int64(o.RecvBuffers) * int64(o.BufferSize)
}

// limits are the limits a side with o accepts.
func (o *Options) limits() tcpframe.Limits {
	largest := o.Pool.MaxSize()
	maxMsg := largest
	if o.MaxMessageSize > 0 {
		maxMsg = min(maxMsg, o.MaxMessageSize)
	}
	maxMsg = min(max(maxMsg, o.BufferSize), largest)
	return tcpframe.Limits{MaxMessage: maxMsg, MaxChunk: min(o.BufferSize, largest)}
}

// Conn is one TCP-backed connection: one goroutine reads frames and hands
// stream chunks and messages to Read and Recv (reader.go); one goroutine
// writes the frames Write, Send and CloseWrite queue, in order, so that a
// deadline or a Close never cuts a frame in half (writer.go).
//
// What a peer can make this side hold is bounded per connection: the
// received frames not yet handed to the application (stream chunks until
// Read takes them from the queue, messages until Recv or Messages() hands
// them out) may hold at most recvBudget bytes of pool buffers before the
// reader stops reading the socket. It then waits for the application, and
// TCP's flow control stops the peer, as a closed RDMA credit window does:
// nothing is lost. The budget gates the start of the next frame, not the
// frame itself, so a message larger than the budget is still received;
// the most a connection holds is recvBudget plus one frame's buffer (and
// the stream chunk Read is copying from).
type Conn[C, N any] struct {
	// Immutable after makeConn (fallbackReason: before the Conn is handed out).
	nc           *net.TCPConn
	src          frameSource // what readLoop reads: nc
	opt          Options
	laddr, raddr net.Addr
	lim          tcpframe.Limits // what this side accepts
	peerMaxMsg   int             // the largest message the peer accepts
	peerChunk    int             // the largest stream frame the peer accepts
	pool         *buffer.Pool
	recvBudget   int64                        // opt.RecvBudget()
	completion   func(id uint64, err error) C // makes a PostSend's end for opDone
	// fallbackReason is why a fallback dial took TCP (the RDMA attempt's
	// error); nil on the listener's side.
	fallbackReason error

	closing    chan struct{}   // closed by Close
	ctx        context.Context // ends with Close: bounds the reader's wait for a buffer
	cancel     context.CancelFunc
	closeOnce  sync.Once
	closeErr   error
	readerDone chan struct{} // closed when readLoop stops taking frames, after rerr is set
	drained    chan struct{} // closed when readLoop ends (after Close, once it stopped draining the socket)
	writerDone chan struct{} // closed when writeLoop ends

	// The reader's side. streamQ and msgsIn are closed by readLoop, their
	// only sender, when it ends; rerr (set before) says why. deliverLoop
	// moves messages from msgsIn to msgs (unbuffered: a message leaves the
	// budget when the application takes it) and closes msgs after the last.
	streamQ    chan buffer.Buf
	msgsIn     chan buffer.Buf
	msgs       chan buffer.Buf
	held       atomic.Int64  // bytes of pool buffers in frames received and not handed out
	room       chan struct{} // a token when held went down
	delivered  chan struct{} // closed when deliverLoop ends
	notes      chan N        // never sent on: closed when readLoop ends
	rerr       error
	readMu     sync.Mutex // one Read at a time; guards cur
	cur        buffer.Buf // the stream chunk being read
	curOff     int
	rdDeadline deadline.Deadline

	// The writer's side. Producers hold wmu shared while they queue, Close
	// exclusively to stop them; wmu guards closed and finSent.
	out        chan outFrame
	wmu        sync.RWMutex
	closed     bool
	finSent    bool
	writeMu    sync.Mutex // one Write or CloseWrite at a time: a Write's chunks stay together
	wrDeadline deadline.Deadline
	wdead      chan struct{} // closed when writing failed; werr says why
	werr       error
	werrOnce   sync.Once
	opDone     chan C
	asyncOut   atomic.Int64 // PostSends queued whose completion is not yet on opDone
}

// frameSource is the connection readLoop reads frames from, which it
// closes when the peer breaks the protocol (a *net.TCPConn).
type frameSource interface {
	tcpframe.Conn
	io.Closer
}

// newConn starts a connection over nc, whose hellos were exchanged.
func newConn[C, N any](nc *net.TCPConn, o *Options, lim tcpframe.Limits, completion func(uint64, error) C,
	peer tcpframe.Hello) *Conn[C, N] {
	if o.KeepAlive > 0 {
		nc.SetKeepAlive(true)
		nc.SetKeepAlivePeriod(o.KeepAlive)
	} else if o.KeepAlive < 0 {
		nc.SetKeepAlive(false)
	}
	nc.SetNoDelay(true)
	t := makeConn[C, N](nc, o, lim, completion, peer)
	t.nc, t.laddr, t.raddr = nc, nc.LocalAddr(), nc.RemoteAddr()
	go t.readLoop()
	go t.deliverLoop()
	go t.writeLoop()
	return t
}

// makeConn makes a Conn whose reader reads frames from src (the TCP
// connection; a test's pipe) within lim, without starting its goroutines.
func makeConn[C, N any](src frameSource, o *Options, lim tcpframe.Limits, completion func(uint64, error) C,
	peer tcpframe.Hello) *Conn[C, N] {
	largest := o.Pool.MaxSize()
	t := &Conn[C, N]{
		src: src, opt: *o, lim: lim,
		peerMaxMsg: min(int(peer.MaxMessage), largest),
		peerChunk:  min(int(peer.MaxChunk), largest),
		pool:       o.Pool,
		recvBudget: o.RecvBudget(),
		completion: completion,
		closing:    make(chan struct{}),
		readerDone: make(chan struct{}),
		drained:    make(chan struct{}),
		writerDone: make(chan struct{}),
		streamQ:    make(chan buffer.Buf, o.RecvBuffers),
		msgsIn:     make(chan buffer.Buf, o.RecvBuffers),
		msgs:       make(chan buffer.Buf),
		room:       make(chan struct{}, 1),
		delivered:  make(chan struct{}),
		notes:      make(chan N),
		rdDeadline: deadline.New(),
		out:        make(chan outFrame, o.SendBuffers),
		wrDeadline: deadline.New(),
		wdead:      make(chan struct{}),
		opDone:     make(chan C, o.SendBuffers),
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	return t
}

// OpError wraps err as every error leaving the connection is: a
// *net.OpError naming op, the network "tcp" and both addresses.
func (t *Conn[C, N]) OpError(op string, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: t.laddr, Addr: t.raddr, Err: err}
}

// SockErr strips the socket's own *net.OpError, so that errors leaving the
// connection (or the fallback listener) are wrapped once, with their own
// operation.
func SockErr(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return oe.Err
	}
	return err
}

// SetFallbackReason records why a fallback dial took TCP. Called once,
// before the connection is handed out.
func (t *Conn[C, N]) SetFallbackReason(err error) { t.fallbackReason = err }

// FallbackReason is why a fallback dial took TCP, or nil (an accepted connection).
func (t *Conn[C, N]) FallbackReason() error { return t.fallbackReason }

// LocalAddr returns the TCP connection's local address.
func (t *Conn[C, N]) LocalAddr() net.Addr { return t.laddr }

// RemoteAddr returns the TCP connection's remote address.
func (t *Conn[C, N]) RemoteAddr() net.Addr { return t.raddr }

// MaxMessageSize is the largest message the peer accepts.
func (t *Conn[C, N]) MaxMessageSize() int { return t.peerMaxMsg }

// Messages delivers the received messages; it is closed after the last.
func (t *Conn[C, N]) Messages() <-chan buffer.Buf { return t.msgs }

// Notifications is never sent on (TCP carries no remote writes): it is
// closed when the reader ends, as an RDMA connection's is.
func (t *Conn[C, N]) Notifications() <-chan N { return t.notes }

// Completions delivers the ends of PostSends, made by the completion func.
func (t *Conn[C, N]) Completions() <-chan C { return t.opDone }

func (t *Conn[C, N]) checkOpen(op string) error {
	if deadline.IsClosed(t.closing) {
		return t.OpError(op, net.ErrClosed)
	}
	return nil
}

// SetDeadline sets the read deadline (rd), the write deadline (wr) or
// both; op names the call in the error after Close.
func (t *Conn[C, N]) SetDeadline(op string, t0 time.Time, rd, wr bool) error {
	if err := t.checkOpen(op); err != nil {
		return err
	}
	if rd {
		t.rdDeadline.Set(t0)
	}
	if wr {
		t.wrDeadline.Set(t0)
	}
	return nil
}
