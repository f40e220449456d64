//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/verbline/rdma/internal/cmsetup"
	"github.com/verbline/rdma/internal/errs"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/wire"
)

// acceptor is the RDMA side of a Listener: the listening rdma_cm id, its
// event loop, the handshakes in progress and the queue of established
// connections.
//
// Each incoming connection's handshake runs on its own goroutine, bounded by
// Config.HandshakeTimeout; established connections wait for Accept, up to
// Config.Backlog of them. Handshakes in progress count against the same
// Backlog: a connect request beyond it drops the oldest one. With Accept's
// queue full, dialers are refused: their dial fails with ErrHandshake,
// naming the full backlog. ListenConfig.Admit, if set, decides on each
// connect request first, on a goroutine of its own: at most Backlog hooks
// run at once, and each answers within HandshakeTimeout or its dialer is
// refused.
type acceptor struct {
	cfg     Config
	ch      *rdmacm.Channel
	id      *rdmacm.ID
	addr    *Addr
	acceptq chan *Conn
	admit   func(netip.AddrPort) error

	mu     sync.Mutex
	closed bool
	// halfOpen are the handshakes in progress, oldest first: they count
	// against the backlog, and the oldest is dropped when it is full.
	halfOpen []*handshakeRun
	// admitting are the connect requests whose Admit hook has not
	// answered; hooks counts the hooks running, answered or not (a hook
	// that never returns keeps its place): at most Backlog.
	admitting map[*admitRun]struct{}
	hooks     int
	closing   chan struct{}
	// stop is cancelled with closing: the parent of every handshake's
	// context, so Close ends them without a goroutine per handshake
	// watching closing.
	stop     context.Context
	stopNow  context.CancelFunc
	pending  sync.WaitGroup // handshakes in progress
	loopDone chan struct{}
	closeErr error
	once     sync.Once
	// failed is closed when the listener can accept no more (its device
	// went away, its event channel failed); failErr says why.
	failed   chan struct{}
	failErr  error
	failOnce sync.Once

	stats listenStats // what became of the connect requests (Listener.Stats)
}

// handshakeRun is one handshake in progress.
type handshakeRun struct {
	cancel context.CancelFunc
}

// admitRun is one connect request waiting for ListenConfig.Admit. Whoever
// takes it off Listener.admitting first answers its request: the hook's
// goroutine, its timer (HandshakeTimeout) or Close.
type admitRun struct {
	ev    rdmacm.Event
	peer  netip.AddrPort
	timer *time.Timer
}

func listen(cfg *Config, ap netip.AddrPort, admit func(netip.AddrPort) error) (_ *Listener, err error) {
	ch, id, err := cmsetup.NewChannelID()
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			undo(nil, id, ch)
		}
	}()
	if err = id.BindAddr(ap); err != nil {
		return nil, cmsetup.ClassifyResolve(err, netip.Addr{})
	}
	if err = id.Listen(cfg.Backlog); err != nil {
		return nil, err
	}
	ln := &Listener{acceptor: acceptor{
		cfg: *cfg, ch: ch, id: id,
		addr:      &Addr{id.LocalAddr()},
		acceptq:   make(chan *Conn, cfg.Backlog),
		admit:     admit,
		admitting: make(map[*admitRun]struct{}),
		closing:   make(chan struct{}),
		loopDone:  make(chan struct{}),
		failed:    make(chan struct{}),
	}}
	l := &ln.acceptor
	l.stop, l.stopNow = context.WithCancel(context.Background())
	if ctx, cerr := id.Context(); cerr == nil { // bound to one device's address (not a wildcard)
		if ferr := fatalDevice(ctx.Key()); ferr != nil {
			l.stopNow()
			return nil, ferr
		}
		registerListener(l, ctx.Key())
	}
	go l.loop()
	return ln, nil
}

