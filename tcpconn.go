package rdma

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/deadline"
	"github.com/verbline/rdma/internal/errs"
	"github.com/verbline/rdma/internal/tcpframe"
)

// tcpConn is the inside of a TCP-backed *Conn (fallback.go): the stream
// and the message view framed over one TCP connection (internal/tcpframe),
// with the semantics of the RDMA ones. One goroutine reads frames and
// hands stream chunks and messages to Read and Recv; one goroutine writes
// the frames Write, Send and CloseWrite queue, in order, so that a
// deadline or a Close never cuts a frame in half.
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
type tcpConn struct {
	// Immutable after newTCPConn.
	nc           *net.TCPConn
	src          frameSource // what readLoop reads: nc
	cfg          Config
	laddr, raddr net.Addr
	lim          tcpframe.Limits // what this side accepts
	peerMaxMsg   int             // the largest message the peer accepts
	peerChunk    int             // the largest stream frame the peer accepts
	pool         *buffer.Pool
	recvBudget   int64 // tcpRecvBudget(cfg)
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
	held       atomic.Int64      // bytes of pool buffers in frames received and not handed out
	room       chan struct{}     // a token when held went down
	delivered  chan struct{}     // closed when deliverLoop ends
	notes      chan Notification // never sent on: closed when readLoop ends
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
	opDone     chan OpCompletion
	asyncOut   atomic.Int64 // PostSends queued whose completion is not yet on opDone
}

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

// frameSource is the connection readLoop reads frames from, which it
// closes when the peer breaks the protocol (a *net.TCPConn).
type frameSource interface {
	tcpframe.Conn
	io.Closer
}

// tcpPool holds the TCP-backed connections' buffers: Alloc, received
// messages and stream chunks. It is not registered with any device. There
// is one per process, and the first fallback user's Config.PoolMaxBytes
// (0: 1 GiB) caps it for good: a fallback listener at Listen, a fallback
// dialer at its first TCP connection, whichever comes first. Later Configs
// neither raise nor lower it. This is the device pools' rule (a device's
// first connection sets its pool's cap), and a bound that any later
// caller could raise would bound nothing.
var tcpPool struct {
	mu sync.Mutex
	p  *buffer.Pool
}

// fallbackPoolFor returns the fallback pool, made with maxBytes (0: 1 GiB)
// as its cap if this is the first use.
func fallbackPoolFor(maxBytes int64) (*buffer.Pool, error) {
	tcpPool.mu.Lock()
	defer tcpPool.mu.Unlock()
	if tcpPool.p == nil {
		p, err := buffer.NewPool(nil, buffer.Options{MaxBytes: maxBytes})
		if err != nil {
			return nil, fmt.Errorf("the TCP fallback's buffer pool (Config.PoolMaxBytes %d): %w", maxBytes, err)
		}
		tcpPool.p = p
	}
	return tcpPool.p, nil
}

// fallbackPool returns the fallback pool (made with the default cap if
// this is the first use).
func fallbackPool() (*buffer.Pool, error) { return fallbackPoolFor(0) }

// tcpRecvBudget is the bytes of pool buffers a TCP-backed connection's
// received frames may hold before its reader waits for the application:
// RecvBuffers x BufferSize, what an RDMA connection's receive ring holds.
func tcpRecvBudget(cfg *Config) int64 {
	return int64(cfg.RecvBuffers) * int64(cfg.BufferSize)
}

// tcpLimits are the limits a side with cfg (defaults applied) accepts.
func tcpLimits(cfg *Config, pool *buffer.Pool) tcpframe.Limits {
	maxMsg := pool.MaxSize()
	if cfg.MaxMessageSize > 0 {
		maxMsg = min(maxMsg, cfg.MaxMessageSize)
	}
	maxMsg = min(max(maxMsg, cfg.BufferSize), pool.MaxSize())
	return tcpframe.Limits{MaxMessage: maxMsg, MaxChunk: min(cfg.BufferSize, pool.MaxSize())}
}

// tcpHandshakeDial runs the dialer's half of the hello exchange on nc,
// bounded by ctx.
func tcpHandshakeDial(ctx context.Context, nc *net.TCPConn, cfg *Config) (*tcpConn, error) {
	pool, err := fallbackPoolFor(cfg.PoolMaxBytes)
	if err != nil {
		return nil, err
	}
	lim := tcpLimits(cfg, pool)
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Now()) })
	defer stop()
	if d, ok := ctx.Deadline(); ok {
		nc.SetDeadline(d)
	}
	h := lim.Hello()
	if _, err := nc.Write(h.AppendTo(nil)); err != nil {
		return nil, ctxErr(ctx, err)
	}
	peer, err := tcpframe.ReadHello(nc)
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	if peer.Reject {
		return nil, fmt.Errorf("%w: listener refused the connection: %s", ErrHandshake, peer.Reason)
	}
	if !stop() {
		return nil, ctxErr(ctx, os.ErrDeadlineExceeded)
	}
	nc.SetDeadline(time.Time{})
	return newTCPConn(nc, cfg, pool, lim, peer), nil
}

