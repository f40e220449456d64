package rdma

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
)

// backgroundAccept accepts from a listener in the background until it closes and
// keeps what it accepted, for tests whose peers dial many connections.
type backgroundAccept struct {
	ln       *Listener
	mu       sync.Mutex
	accepted []*Conn
	done     chan struct{}
}

// acceptAll starts accepting from ln.
func acceptAll(ln *Listener) *backgroundAccept {
	a := &backgroundAccept{ln: ln, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		for {
			c, err := ln.AcceptRDMA()
			if err != nil {
				return
			}
			a.mu.Lock()
			a.accepted = append(a.accepted, c)
			a.mu.Unlock()
		}
	}()
	return a
}

// conns returns the connections accepted so far.
func (a *backgroundAccept) conns() []*Conn {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*Conn(nil), a.accepted...)
}

// peerOf waits until the connection whose remote address is c's local
// address has been accepted and returns it; nil if ctx ends first.
func (a *backgroundAccept) peerOf(ctx context.Context, c *Conn) *Conn {
	for ctx.Err() == nil {
		for _, s := range a.conns() {
			if s.RemoteAddr().String() == c.LocalAddr().String() {
				return s
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// closeAll closes the listener, waits for the accepting goroutine and
// closes every accepted connection. Idempotent.
func (a *backgroundAccept) closeAll() {
	a.ln.Close()
	<-a.done
	a.mu.Lock()
	accepted := a.accepted
	a.accepted = nil
	a.mu.Unlock()
	for _, c := range accepted {
		c.Close()
	}
}

// wellBehavedEcho is the client every hostile-peer test keeps working: it
// dials ln through the TCP fallback, writes msg on the stream (the server
// side reads it), then sends a message of size bytes starting with msg and
// receives the server side's echo of it. It returns the client and the
// server side of its connection; the caller closes the client.
func wellBehavedEcho(t *testing.T, ln *Listener, a *backgroundAccept, msg string, size int) (c, srv *Conn) {
	t.Helper()
	d := Dialer{Config: Config{HandshakeTimeout: 5 * time.Second}, Fallback: &Fallback{RDMATimeout: rdmatest.Scale(2 * time.Second)}}
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(10*time.Second))
	defer cancel()
	nc, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("well-behaved dial: %v", err)
	}
	c = nc.(*Conn)
	if srv = a.peerOf(ctx, c); srv == nil {
		c.Close()
		t.Fatal("the well-behaved client's connection was not accepted")
	}
	echoed := make(chan struct{})
	go func() {
		defer close(echoed)
		b, err := srv.Recv(ctx)
		if err != nil {
			return
		}
		srv.Send(ctx, b)
	}()
	defer func() { cancel(); <-echoed }()
	fail := func(format string, args ...any) {
		t.Helper()
		c.Close()
		t.Fatalf(format, args...)
	}
	if _, err := c.Write([]byte(msg)); err != nil {
		fail("well-behaved Write: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(srv, got); err != nil || string(got) != msg {
		fail("server read %q, %v; want %q", got, err, msg)
	}
	b, err := c.Alloc(size)
	if err != nil {
		fail("well-behaved Alloc(%d): %v", size, err)
	}
	copy(b.Bytes(), msg)
	if err := c.Send(ctx, b); err != nil {
		fail("well-behaved Send: %v", err)
	}
	r, err := c.Recv(ctx)
	if err != nil {
		fail("well-behaved Recv: %v", err)
	}
	defer r.Release()
	if r.Len() != size || string(r.Bytes()[:len(msg)]) != msg {
		fail("echo: %d bytes %q, want %d bytes starting %q", r.Len(), r.Bytes()[:min(r.Len(), len(msg))], size, msg)
	}
	return c, srv
}