// loop turns connection requests into handshakes, each in its own goroutine
// so one slow dialer does not hold up the others.
func (l *acceptor) loop() {
	defer close(l.loopDone)
	for {
		ev, err := l.ch.Next(context.Background())
		if err != nil {
			if !errors.Is(err, rdmacm.ErrChannelClosed) {
				l.fail(err) // not Close: reading connect requests failed
			}
			return
		}
		if ev.Type == rdmacm.EventDeviceRemoval {
			l.fail(&errs.DeviceFailed{Msg: fmt.Sprintf("the RDMA device under %v was removed (rdma link delete, driver unload or a fatal device error): listen again once it is back", l.addr)})
			continue
		}
		if ev.Type != rdmacm.EventConnectRequest {
			continue
		}
		cmsetup.TraceDelivery(ev, " (to the listener's loop)")
		if l.admit != nil {
			l.startAdmit(ev)
			continue
		}
		l.admitted(ev)
	}
}

// admitted starts the handshake of a connect request the listener takes
// (Admit, if set, let it in), or refuses it: the listener is closing, or
// Accept's queue is full.
func (l *acceptor) admitted(ev rdmacm.Event) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.refuse(ev.ID, wire.RejectShutdown, "listener is closing")
		return
	}
	if len(l.acceptq) >= cap(l.acceptq) {
		l.mu.Unlock()
		l.refuse(ev.ID, wire.RejectOverloaded, fmt.Sprintf("accept backlog of %d is full", cap(l.acceptq)))
		return
	}
	if len(l.acceptq)+len(l.halfOpen) >= cap(l.acceptq) && len(l.halfOpen) > 0 {
		// Drop the oldest handshake in progress: its dialer has had the
		// longest to finish, and a flood of dialers that never finish
		// must not lock out one that does.
		l.halfOpen[0].cancel()
		l.halfOpen = l.halfOpen[1:]
		l.stats.dropped.Add(1)
	}
	ctx, cancel := context.WithTimeout(l.stop, l.cfg.HandshakeTimeout)
	run := &handshakeRun{cancel: cancel}
	l.halfOpen = append(l.halfOpen, run)
	l.pending.Add(1)
	l.mu.Unlock()
	go l.handshake(ctx, run, ev)
}

// startAdmit asks the Admit hook about a connect request on a goroutine of
// its own, so that a slow hook holds up no other dialer: the loop never
// waits for a hook. At most Backlog hooks run at once (a request beyond
// them is refused at once), and a request whose hook has not answered
// within HandshakeTimeout is refused then.
func (l *acceptor) startAdmit(ev rdmacm.Event) {
	r := &admitRun{ev: ev, peer: ev.ID.PeerAddr()}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.refuse(ev.ID, wire.RejectShutdown, "listener is closing")
		return
	}
	if l.hooks >= cap(l.acceptq) {
		n := l.hooks
		l.mu.Unlock()
		l.refuse(ev.ID, wire.RejectOverloaded, admitBusyReason(n))
		return
	}
	l.hooks++
	l.admitting[r] = struct{}{}
	r.timer = time.AfterFunc(l.cfg.HandshakeTimeout, func() { l.admitTimeout(r) })
	l.mu.Unlock()
	go l.runAdmit(r)
}

// takeAdmit takes r off the requests waiting for their hook and reports
// whether the caller now answers it (no one did yet). The answer counts
// as pending, so Close waits for it before it closes the channel the
// request's id lives on. Called with l.mu held.
func (l *acceptor) takeAdmit(r *admitRun) bool {
	if _, ok := l.admitting[r]; !ok {
		return false
	}
	delete(l.admitting, r)
	l.pending.Add(1)
	return true
}

// runAdmit calls the Admit hook for r and answers r's request with the
// hook's decision, unless its timer or Close answered it first.
func (l *acceptor) runAdmit(r *admitRun) {
	err := l.admit(r.peer)
	l.mu.Lock()
	l.hooks--
	mine := l.takeAdmit(r)
	l.mu.Unlock()
	if !mine {
		return
	}
	defer l.pending.Done()
	r.timer.Stop()
	if err != nil {
		l.refuse(r.ev.ID, wire.RejectPolicy, err.Error())
		return
	}
	l.admitted(r.ev)
}