// tcpHandshakeAccept runs the listener's half on nc: read the dialer's
// hello, ask admit, answer (or refuse) within cfg.HandshakeTimeout.
func tcpHandshakeAccept(nc *net.TCPConn, cfg *Config, admit func(*net.TCPConn) error) (*tcpConn, error) {
	pool, err := fallbackPoolFor(cfg.PoolMaxBytes)
	if err != nil {
		return nil, err
	}
	lim := tcpLimits(cfg, pool)
	nc.SetDeadline(time.Now().Add(cfg.HandshakeTimeout))
	peer, err := tcpframe.ReadHello(nc)
	if err != nil {
		if errors.Is(err, ErrHandshake) && !errors.Is(err, tcpframe.ErrNotFallbackPeer) {
			// A fallback dialer of another version: tell it why.
			tcpframe.WriteReject(nc, err.Error())
		}
		return nil, err
	}
	if peer.Reject {
		return nil, fmt.Errorf("%w: a dialer sent a reject", ErrHandshake)
	}
	if admit != nil {
		if aerr := admit(nc); aerr != nil {
			tcpframe.WriteReject(nc, aerr.Error())
			return nil, aerr
		}
	}
	h := lim.Hello()
	if _, err := nc.Write(h.AppendTo(nil)); err != nil {
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	return newTCPConn(nc, cfg, pool, lim, peer), nil
}

// ctxErr is err, or the context's reason if ctx ended (its AfterFunc set
// the deadline that caused err).
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		return err
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return os.ErrDeadlineExceeded
	}
	return ctx.Err()
}

func newTCPConn(nc *net.TCPConn, cfg *Config, pool *buffer.Pool, lim tcpframe.Limits, peer tcpframe.Hello) *tcpConn {
	if cfg.KeepAlive > 0 {
		nc.SetKeepAlive(true)
		nc.SetKeepAlivePeriod(cfg.KeepAlive)
	} else if cfg.KeepAlive < 0 {
		nc.SetKeepAlive(false)
	}
	nc.SetNoDelay(true)
	t := makeTCPConn(nc, cfg, pool, lim, peer)
	t.nc, t.laddr, t.raddr = nc, nc.LocalAddr(), nc.RemoteAddr()
	go t.readLoop()
	go t.deliverLoop()
	go t.writeLoop()
	return t
}

// makeTCPConn makes a tcpConn whose reader reads frames from src (the TCP
// connection; a test's pipe), without starting its goroutines.
func makeTCPConn(src frameSource, cfg *Config, pool *buffer.Pool, lim tcpframe.Limits, peer tcpframe.Hello) *tcpConn {
	t := &tcpConn{
		src: src, cfg: *cfg, lim: lim,
		peerMaxMsg: min(int(peer.MaxMessage), pool.MaxSize()),
		peerChunk:  min(int(peer.MaxChunk), pool.MaxSize()),
		pool:       pool,
		recvBudget: tcpRecvBudget(cfg),
		closing:    make(chan struct{}),
		readerDone: make(chan struct{}),
		drained:    make(chan struct{}),
		writerDone: make(chan struct{}),
		streamQ:    make(chan buffer.Buf, cfg.RecvBuffers),
		msgsIn:     make(chan buffer.Buf, cfg.RecvBuffers),
		msgs:       make(chan buffer.Buf),
		room:       make(chan struct{}, 1),
		delivered:  make(chan struct{}),
		notes:      make(chan Notification),
		rdDeadline: deadline.New(),
		out:        make(chan outFrame, cfg.SendBuffers),
		wrDeadline: deadline.New(),
		wdead:      make(chan struct{}),
		opDone:     make(chan OpCompletion, cfg.SendBuffers),
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	return t
}

func (t *tcpConn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: t.laddr, Addr: t.raddr, Err: err}
}

// sockErr strips the socket's own *net.OpError, so that errors leaving the
// Conn are wrapped once, with the Conn's operation.
func sockErr(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return oe.Err
	}
	return err
}

