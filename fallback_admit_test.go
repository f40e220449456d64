package rdma

// A fallback listener's Admit hook keeps, for TCP dialers, the promises it
// keeps for RDMA ones (ListenConfig.Admit): a hook that has not answered
// within HandshakeTimeout refuses its dialer with a reason, at most
// Backlog hooks run at once, and Close neither waits for a hook nor leaves
// its dialer without an answer.

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
)

// stuckAdmit is an Admit hook whose first stuck calls block until release
// is closed (and then admit); later calls admit at once. entered gets a
// token for each call that blocks.
type stuckAdmit struct {
	stuck   int32
	calls   atomic.Int32
	entered chan struct{}
	release chan struct{}
}

func newStuckAdmit(stuck int) *stuckAdmit {
	return &stuckAdmit{stuck: int32(stuck), entered: make(chan struct{}, stuck), release: make(chan struct{})}
}

func (s *stuckAdmit) admit(netip.AddrPort) error {
	if s.calls.Add(1) <= s.stuck {
		s.entered <- struct{}{}
		<-s.release
	}
	return nil
}

// fallbackDialTCP dials ln with a fallback dialer whose own bound (ctx) is
// long, so that what ends the dial is the listener's answer.
func fallbackDialTCP(ln *Listener) (*Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(10*time.Second))
	defer cancel()
	d := Dialer{Fallback: &Fallback{RDMATimeout: rdmatest.Scale(2 * time.Second)}}
	c, err := d.DialContext(ctx, "rdma", ln.Addr().String())
	if err != nil {
		return nil, err
	}
	return c.(*Conn), nil
}

// A hook that does not answer within HandshakeTimeout refuses its TCP
// dialer with the reason, at about HandshakeTimeout; another dialer is
// admitted and accepted meanwhile.
func TestFallbackAdmitTimeout(t *testing.T) {
	g0 := rdmatest.Goroutines()
	hook := newStuckAdmit(1)
	ht := rdmatest.Scale(300 * time.Millisecond)
	ln := fallbackListen(t, ListenConfig{Config: Config{HandshakeTimeout: ht}, Admit: hook.admit})
	defer ln.Close()
	defer close(hook.release)

	type res struct {
		err  error
		took time.Duration
	}
	stuck := make(chan res, 1)
	go func() {
		start := time.Now()
		c, err := fallbackDialTCP(ln)
		if c != nil {
			c.Close()
		}
		stuck <- res{err, time.Since(start)}
	}()
	<-hook.entered

	// The stuck hook holds up no other dialer.
	accepted := make(chan *Conn, 1)
	go func() {
		c, err := ln.AcceptRDMA()
		if err != nil {
			c = nil
		}
		accepted <- c
	}()
	c, err := fallbackDialTCP(ln)
	if err != nil {
		t.Fatalf("second dialer, while the first one's hook is stuck: %v", err)
	}
	c.Close()
	if s := <-accepted; s == nil {
		t.Fatal("second dialer not accepted")
	} else {
		s.Close()
	}

	r := <-stuck
	want := admitTimeoutReason(ht)
	if !errors.Is(r.err, ErrHandshake) || !strings.Contains(r.err.Error(), want) {
		t.Fatalf("dialer whose hook is stuck: %v, want ErrHandshake with %q", r.err, want)
	}
	if r.took > ht+rdmatest.Scale(2*time.Second) {
		t.Errorf("dialer whose hook is stuck refused after %v, HandshakeTimeout %v", r.took, ht)
	}
	ln.Close()
	hook.release <- struct{}{} // the hook's late answer comes to nothing
	checkFallbackClean(t, g0)
}

// At most Backlog hooks run at once: with Backlog hooks stuck (their
// dialers refused at HandshakeTimeout), a further dialer is refused at
// once, naming the hooks.
func TestFallbackAdmitBacklog(t *testing.T) {
	g0 := rdmatest.Goroutines()
	const backlog = 2
	hook := newStuckAdmit(backlog)
	ht := rdmatest.Scale(300 * time.Millisecond)
	ln := fallbackListen(t, ListenConfig{Config: Config{HandshakeTimeout: ht, Backlog: backlog}, Admit: hook.admit})
	defer ln.Close()
	released := false
	defer func() {
		if !released {
			close(hook.release)
		}
	}()

	errs := make(chan error, backlog)
	for range backlog {
		go func() {
			c, err := fallbackDialTCP(ln)
			if c != nil {
				c.Close()
			}
			errs <- err
		}()
	}
	for range backlog {
		<-hook.entered
	}
	for range backlog {
		if err := <-errs; !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), admitTimeoutReason(ht)) {
			t.Fatalf("dialer whose hook is stuck: %v, want ErrHandshake with %q", err, admitTimeoutReason(ht))
		}
	}
	// Both hooks still run: the next dialer is refused at once.
	start := time.Now()
	_, err := fallbackDialTCP(ln)
	want := admitBusyReason(backlog)
	if !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), want) {
		t.Fatalf("dialer beyond Backlog running hooks: %v, want ErrHandshake with %q", err, want)
	}
	if took := time.Since(start); took >= ht {
		t.Errorf("dialer beyond Backlog running hooks refused after %v, want at once (HandshakeTimeout %v)", took, ht)
	}
	ln.Close()
	close(hook.release)
	released = true
	checkFallbackClean(t, g0)
}

// Close returns at once though a hook never returns, and refuses the
// dialer waiting for it; the hook's goroutine, once it returns, leaves
// nothing behind.
func TestFallbackAdmitClose(t *testing.T) {
	g0 := rdmatest.Goroutines()
	hook := newStuckAdmit(1)
	ln := fallbackListen(t, ListenConfig{Config: Config{HandshakeTimeout: rdmatest.Scale(time.Minute)}, Admit: hook.admit})
	defer ln.Close()
	errc := make(chan error, 1)
	go func() {
		c, err := fallbackDialTCP(ln)
		if c != nil {
			c.Close()
		}
		errc <- err
	}()
	<-hook.entered
	closed := make(chan error, 1)
	start := time.Now()
	go func() { closed <- ln.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(rdmatest.Scale(2 * time.Second)):
		close(hook.release)
		<-closed
		t.Fatalf("Close waited %v for an Admit hook that does not return", time.Since(start))
	}
	if err := <-errc; !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), "listener is closing") {
		t.Fatalf("dialer whose hook is stuck at Close: %v, want ErrHandshake: listener is closing", err)
	}
	close(hook.release)
	checkFallbackClean(t, g0)
}