// admitTimeout refuses r's request when its hook has not answered within
// HandshakeTimeout.
func (l *acceptor) admitTimeout(r *admitRun) {
	l.mu.Lock()
	mine := l.takeAdmit(r)
	l.mu.Unlock()
	if !mine {
		return
	}
	defer l.pending.Done()
	l.refuse(r.ev.ID, wire.RejectOverloaded, admitTimeoutReason(l.cfg.HandshakeTimeout))
}

// refuse answers a connect request with a refusal before any handshake
// began, and counts it (ListenerStats.Refused).
func (l *acceptor) refuse(id *rdmacm.ID, code wire.RejectCode, reason string) {
	l.stats.refused.Add(1)
	cmsetup.Reject(id, code, reason)
}

// fail makes Accept return err from now on (connections already queued
// are still handed out first). The first error wins.
func (l *acceptor) fail(err error) {
	l.failOnce.Do(func() {
		l.failErr = err
		close(l.failed)
	})
}

// finished takes run off the handshakes in progress (if it is still there)
// and, if it produced a connection, queues it for Accept when there is
// room, reporting whether it did.
func (l *acceptor) finished(run *handshakeRun, c *Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, r := range l.halfOpen {
		if r == run {
			l.halfOpen = append(l.halfOpen[:i:i], l.halfOpen[i+1:]...)
			break
		}
	}
	if c == nil {
		return false
	}
	select {
	case l.acceptq <- c:
		return true
	default:
		return false
	}
}

func (l *acceptor) handshake(ctx context.Context, run *handshakeRun, ev rdmacm.Event) {
	defer l.pending.Done()
	defer run.cancel()
	cmsetup.TraceDelivery(ev, " (through the listener's loop)")
	peer := ev.ID.PeerAddr() // read now: a failed handshake destroys the id
	c, err := acceptConn(ctx, &l.cfg, ev)
	if err == nil {
		l.stats.accepted.Add(1) // before it is queued: Accept may return it at once
	}
	// Off the half-open list and into Accept's queue in one step under
	// l.mu, as the loop counts both: the queue has room (the loop keeps
	// queued + half-open within its capacity).
	queued := l.finished(run, c)
	if err != nil {
		// The dialer got our reject or its own timeout. A handshake
		// cancelled was dropped for a newer one (counted then) or cut
		// by Close.
		if !errors.Is(ctx.Err(), context.Canceled) {
			l.stats.failure(fmt.Errorf("handshake with %v: %w", peer, err))
		}
		return
	}
	if queued {
		return
	}
	select {
	case l.acceptq <- c:
	case <-l.closing:
		c.Close()
	}
}

// accept is Listener.AcceptRDMA on the RDMA side.
func (l *acceptor) accept() (*Conn, error) {
	select {
	case c := <-l.acceptq:
		return c, nil
	case <-l.failed:
		select {
		case c := <-l.acceptq:
			return c, nil
		default:
		}
		return nil, &net.OpError{Op: "accept", Net: "rdma", Addr: l.addr, Err: l.failErr}
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

// close is Listener.Close on the RDMA side.
func (l *acceptor) close() error {
	l.once.Do(func() {
		l.mu.Lock()
		l.closed = true
		close(l.closing)
		l.stopNow() // ends the handshakes in progress
		waiting := l.admitting
		l.admitting = map[*admitRun]struct{}{}
		l.mu.Unlock()
		// Requests still waiting for their Admit hook are refused now: the
		// hooks' answers come to nothing, and Close does not wait for them.
		for r := range waiting {
			r.timer.Stop()
			l.refuse(r.ev.ID, wire.RejectShutdown, "listener is closing")
		}
		unregisterListener(l)
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

func (l *acceptor) localAddr() net.Addr { return l.addr }
