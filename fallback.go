package rdma

// TCP fallback, opt-in, in the spirit of SMC-R (RFC 7609): a service that
// must also serve, or reach, hosts without RDMA sets Fallback on its
// ListenConfig and Dialer. The listener then accepts TCP on the same port
// beside rdma_cm (the two port spaces are separate: an rdma_cm listen on
// port P and a TCP listen on port P do not collide, and a connect request
// arrives through one or the other, so nothing has to tell them apart),
// and the dialer tries RDMA first, for a bounded time, before it dials
// TCP. A connection that fell back is a *Conn like any other: its
// addresses' Network() is "tcp" instead of "rdma", and so is its
// Transport(); the stream works as on TCP, the message view over frames
// (internal/tcpframe: with copies, so code written for it runs
// unchanged), and the one-sided calls fail with ErrNotRDMA. Both ends must
// be this library: the TCP side starts with a hello, so a fallback dialer
// does not talk to a plain TCP server, nor a plain TCP client to a
// fallback listener.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/deadline"
	"github.com/verbline/rdma/internal/tcpconn"
	"github.com/verbline/rdma/internal/tcpframe"
)

// ErrNotRDMA: the call needs RDMA (one-sided access: Export, WriteRemote,
// ReadRemote, RecvNotification, QPInfo...) and the connection fell back to
// TCP (see Fallback). Test Conn.LocalAddr().Network() == "rdma" first, or
// move the data with Send instead.
var ErrNotRDMA = errors.New("the connection fell back to TCP: one-sided RDMA calls need an RDMA connection " +
	"(LocalAddr().Network() is \"tcp\"; send the data as messages, or fix the RDMA path: the dial's " +
	"fallback reason says what failed)")

// Fallback enables TCP fallback on a Dialer or a ListenConfig. The zero
// value is ready to use.
//
// A ListenConfig with Fallback listens on rdma_cm and on TCP, on the same
// port (port 0: one free in both), and its Accept returns connections of
// both kinds. On a host or address without RDMA (ErrNoDevice,
// ErrNotRDMAAddress; every build without cgo) it listens on TCP alone: its
// Addr().Network() says which ("rdma" when rdma_cm listens too, "tcp"
// otherwise). Admit, Backlog and HandshakeTimeout apply to TCP dialers too,
// with the same promises: Admit runs on a goroutine of its own once the
// dialer's hello has arrived, at most Backlog hooks run at once, a hook
// that has not answered within HandshakeTimeout has its dialer refused
// then, and Close refuses the dialers whose hook has not answered without
// waiting for it.
// AcceptRDMA returns the TCP-backed connections too (as *Conn).
// ListenPacket ignores Fallback (datagrams have no TCP counterpart).
//
// A Dialer with Fallback tries RDMA for at most RDMATimeout and dials TCP
// when the RDMA attempt failed because RDMA cannot reach the address: no
// RDMA device here (ErrNoDevice), an address no RDMA netdev serves
// (ErrNotRDMAAddress), nobody listening on rdma_cm (ECONNREFUSED: the peer
// listens on TCP alone), a peer unreachable over RDMA (EHOSTUNREACH,
// ENETUNREACH, ETIMEDOUT), or RDMATimeout passing. A listener that answered
// and refused (ErrHandshake), a local problem to fix (ErrMemlock, a
// ConfigError) and the caller's own context ending are returned as they
// are. If TCP fails too, the error (a *net.OpError) says what happened on
// both attempts and matches both causes with errors.Is. The whole dial,
// both attempts, stays within Dialer.Timeout (Config.ConnectTimeout).
//
// What a TCP peer can make this side hold: a TCP-backed connection's
// received messages and stream data that the application has not taken
// (Recv, Messages(), Read) hold at most Config.RecvBuffers x
// Config.BufferSize bytes of buffers (2 MiB with the defaults) before the
// connection stops reading its socket, which stops the peer (TCP's flow
// control: nothing is lost); a message larger than that is still received
// whole, so a connection holds at most that budget plus one message's
// buffer (at most 4 MiB, the pool's largest). The TCP-backed connections of a process share one
// buffer pool, which the first fallback user's Config.PoolMaxBytes (1 GiB
// by default) caps: a fallback listener's at Listen, or a fallback
// dialer's at its first TCP connection. Later Configs do not change it.
// At the cap, readers wait (their peers are stopped) and Alloc and Write
// fail with buffer.ErrExhausted; Admit bounds how many peers get there.
type Fallback struct {
	// RDMATimeout bounds a Dialer's RDMA attempt before it falls back to
	// TCP. A peer whose host has no RDMA device never answers rdma_cm's
	// connect request, so this is what such a dial costs before TCP.
	// 0 or less means 1 s. A ListenConfig ignores it.
	RDMATimeout time.Duration
}

