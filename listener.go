package rdma

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/wire"
)

// Listener accepts RDMA connections. It implements net.Listener.
//
// Each incoming connection's handshake runs on its own goroutine, bounded by
// Config.ConnectTimeout; established connections wait for Accept, up to
// Config.Backlog of them. Beyond that, dialers are refused: their dial fails
// with ErrHandshake, naming the full backlog.
type Listener struct {
	cfg     Config
	ch      *rdmacm.Channel
	id      *rdmacm.ID
	addr    *Addr
	acceptq chan *Conn

	mu       sync.Mutex
	closed   bool
	closing  chan struct{}
	pending  sync.WaitGroup // handshakes in progress
	loopDone chan struct{}
	closeErr error
	once     sync.Once
}

func listen(cfg *Config, ap netip.AddrPort) (_ *Listener, err error) {
	ch, id, err := newChannelID()
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			undo(nil, id, ch)
		}
	}()
	if err = id.BindAddr(ap); err != nil {
		return nil, classifyResolve(err)
	}
	if err = id.Listen(cfg.Backlog); err != nil {
		return nil, err
	}
	l := &Listener{
		cfg: *cfg, ch: ch, id: id,
		addr:     &Addr{id.LocalAddr()},
		acceptq:  make(chan *Conn, cfg.Backlog),
		closing:  make(chan struct{}),
		loopDone: make(chan struct{}),
	}
	go l.loop()
	return l, nil
}

// loop turns connection requests into handshakes, each in its own goroutine
// so one slow dialer does not hold up the others.
func (l *Listener) loop() {
	defer close(l.loopDone)
	for ev := range l.ch.Events() {
		if ev.Type != rdmacm.EventConnectRequest {
			continue
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			reject(ev.ID, wire.RejectShutdown, "listener is closing")
			continue
		}
		if len(l.acceptq) == cap(l.acceptq) {
			l.mu.Unlock()
			reject(ev.ID, wire.RejectOverloaded, fmt.Sprintf("accept backlog of %d is full", cap(l.acceptq)))
			continue
		}
		l.pending.Add(1)
		l.mu.Unlock()
		go l.handshake(ev)
	}
}

func (l *Listener) handshake(ev rdmacm.Event) {
	defer l.pending.Done()
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.ConnectTimeout)
	defer cancel()
	go func() {
		select {
		case <-l.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	c, err := acceptConn(ctx, &l.cfg, ev)
	if err != nil {
		return // the dialer got our reject or its own timeout
	}
	select {
	case l.acceptq <- c:
	case <-l.closing:
		c.Close()
	}
}

// Accept waits for and returns the next connection (a *Conn).
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.AcceptRDMA()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// AcceptRDMA is Accept returning the concrete type.
func (l *Listener) AcceptRDMA() (*Conn, error) {
	select {
	case c := <-l.acceptq:
		return c, nil
	case <-l.closing:
		// Connections that completed before Close are still handed out.
		select {
		case c := <-l.acceptq:
			if c != nil {
				return c, nil
			}
		default:
		}
		return nil, &net.OpError{Op: "accept", Net: "rdma", Addr: l.addr, Err: net.ErrClosed}
	}
}

// Close stops listening. Connections already accepted stay open; those
// established but not yet accepted are closed, and blocked Accept calls
// return net.ErrClosed.
func (l *Listener) Close() error {
	l.once.Do(func() {
		l.mu.Lock()
		l.closed = true
		close(l.closing)
		l.mu.Unlock()
		err := l.id.Destroy()
		l.pending.Wait()
		l.ch.Close()
		<-l.loopDone
		for {
			select {
			case c := <-l.acceptq:
				c.Close()
				continue
			default:
			}
			break
		}
		if err != nil {
			l.closeErr = &net.OpError{Op: "close", Net: "rdma", Addr: l.addr, Err: err}
		}
	})
	return l.closeErr
}

// Addr returns the listener's address; with port 0 requested, the port chosen.
func (l *Listener) Addr() net.Addr { return l.addr }
