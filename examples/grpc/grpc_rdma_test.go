package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/rdmatest/baseline"
)

// startServer serves the Blob service on a new Listener; the channel gets
// Serve's result.
func startServer(t *testing.T, env rdmatest.Env) (*rdma.Listener, *grpc.Server, <-chan error) {
	t.Helper()
	ln, err := rdma.Listen("rdma", net.JoinHostPort(env.Addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	return ln, srv, served
}

// countingClient is newClient with a dialer that counts its connections and
// checks each is an RDMA connection. It dials with network "tcp", as
// grpc-go's own dialer would: Dialer.DialContext maps it to "rdma".
func countingClient(t *testing.T, addr string, dials *atomic.Int32) *grpc.ClientConn {
	t.Helper()
	var d rdma.Dialer
	cc, err := newClient(addr, &d, grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
		c, err := d.DialContext(ctx, "tcp", a)
		if err != nil {
			return nil, err
		}
		if _, ok := c.(*rdma.Conn); !ok || c.LocalAddr().Network() != "rdma" {
			c.Close()
			return nil, fmt.Errorf("dialer returned a %T on %q, want an *rdma.Conn", c, c.LocalAddr().Network())
		}
		dials.Add(1)
		return c, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	return cc
}

// streamMessages returns messages of 0 B to 1 MiB, the sizes around
// HTTP/2's frame (16 KiB) and initial window (64 KiB) and the library's
// receive buffers (32 KiB) first, then random ones, total bytes or a little
// more in all, with random contents from seed.
func streamMessages(seed byte, total int) [][]byte {
	src := rand.NewChaCha8([32]byte{seed})
	r := rand.New(src)
	sizes := []int{0, 1, 2, 3, 1023, 1024, 1025, 16383, 16384, 16385, 32767, 32768, 32769,
		65535, 65536, 65537, 256 << 10, 1<<20 - 1, 1 << 20}
	n := 0
	for _, s := range sizes {
		n += s
	}
	for n < total {
		s := 1 + r.IntN(1<<20)
		sizes = append(sizes, s)
		n += s
	}
	msgs := make([][]byte, len(sizes))
	for i, s := range sizes {
		msgs[i] = make([]byte, s)
		src.Read(msgs[i])
	}
	return msgs
}

// TestGRPC serves grpc-go on an rdma.Listener and calls it through
// grpc.NewClient with the rdma.Dialer: 2000 unary calls from 8 goroutines,
// two concurrent bidirectional streams of 1 B to 1 MiB messages (about 8 MiB
// each way) checked byte for byte, then GracefulStop while a stream is open
// (the stream finishes, the listener closes at once), the client's Close,
// and no RDMA object or goroutine left.
func TestGRPC(t *testing.T) {
	env := rdmatest.Require(t)
	baseRes, baseG := baseline.Take(t, env)

	ln, srv, served := startServer(t, env)
	addr := ln.Addr().String()
	var dials atomic.Int32
	cc := countingClient(t, addr, &dials)
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(2*time.Minute))
	defer cancel()

	t.Run("unary", func(t *testing.T) {
		const workers, perWorker = 8, 250
		start := time.Now()
		var wg sync.WaitGroup
		var large atomic.Int32
		for w := range workers {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(w), 12))
				for i := range perWorker {
					n := 8 + r.IntN(512)
					if i%50 == 0 { // above the library's 32 KiB receive buffers and HTTP/2's 16 KiB frames
						n = 64<<10 + r.IntN(64<<10)
						large.Add(1)
					}
					req := make([]byte, n)
					for j := range req {
						req[j] = byte(r.Uint32())
					}
					binary.LittleEndian.PutUint32(req, uint32(w)) // unique: worker and call
					binary.LittleEndian.PutUint32(req[4:], uint32(i))
					resp, err := echo(ctx, cc, req)
					if err != nil {
						t.Errorf("worker %d, call %d (%d B): %v", w, i, n, err)
						return
					}
					if !bytes.Equal(resp, req) {
						t.Errorf("worker %d, call %d: %d bytes back, %d sent, first difference at %d", w, i, len(resp), n, firstDiff(resp, req))
						return
					}
				}
			})
		}
		wg.Wait()
		el := time.Since(start)
		t.Logf("%d unary calls (%d of 64-128 KiB) from %d goroutines: %v, %.0f calls/s", workers*perWorker, large.Load(), workers, el.Round(time.Millisecond), float64(workers*perWorker)/el.Seconds())
	})

	t.Run("bidi", func(t *testing.T) {
		const streams = 2
		start := time.Now()
		var wg sync.WaitGroup
		var bytesSent, count atomic.Int64
		for s := range streams {
			msgs := streamMessages(byte(s), 4<<20)
			for _, m := range msgs {
				bytesSent.Add(int64(len(m)))
			}
			count.Add(int64(len(msgs)))
			wg.Go(func() {
				if err := exchange(ctx, cc, msgs); err != nil {
					t.Errorf("stream %d: %v", s, err)
				}
			})
		}
		wg.Wait()
		el := time.Since(start)
		t.Logf("%d concurrent streams, %d messages, %.1f MiB echoed and checked: %v, %.1f MB/s each way",
			streams, count.Load(), float64(bytesSent.Load())/(1<<20), el.Round(time.Millisecond), float64(bytesSent.Load())/el.Seconds()/1e6)
	})
	// The leak check at the end can only see leaks if it sees live objects.
	if live := rdmatest.Resources(t); live["qp"] < 2 || live["cm_id"] < 3 {
		t.Errorf("with a connection open, rdma resource show lists %v for this process", live)
	}
	if t.Failed() {
		srv.Stop()
		cc.Close()
		t.FailNow()
	}

	// GracefulStop while a stream is open: the listener closes at once (a
	// new dial is refused), the open stream keeps working to its end, and
	// GracefulStop returns only after it.
	s, err := cc.NewStream(ctx, exchangeDesc, exchangeMethod)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip := func(msg string) {
		t.Helper()
		m, got := []byte(msg), []byte(nil)
		if err := s.SendMsg(&m); err != nil {
			t.Fatalf("send %q: %v", msg, err)
		}
		if err := s.RecvMsg(&got); err != nil || string(got) != msg {
			t.Fatalf("echo of %q: %q, %v", msg, got, err)
		}
	}
	roundTrip("before GracefulStop")
	start := time.Now()
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	refused := waitRefused(t, addr)
	roundTrip("after GracefulStop began")
	select {
	case <-stopped:
		t.Fatal("GracefulStop returned while a stream was open")
	case <-time.After(rdmatest.Scale(100 * time.Millisecond)):
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var extra []byte
	if err := s.RecvMsg(&extra); err != io.EOF {
		t.Fatalf("stream end: %v, want io.EOF", err)
	}
	select {
	case <-stopped:
	case <-time.After(rdmatest.Scale(10 * time.Second)):
		t.Fatal("GracefulStop did not return after the last stream ended")
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve after GracefulStop: %v, want nil", err)
	}
	t.Logf("GracefulStop: listener refused dials after %v, returned after %v", refused.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after GracefulStop: %v, want net.ErrClosed", err)
	}
	if err := cc.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := echo(ctx, cc, []byte("x")); status.Code(err) != codes.Canceled {
		t.Fatalf("call after Close: %v, want code Canceled", err)
	}
	if n := dials.Load(); n < 1 {
		t.Fatalf("the client made %d RDMA connections", n)
	}
	rdmatest.CheckNoLeaks(t, baseRes, baseG)
	t.Logf("%d RDMA connection(s) dialed by the client; no RDMA object or goroutine left", dials.Load())
}