func (f *Fallback) rdmaTimeout() time.Duration {
	if f.RDMATimeout > 0 {
		return f.RDMATimeout
	}
	return time.Second
}

// tcpNetwork is the TCP network for an RDMA one.
func tcpNetwork(network string) string {
	switch network {
	case "rdma4":
		return "tcp4"
	case "rdma6":
		return "tcp6"
	}
	return "tcp"
}

// fallbackError is a fallback dial's error when TCP failed too.
type fallbackError struct {
	rdma, tcp error
}

func (e *fallbackError) Error() string {
	return "RDMA failed (" + e.rdma.Error() + "), then TCP failed: " + e.tcp.Error()
}

func (e *fallbackError) Unwrap() []error { return []error{e.rdma, e.tcp} }

// Timeout reports whether the last attempt (TCP) timed out.
func (e *fallbackError) Timeout() bool {
	var ne net.Error
	return errors.As(e.tcp, &ne) && ne.Timeout()
}

// fallbackReason reports whether an RDMA dial error means that RDMA cannot
// reach the address (so TCP is worth trying).
func fallbackReason(err error) bool {
	for _, target := range []error{ErrNoDevice, ErrNotRDMAAddress, syscall.ECONNREFUSED, syscall.EHOSTUNREACH,
		syscall.ENETUNREACH, syscall.ETIMEDOUT, syscall.ENODEV, syscall.EADDRNOTAVAIL, os.ErrDeadlineExceeded} {
		if errors.Is(err, target) {
			return !errors.Is(err, ErrHandshake) && !errors.Is(err, ErrMemlock)
		}
	}
	return false
}

// dialFallback is Dialer.dial with d.Fallback set: RDMA first, within
// Fallback.RDMATimeout, then TCP to the same address if RDMA cannot reach it.
func (d *Dialer) dialFallback(ctx context.Context, network string, tg dialTarget) (*Conn, error) {
	cfg, raddr, target := tg.cfg, tg.raddr, tg.raddr.String()
	rctx, rcancel := context.WithTimeout(ctx, d.Fallback.rdmaTimeout())
	c, rerr := dialRDMA(rctx, network, tg)
	rcancel()
	if rerr == nil {
		return c, nil
	}
	if ctx.Err() != nil || !fallbackReason(rerr) {
		return nil, rerr
	}
	var oe *net.OpError
	if errors.As(rerr, &oe) {
		rerr = oe.Err // the dial's own *net.OpError wraps the whole
	}
	if errors.Is(rerr, os.ErrDeadlineExceeded) && !errors.Is(rerr, syscall.ETIMEDOUT) {
		rerr = fmt.Errorf("no answer within Fallback.RDMATimeout %v: %w", d.Fallback.rdmaTimeout(), rerr)
	}
	taddr := net.TCPAddrFromAddrPort(raddr)
	nd := net.Dialer{KeepAlive: -1} // the connection sets keepalive from Config (tcpOptions)
	if d.LocalAddr != nil {
		nd.LocalAddr = &net.TCPAddr{IP: d.LocalAddr.AddrPort.Addr().AsSlice(), Zone: d.LocalAddr.AddrPort.Addr().Zone()}
	}
	nc, terr := nd.DialContext(ctx, tcpNetwork(network), target)
	var t *tcpconn.Conn[OpCompletion, Notification]
	if terr == nil {
		t, terr = tcpHandshakeDial(ctx, nc.(*net.TCPConn), &cfg)
		if terr != nil {
			nc.Close()
		}
	}
	if terr != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Addr: taddr, Err: &fallbackError{rdma: rerr, tcp: tcpDialErr(terr)}}
	}
	t.SetFallbackReason(rerr)
	return &Conn{tcp: t}, nil
}