// readLoop reads frames until the connection ends or Close. After Close it
// reads and drops the socket's input until the peer's end of stream or
// until Close closes the socket: the peer's writes keep moving while Close
// waits for the peer to acknowledge what this side wrote (so two sides
// closing at once both deliver), and the socket is not left with unread
// input, which makes the kernel reset the connection when it is closed.
func (t *tcpConn) readLoop() {
	defer close(t.drained)
	fr := tcpframe.Reader{Conn: t.src, Lim: t.lim, Stall: t.cfg.HandshakeTimeout,
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
	if errors.Is(err, ErrProtocol) {
		t.src.Close() // the peer broke the protocol: the connection ends both ways
	}
	t.rerr = sockErr(err)
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
func (t *tcpConn) waitRoom() bool {
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
func (t *tcpConn) handedOut(n int64) {
	t.held.Add(-n)
	select {
	case t.room <- struct{}{}:
	default:
	}
}

// deliverLoop hands the messages readLoop received to Recv and Messages(),
// in order, one at a time: a message counts in the budget until it is
// taken. After Close it drops what is left. It closes msgs after the last.
func (t *tcpConn) deliverLoop() {
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

// writeLoop writes queued frames, several per system call when they queue
// up, until Close's stop mark.
func (t *tcpConn) writeLoop() {
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
				t.failWrite(sockErr(err))
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
						t.failWrite(sockErr(err))
					}
				}
			case frameStop:
				return
			default:
				f.buf.Release()
				if f.async {
					t.opDone <- OpCompletion{ID: f.id, Err: t.wrapAsync(err)}
					t.asyncOut.Add(-1)
				}
			}
		}
	}
}

func (t *tcpConn) wrapAsync(err error) error {
	if err == nil {
		return nil
	}
	return t.opError("send", err)
}

func (t *tcpConn) failWrite(err error) {
	t.werrOnce.Do(func() {
		t.werr = err
		close(t.wdead)
	})
}

func (t *tcpConn) writeFailed() bool { return deadline.IsClosed(t.wdead) }

// queue hands f to the writer, waiting for room (bounded by ctx, the write
// deadline and Close). On failure f is the caller's still.
func (t *tcpConn) queue(ctx context.Context, f outFrame) error {
	t.wmu.RLock()
	defer t.wmu.RUnlock()
	if err := t.writeErr(); err != nil {
		return err
	}
	return t.queueLocked(ctx, f)
}

// queueFIN queues the end-of-stream mark once closeWrite set finSent,
// which queue would refuse.
func (t *tcpConn) queueFIN(ctx context.Context) error {
	t.wmu.RLock()
	defer t.wmu.RUnlock()
	if t.closed {
		return net.ErrClosed
	}
	return t.queueLocked(ctx, outFrame{typ: frameFIN})
}