// waitRefused dials addr until the dial is refused (nobody listens), and
// returns how long that took. A dial that lands before the listener closes
// is accepted and dropped by the stopping server.
func waitRefused(t *testing.T, addr string) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(rdmatest.Scale(5 * time.Second))
	for {
		c, err := rdma.Dial("rdma", addr)
		if errors.Is(err, syscall.ECONNREFUSED) {
			return time.Since(start)
		}
		if c != nil {
			c.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("dial after GracefulStop began: %v; want connection refused", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestGRPCStop: Stop (not graceful) while a client is blocked receiving on a
// stream ends that receive with codes.Unavailable, Serve returns nil, and
// nothing is left behind.
func TestGRPCStop(t *testing.T) {
	env := rdmatest.Require(t)
	baseRes, baseG := baseline.Take(t, env)

	ln, srv, served := startServer(t, env)
	var dials atomic.Int32
	cc := countingClient(t, ln.Addr().String(), &dials)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(time.Minute))
	defer cancel()
	s, err := cc.NewStream(ctx, exchangeDesc, exchangeMethod)
	if err != nil {
		t.Fatal(err)
	}
	m, got := []byte("hello"), []byte(nil)
	if err := s.SendMsg(&m); err != nil {
		t.Fatal(err)
	}
	if err := s.RecvMsg(&got); err != nil || string(got) != "hello" {
		t.Fatalf("echo: %q, %v", got, err)
	}
	recvd := make(chan error, 1)
	go func() { recvd <- s.RecvMsg(&got) }() // blocks: nothing more was sent
	select {
	case err := <-recvd:
		t.Fatalf("receive returned before Stop: %v", err)
	case <-time.After(rdmatest.Scale(50 * time.Millisecond)):
	}
	start := time.Now()
	srv.Stop()
	select {
	case err := <-recvd:
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("receive after Stop: %v, want code Unavailable", err)
		}
	case <-time.After(rdmatest.Scale(5 * time.Second)):
		t.Fatal("Stop did not end a blocked receive")
	}
	t.Logf("a blocked receive ended %v after Stop", time.Since(start).Round(time.Millisecond))
	if err := <-served; err != nil {
		t.Fatalf("Serve after Stop: %v, want nil", err)
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Stop: %v, want net.ErrClosed", err)
	}
	cancel()
	cc.Close()
	rdmatest.CheckNoLeaks(t, baseRes, baseG)
}