// tcpDialErr is the TCP attempt's error as the fallback error carries it:
// without its *net.OpError, and a timeout as this package reports every
// deadline (matching os.ErrDeadlineExceeded). net reports a dial that hit
// its context's deadline either way: os.ErrDeadlineExceeded when the
// socket's write deadline fires first, an error matching
// context.DeadlineExceeded when the context's end is seen first.
func tcpDialErr(err error) error {
	err = tcpconn.SockErr(err)
	if errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, os.ErrDeadlineExceeded) {
		return os.ErrDeadlineExceeded
	}
	return err
}

// fallbackListener is a *Listener with ListenConfig.Fallback: rdma_cm (if
// it could listen) and TCP on one port, accepted through one queue.
type fallbackListener struct {
	rdma    *Listener // nil: TCP alone
	noRDMA  error     // why rdma is nil
	tcp     *net.TCPListener
	cfg     Config
	admit   func(netip.AddrPort) error
	addr    net.Addr
	acceptq chan *Conn

	closing  chan struct{}
	once     sync.Once
	closeErr error
	wg       sync.WaitGroup // the accept loops and the TCP handshakes, not the Admit hooks
	mu       sync.Mutex
	halfOpen int // TCP handshakes in progress
	// hooks counts the Admit hooks running, answered or not (a hook that
	// never returns keeps its place): at most Backlog.
	hooks   int
	tcpErr  error // the TCP accept loop's end, if not Close
	tcpDone chan struct{}

	stats listenStats // the TCP side's outcomes; the RDMA listener keeps its own
}

// listenFallback is ListenConfig.Listen with lc.Fallback set.
func (lc *ListenConfig) listenFallback(ctx context.Context, network, address string) (*Listener, error) {
	cfg := lc.Config.withDefaults()
	ap, err := lc.listenAddr(ctx, network, address)
	if err != nil {
		return nil, err
	}
	// The listener is a fallback user from now: the first one's
	// PoolMaxBytes caps the process's fallback pool (tcpPool).
	if _, err := fallbackPoolFor(cfg.PoolMaxBytes); err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Addr: dialAddr(address), Err: err}
	}
	rlc := *lc
	rlc.Fallback = nil
	// Port 0: the port rdma_cm picks must be free for TCP too; another
	// program may hold it there, so try a few.
	tries := 1
	if ap.Port() == 0 {
		tries = 16
	}
	var lastErr error
	for range tries {
		var rl *Listener
		var rerr error
		if ap.Addr().IsLoopback() {
			// No RDMA device serves loopback (a dial there fails with
			// ErrNotRDMAAddress), and an iWARP device would hold the port
			// for TCP: TCP alone.
			rerr = fmt.Errorf("%w: %s is a loopback address, which no RDMA device serves", ErrNotRDMAAddress, ap.Addr())
		} else {
			rl, rerr = rlc.Listen(ctx, network, ap.String())
		}
		var noRDMA error
		port := ap.Port()
		if rerr != nil {
			if !errors.Is(rerr, ErrNoDevice) && !errors.Is(rerr, ErrNotRDMAAddress) {
				return nil, rerr
			}
			var oe *net.OpError
			if noRDMA = rerr; errors.As(rerr, &oe) {
				noRDMA = oe.Err
			}
		} else {
			port = rl.Addr().(*Addr).AddrPort.Port()
		}
		taddr := net.TCPAddrFromAddrPort(netip.AddrPortFrom(ap.Addr(), port))
		var lcfg net.ListenConfig
		tl, terr := lcfg.Listen(ctx, tcpNetwork(network), taddr.String())
		if terr != nil {
			if rl != nil {
				rl.Close()
			}
			if iw := iwarpDevices(); rl != nil && errors.Is(terr, syscall.EADDRINUSE) && len(iw) > 0 {
				// iw_cm took the port for TCP itself: any port would do the same.
				return nil, &net.OpError{Op: "listen", Net: network, Addr: taddr, Err: fmt.Errorf("%w: the TCP fallback "+
					"cannot listen on port %d: iWARP device %s serves it, and iWARP connections are TCP connections on "+
					"rdma_cm's port, so iw_cm listens there itself (listen without Fallback for iWARP clients, and for "+
					"TCP clients on another port; docs/fallback.md)", errors.ErrUnsupported, port, strings.Join(iw, ", "))}
			}
			lastErr = terr
			if ap.Port() == 0 && rl != nil && errors.Is(terr, syscall.EADDRINUSE) {
				continue
			}
			return nil, &net.OpError{Op: "listen", Net: network, Addr: taddr, Err: tcpconn.SockErr(terr)}
		}
		return lc.newFallbackListener(&cfg, rl, noRDMA, tl.(*net.TCPListener)), nil
	}
	return nil, &net.OpError{Op: "listen", Net: network, Addr: dialAddr(address),
		Err: fmt.Errorf("no port free for both rdma_cm and TCP after %d tries: %w", tries, tcpconn.SockErr(lastErr))}
}