// queueLocked waits for room for f in the writer's queue. Called with wmu
// held shared.
func (t *tcpConn) queueLocked(ctx context.Context, f outFrame) error {
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
func (t *tcpConn) writeErr() error {
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

// tcpReader is a fallback connection's stream as a plain io.Reader (so
// io.Copy in WriteTo does not come back to WriteTo).
type tcpReader struct{ t *tcpConn }

func (r tcpReader) Read(b []byte) (int, error) { return r.t.read(b) }

func (t *tcpConn) read(b []byte) (int, error) {
	n, err := t.readStream(b)
	if err != nil && err != io.EOF {
		err = t.opError("read", err)
	}
	return n, err
}

func (t *tcpConn) readStream(b []byte) (int, error) {
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
func (t *tcpConn) endErr() error {
	<-t.readerDone
	switch {
	case deadline.IsClosed(t.closing):
		return net.ErrClosed
	case t.rerr == nil || t.rerr == io.EOF:
		return io.EOF
	}
	return t.rerr
}

func (t *tcpConn) write(b []byte) (int, error) {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	if len(b) == 0 {
		t.wmu.RLock()
		err := t.writeErr()
		t.wmu.RUnlock()
		if err != nil {
			return 0, t.opError("write", err)
		}
		return 0, nil
	}
	written := 0
	for len(b) > 0 {
		k := min(len(b), t.peerChunk)
		c, err := t.pool.Get(k)
		if err != nil {
			return written, t.opError("write", err)
		}
		copy(c.Bytes(), b[:k])
		if err := t.queue(context.Background(), outFrame{typ: tcpframe.TypeStream, buf: c}); err != nil {
			c.Release()
			return written, t.opError("write", err)
		}
		written += k
		b = b[k:]
	}
	return written, nil
}

// closeWrite queues the end-of-stream mark after everything written,
// waiting at most Config.CloseTimeout for room in the send queue (as the
// RDMA CloseWrite waits for a credit); the writer shuts down TCP's writing
// side once the frames before it are written.
func (t *tcpConn) closeWrite() error {
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
		return t.opError("close", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.CloseTimeout)
	defer cancel()
	if err := t.queueFIN(ctx); err != nil {
		t.wmu.Lock()
		t.finSent = false // not sent: a later CloseWrite tries again
		t.wmu.Unlock()
		if errors.Is(err, context.DeadlineExceeded) {
			err = &errs.CloseTimeout{What: "the send queue stayed full, so the end-of-stream mark could not be queued"}
		}
		return t.opError("close", err)
	}
	return nil
}

func (t *tcpConn) close() error {
	t.closeOnce.Do(func() { t.closeErr = t.shutdown() })
	if t.closeErr != nil {
		return t.opError("close", t.closeErr)
	}
	return nil
}

func (t *tcpConn) shutdown() error {
	close(t.closing) // blocked callers leave; queue() sees it
	t.cancel()
	t.wmu.Lock() // ... and no producer is inside queue() after this
	t.closed = true
	t.wmu.Unlock()

	// The writer delivers what was queued before Close, within CloseTimeout.
	deadline := time.Now().Add(t.cfg.CloseTimeout)
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
	// What nobody received goes back to the pool.
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
	return err
}

// waitAcked waits until nothing this side sent awaits the peer's
// acknowledgement (its end of stream included), or the connection is gone,
// or deadline passes: then it returns a timeout. Where the system does not
// say (tcpSendSettled's known is false) it returns nil at once, and Close
// delivers to the socket, as a net.TCPConn's does.
func (t *tcpConn) waitAcked(deadline time.Time) error {
	wait := 50 * time.Microsecond
	for {
		settled, known := tcpSendSettled(t.nc)
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

func (t *tcpConn) checkOpen(op string) error {
	if deadline.IsClosed(t.closing) {
		return t.opError(op, net.ErrClosed)
	}
	return nil
}

func (t *tcpConn) setDeadline(op string, t0 time.Time, rd, wr bool) error {
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

// The message view, with the RDMA one's rules: a Buf given to Send is the
// connection's whatever the outcome; a received Buf is the receiver's
// until its Release.

func (t *tcpConn) alloc(n int) (buffer.Buf, error) {
	if err := t.checkOpen("alloc"); err != nil {
		return buffer.Buf{}, err
	}
	b, err := t.pool.Get(n)
	if err != nil {
		return buffer.Buf{}, t.opError("alloc", err)
	}
	return b, nil
}

func (t *tcpConn) send(ctx context.Context, b buffer.Buf, async bool, id uint64) error {
	if !b.Valid() {
		return t.opError("send", buffer.ErrReleased)
	}
	if b.Len() > t.peerMaxMsg {
		n := b.Len()
		b.Release()
		return t.opError("send", fmt.Errorf("%w: %d bytes, limit %d", ErrMessageTooLarge, n, t.peerMaxMsg))
	}
	if async {
		if t.asyncOut.Add(1)+int64(len(t.opDone)) > int64(cap(t.opDone)) {
			t.asyncOut.Add(-1)
			b.Release()
			return t.opError("send", ErrCompletionsFull)
		}
	}
	if err := t.queue(ctx, outFrame{typ: tcpframe.TypeMessage, buf: b, async: async, id: id}); err != nil {
		if async {
			t.asyncOut.Add(-1)
		}
		b.Release()
		return t.opError("send", err)
	}
	return nil
}

func (t *tcpConn) recv(ctx context.Context) (buffer.Buf, error) {
	if err := t.checkOpen("recv"); err != nil {
		return buffer.Buf{}, err
	}
	b, ok, err := tcpWait(t, ctx, t.msgs, "recv")
	if err != nil || ok {
		return b, err
	}
	if err := t.endErr(); err != io.EOF {
		return buffer.Buf{}, t.opError("recv", err)
	}
	return buffer.Buf{}, io.EOF
}

// recvCompletion is RecvCompletion over TCP: the next PostSend's end.
func (t *tcpConn) recvCompletion(ctx context.Context) (OpCompletion, error) {
	select {
	case oc := <-t.opDone: // ends queued before a Close are still returned
		return oc, nil
	default:
	}
	if err := t.checkOpen("recv completion"); err != nil {
		return OpCompletion{}, err
	}
	oc, _, err := tcpWait(t, ctx, t.opDone, "recv completion")
	return oc, err
}

// tcpWait takes the next value from ch (ok false: ch is closed), bounded by
// ctx, the read deadline and Close.
func tcpWait[T any](t *tcpConn, ctx context.Context, ch <-chan T, op string) (v T, ok bool, err error) {
	if t.rdDeadline.Expired() {
		return v, false, t.opError(op, os.ErrDeadlineExceeded)
	}
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	select {
	case v, ok = <-ch:
		return v, ok, nil
	case <-t.rdDeadline.Wait():
		return v, false, t.opError(op, os.ErrDeadlineExceeded)
	case <-t.closing:
		return v, false, t.opError(op, net.ErrClosed)
	case <-done:
		return v, false, t.opError(op, ctx.Err())
	}
}

// notRDMA is the error of the one-sided calls on a TCP-backed Conn.
func (t *tcpConn) notRDMA(op string) error { return t.opError(op, ErrNotRDMA) }

// stats is a TCP-backed connection's ConnStats: zero, as none of its
// counters (posts, work requests, polls) exists over TCP.
func (t *tcpConn) stats() ConnStats { return ConnStats{} }