func (lc *ListenConfig) newFallbackListener(cfg *Config, rl *Listener, noRDMA error, tl *net.TCPListener) *Listener {
	f := &fallbackListener{
		rdma: rl, noRDMA: noRDMA, tcp: tl, cfg: *cfg, admit: lc.Admit,
		acceptq: make(chan *Conn, cfg.Backlog),
		closing: make(chan struct{}),
		tcpDone: make(chan struct{}),
	}
	f.addr = tl.Addr()
	if rl != nil {
		f.addr = rl.Addr()
		f.wg.Add(1)
		go f.rdmaLoop()
	}
	f.wg.Add(1)
	go f.tcpLoop()
	return &Listener{fb: f}
}

// rdmaLoop moves the RDMA listener's connections into the shared queue.
// If the RDMA listener fails (its device went away), TCP goes on.
func (f *fallbackListener) rdmaLoop() {
	defer f.wg.Done()
	for {
		c, err := f.rdma.AcceptRDMA()
		if err != nil {
			return
		}
		select {
		case f.acceptq <- c:
		case <-f.closing:
			c.Close()
			return
		}
	}
}

// tcpLoop accepts TCP connections and runs each one's hello on its own
// goroutine, bounded by HandshakeTimeout and, with those queued, by Backlog.
func (f *fallbackListener) tcpLoop() {
	defer f.wg.Done()
	defer close(f.tcpDone)
	var backoff time.Duration
	for {
		nc, err := f.tcp.AcceptTCP()
		if err != nil {
			if deadline.IsClosed(f.closing) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
				errors.Is(err, syscall.ECONNABORTED) {
				// As net/http's Serve: wait and try again.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(backoff):
					continue
				case <-f.closing:
					return
				}
			}
			f.mu.Lock()
			f.tcpErr = tcpconn.SockErr(err)
			f.mu.Unlock()
			return
		}
		backoff = 0
		f.mu.Lock()
		full := f.halfOpen+len(f.acceptq) >= cap(f.acceptq)
		if !full {
			f.halfOpen++
		}
		f.mu.Unlock()
		if full {
			f.stats.refused.Add(1)
			tcpframe.WriteReject(nc, fmt.Sprintf("accept backlog of %d is full", cap(f.acceptq)))
			nc.Close()
			continue
		}
		f.wg.Add(1)
		go f.handshake(nc)
	}
}

func (f *fallbackListener) handshake(nc *net.TCPConn) {
	defer f.wg.Done()
	done := make(chan struct{})
	cut := make(chan struct{}) // closed once Close has cut nc's I/O short
	// Close interrupts a handshake in progress.
	go func() {
		select {
		case <-f.closing:
			nc.SetDeadline(time.Now())
			close(cut)
		case <-done:
		}
	}()
	var admit func(*net.TCPConn) error
	refused := false // Admit refused, or did not answer in time
	if f.admit != nil {
		admit = func(nc *net.TCPConn) error {
			err := f.runAdmit(nc, cut)
			refused = err != nil
			return err
		}
	}
	t, err := tcpHandshakeAccept(nc, &f.cfg, admit)
	close(done)
	f.mu.Lock()
	f.halfOpen--
	f.mu.Unlock()
	if err != nil {
		switch {
		case refused:
			f.stats.refused.Add(1)
		case !deadline.IsClosed(cut): // not cut short by Close
			f.stats.failure(fmt.Errorf("handshake with %v: %w", nc.RemoteAddr(), err))
		}
		nc.Close()
		return
	}
	c := &Conn{tcp: t}
	f.stats.accepted.Add(1) // before it is queued: Accept may return it at once
	select {
	case f.acceptq <- c:
	case <-f.closing:
		c.Close()
	}
}

// tcpAnswerWrite bounds the write of a TCP handshake's answer (a hello or
// a reject, a few hundred bytes at most) after the wait for Admit: the
// handshake's own deadline may have passed while the hook ran.
const tcpAnswerWrite = time.Second

// runAdmit asks the Admit hook about nc's dialer and returns its answer,
// the error being the reason tcpHandshakeAccept sends the dialer. The hook
// runs on a goroutine of its own, which the handshake waits for at most
// HandshakeTimeout, and not past Close (cut closed): then the dialer is
// refused, and the hook's later answer is dropped. At most Backlog hooks
// run at once: beyond them, the dialer is refused at once.
func (f *fallbackListener) runAdmit(nc *net.TCPConn, cut <-chan struct{}) error {
	refuse := func(reason string) error {
		nc.SetWriteDeadline(time.Now().Add(tcpAnswerWrite))
		return errors.New(reason)
	}
	if deadline.IsClosed(f.closing) {
		<-cut
		return refuse("listener is closing")
	}
	peer := nc.RemoteAddr().(*net.TCPAddr).AddrPort()
	f.mu.Lock()
	if f.hooks >= cap(f.acceptq) {
		n := f.hooks
		f.mu.Unlock()
		return errors.New(admitBusyReason(n))
	}
	f.hooks++
	f.mu.Unlock()
	answer := make(chan error, 1) // the hook's goroutine never waits for the handshake
	go func() {
		err := f.admit(peer)
		f.mu.Lock()
		f.hooks--
		f.mu.Unlock()
		answer <- err
	}()
	timer := time.NewTimer(f.cfg.HandshakeTimeout)
	defer timer.Stop()
	select {
	case err := <-answer:
		nc.SetWriteDeadline(time.Now().Add(tcpAnswerWrite))
		return err
	case <-timer.C:
		return refuse(admitTimeoutReason(f.cfg.HandshakeTimeout))
	case <-cut:
		return refuse("listener is closing")
	}
}

// acceptConn is accept for net.Listener's Accept (a nil *Conn must not
// become a non-nil net.Conn).
func (f *fallbackListener) acceptConn() (net.Conn, error) {
	c, err := f.accept()
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (f *fallbackListener) accept() (*Conn, error) {
	select {
	case c := <-f.acceptq:
		return c, nil
	case <-f.closing:
		return nil, &net.OpError{Op: "accept", Net: f.addr.Network(), Addr: f.addr, Err: net.ErrClosed}
	case <-f.tcpDone:
		select {
		case c := <-f.acceptq:
			return c, nil
		case <-f.closing:
			return nil, &net.OpError{Op: "accept", Net: f.addr.Network(), Addr: f.addr, Err: net.ErrClosed}
		default:
		}
		f.mu.Lock()
		err := f.tcpErr
		f.mu.Unlock()
		return nil, &net.OpError{Op: "accept", Net: f.addr.Network(), Addr: f.addr, Err: err}
	}
}

func (f *fallbackListener) close() error {
	f.once.Do(func() {
		close(f.closing)
		terr := f.tcp.Close()
		var rerr error
		if f.rdma != nil {
			rerr = f.rdma.Close()
		}
		f.wg.Wait()
		for {
			select {
			case c := <-f.acceptq:
				c.Close()
				continue
			default:
			}
			break
		}
		if rerr != nil {
			f.closeErr = rerr
		} else if terr != nil {
			f.closeErr = &net.OpError{Op: "close", Net: "tcp", Addr: f.tcp.Addr(), Err: tcpconn.SockErr(terr)}
		}
	})
	return f.closeErr
}

// TCPOnlyReason returns why a listener made with ListenConfig.Fallback
// listens on TCP alone (rdma_cm could not listen there: ErrNoDevice,
// ErrNotRDMAAddress, which a loopback address always is), or nil: it
// listens on rdma_cm too, or it is not a fallback listener.
func (l *Listener) TCPOnlyReason() error {
	if l.fb == nil {
		return nil
	}
	return l.fb.noRDMA
}

// admitTimeoutReason is the reason a dialer reads when the listener's
// Admit hook has not answered within HandshakeTimeout d.
func admitTimeoutReason(d time.Duration) string {
	return fmt.Sprintf("the listener's admission hook (ListenConfig.Admit) did not answer within its HandshakeTimeout of %v", d)
}

// admitBusyReason is the reason a dialer reads when n hooks (the
// listener's Backlog) have not returned.
func admitBusyReason(n int) string {
	return fmt.Sprintf("the listener's admission hook (ListenConfig.Admit) has not returned for %d earlier dialers "+
		"(its Backlog): try again later", n)
}

// What a TCP-backed Conn's connection (internal/tcpconn) takes from this
// package, which it cannot import: its options from the Config, the
// process's fallback pool, and this package's completion and notification
// types.

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

// tcpOptions is what a TCP-backed connection takes from cfg (defaults
// applied), with its buffers from pool.
func tcpOptions(cfg *Config, pool *buffer.Pool) *tcpconn.Options {
	return &tcpconn.Options{
		RecvBuffers: cfg.RecvBuffers, SendBuffers: cfg.SendBuffers, BufferSize: cfg.BufferSize,
		MaxMessageSize:   cfg.MaxMessageSize,
		KeepAlive:        cfg.KeepAlive,
		HandshakeTimeout: cfg.HandshakeTimeout,
		CloseTimeout:     cfg.CloseTimeout,
		Pool:             pool,
	}
}

// tcpCompletion is a PostSend's end over TCP, as Completions() delivers it.
func tcpCompletion(id uint64, err error) OpCompletion { return OpCompletion{ID: id, Err: err} }

// tcpHandshakeDial runs the dialer's half of the hello exchange on nc,
// bounded by ctx.
func tcpHandshakeDial(ctx context.Context, nc *net.TCPConn, cfg *Config) (*tcpconn.Conn[OpCompletion, Notification], error) {
	pool, err := fallbackPoolFor(cfg.PoolMaxBytes)
	if err != nil {
		return nil, err
	}
	return tcpconn.Dial[OpCompletion, Notification](ctx, nc, tcpOptions(cfg, pool), tcpCompletion)
}

// tcpHandshakeAccept runs the listener's half on nc: read the dialer's
// hello, ask admit, answer (or refuse) within cfg.HandshakeTimeout.
func tcpHandshakeAccept(nc *net.TCPConn, cfg *Config, admit func(*net.TCPConn) error) (*tcpconn.Conn[OpCompletion, Notification], error) {
	pool, err := fallbackPoolFor(cfg.PoolMaxBytes)
	if err != nil {
		return nil, err
	}
	return tcpconn.Accept[OpCompletion, Notification](nc, tcpOptions(cfg, pool), tcpCompletion, admit)
}
