package rdma

// The TCP fallback's bound on what a peer can make this side hold in
// received frames the application has not taken: host tests, with and
// without cgo (every connection is TCP-backed here, as in fallback_test.go).

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/tcpframe"
)

// tcpConnBound is the most a TCP-backed connection with cfg (defaults
// applied) holds in received frames nobody took while its reader waits
// for the application: its budget and the frame that crossed it.
func tcpConnBound(cfg Config, pool *buffer.Pool) int64 {
	return tcpOptions(&cfg, pool).RecvBudget() + int64(pool.MaxSize())
}

// Hostile peers that send complete messages (and stream data) that the
// application never takes, each far more than RecvBuffers largest
// messages: each connection holds at most its budget and one frame of the
// fallback pool, the peers' writes are pushed back by TCP (their writes
// stop moving; nothing fails on this side: the connections still deliver
// when read), and a well-behaved client still dials, sends and receives.
func TestFallbackBoundUnread(t *testing.T) {
	g0 := rdmatest.Goroutines()
	pool, err := fallbackPool()
	if err != nil {
		t.Fatal(err)
	}
	lcfg := Config{HandshakeTimeout: 30 * time.Second}
	ln := fallbackListen(t, ListenConfig{Config: lcfg})
	acc := acceptAll(ln)
	defer acc.closeAll()
	base := pool.Stats().InUseBytes

	const (
		msgPeers    = 4
		streamPeers = 2
		peers       = msgPeers + streamPeers
		maxMsg      = 4 << 20
		chunk       = 32 << 10  // the listener's BufferSize (default): its largest stream frame
		perPeer     = 320 << 20 // more than RecvBuffers (64) largest messages
	)
	msgFrame := append(frameHeader(tcpframe.TypeMessage, maxMsg), pattern(maxMsg, 1)...)
	var streamFrames []byte
	for len(streamFrames) < maxMsg {
		streamFrames = append(streamFrames, frameHeader(tcpframe.TypeStream, chunk)...)
		streamFrames = append(streamFrames, pattern(chunk, 2)...)
	}
	stall := rdmatest.Scale(time.Second)
	type result struct {
		written int64
		err     error
	}
	results := make(chan result, peers)
	var raws []net.Conn
	defer func() {
		for _, r := range raws {
			r.Close()
		}
	}()
	for i := range peers {
		r, err := rawFallbackDial(ln.Addr().String())
		if err != nil {
			t.Fatalf("raw client %d: %v", i, err)
		}
		raws = append(raws, r)
		frames := msgFrame
		if i >= msgPeers {
			frames = streamFrames
		}
		go func() {
			// Write until a write makes no progress for stall: pushed back.
			var written int64
			for written < perPeer {
				r.SetWriteDeadline(time.Now().Add(stall))
				n, err := r.Write(frames)
				written += int64(n)
				if err != nil {
					results <- result{written, err}
					return
				}
			}
			results <- result{written, nil}
		}()
	}
	var sent int64
	for range peers {
		res := <-results
		sent += res.written
		if !errors.Is(res.err, os.ErrDeadlineExceeded) {
			t.Errorf("a hostile peer wrote %d bytes and then %v; want its writes pushed back (a write timeout)", res.written, res.err)
		}
	}
	time.Sleep(200 * time.Millisecond) // let the readers settle
	held := pool.Stats().InUseBytes - base
	bound := int64(peers) * tcpConnBound(lcfg.withDefaults(), pool)
	t.Logf("%d hostile peers wrote %d MiB the application never read: the fallback pool holds %d bytes more (bound %d)",
		peers, sent>>20, held, bound)
	if held > bound {
		t.Errorf("%d connections with unread data hold %d bytes of the fallback pool; want at most %d", peers, held, bound)
	}

	// A well-behaved client: dial, write and send, get an echo.
	c, srv := wellBehavedEcho(t, ln, acc, "hello beside unread peers", 1<<20)
	defer c.Close()
	t.Logf("the well-behaved client dialed, wrote, sent 1 MiB and received its echo")

	// Nothing failed on this side: each hostile connection still delivers
	// what its peer sent, from the first byte.
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(10*time.Second))
	defer cancel()
	for _, a := range acc.conns() {
		if a == srv {
			continue
		}
		a.SetReadDeadline(time.Now().Add(rdmatest.Scale(5 * time.Second)))
		select {
		case m, ok := <-a.Messages():
			if !ok {
				_, err := a.Recv(ctx)
				t.Fatalf("a hostile peer's connection ended: %v", err)
			}
			if !bytes.Equal(m.Bytes(), msgFrame[tcpframe.HeaderLen:]) {
				t.Errorf("a hostile peer's first message: %d bytes, not what it sent", m.Len())
			}
			m.Release()
		case <-time.After(rdmatest.Scale(200 * time.Millisecond)): // a stream peer's
			got := make([]byte, chunk)
			if _, err := io.ReadFull(a, got); err != nil || !bytes.Equal(got, pattern(chunk, 2)) {
				t.Errorf("a hostile peer's stream: %v, or not what it sent", err)
			}
		}
	}

	for _, r := range raws {
		r.Close()
	}
	raws = nil
	c.Close()
	acc.closeAll()
	checkFallbackClean(t, g0)
}

// A peer whose writes were pushed back because the application did not
// read loses nothing: once the application reads, every message and every
// stream byte the peer wrote arrives, in order, and then the end of stream.
func TestFallbackBoundNoLoss(t *testing.T) {
	g0 := rdmatest.Goroutines()
	pool, err := fallbackPool()
	if err != nil {
		t.Fatal(err)
	}
	lcfg := Config{}
	ln := fallbackListen(t, ListenConfig{Config: lcfg})
	defer ln.Close()
	acc := make(chan *Conn, 1)
	go func() {
		c, _ := ln.AcceptRDMA()
		acc <- c
	}()
	r, err := rawFallbackDial(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	srv := <-acc
	if srv == nil {
		t.Fatal("not accepted")
	}
	defer srv.Close()
	base := pool.Stats().InUseBytes

	// Messages of many sizes (the empty one, one past a size class, the
	// largest) between stream frames, 40 MiB in all.
	sizes := []int{0, 1, 1000, tcpframe.CommitFirst + 1, 1<<20 + 1, 4 << 20, 32 << 10}
	var wantMsgs [][]byte
	var wantStream []byte
	var wire []byte
	for i := 0; len(wire) < 40<<20; i++ {
		m := pattern(sizes[i%len(sizes)], i)
		wantMsgs = append(wantMsgs, m)
		wire = append(append(wire, frameHeader(tcpframe.TypeMessage, len(m))...), m...)
		s := pattern(1+(i*7919)%(32<<10), i+1)
		wantStream = append(wantStream, s...)
		wire = append(append(wire, frameHeader(tcpframe.TypeStream, len(s))...), s...)
	}
	var written atomic.Int64
	werr := make(chan error, 1)
	go func() {
		for p := wire; len(p) > 0; {
			n, err := r.Write(p[:min(len(p), 64<<10)])
			written.Add(int64(n))
			p = p[n:]
			if err != nil {
				werr <- err
				return
			}
		}
		werr <- r.(*net.TCPConn).CloseWrite()
	}()
	// Wait until the peer is pushed back: its writes stop moving.
	last, still := int64(-1), time.Now()
	for time.Since(still) < rdmatest.Scale(500*time.Millisecond) {
		if w := written.Load(); w != last {
			last, still = w, time.Now()
		}
		time.Sleep(10 * time.Millisecond)
	}
	held := pool.Stats().InUseBytes - base
	t.Logf("the peer is pushed back after %d of %d bytes; the connection holds %d bytes of the pool", last, len(wire), held)
	if last >= int64(len(wire)) {
		t.Fatalf("the peer wrote all %d bytes with nobody reading", len(wire))
	}
	if bound := tcpConnBound(lcfg.withDefaults(), pool); held > bound {
		t.Errorf("unread frames hold %d bytes; want at most %d", held, bound)
	}

	// Now read both views at once.
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(30*time.Second))
	defer cancel()
	srv.SetReadDeadline(time.Now().Add(rdmatest.Scale(30 * time.Second)))
	streamDone := make(chan error, 1)
	go func() {
		got, err := io.ReadAll(srv)
		if err == nil && !bytes.Equal(got, wantStream) {
			err = errors.New("the stream read differs from the stream written")
		}
		streamDone <- err
	}()
	for i, want := range wantMsgs {
		var m buffer.Buf
		var ok bool
		select {
		case m, ok = <-srv.Messages():
		case <-ctx.Done():
		}
		if !ok {
			t.Fatalf("message %d of %d: none (%v)", i, len(wantMsgs), ctx.Err())
		}
		if !bytes.Equal(m.Bytes(), want) {
			t.Fatalf("message %d: %d bytes, want %d, or different content", i, m.Len(), len(want))
		}
		m.Release()
	}
	if _, err := srv.Recv(ctx); err != io.EOF {
		t.Fatalf("Recv after the last message: %v, want io.EOF", err)
	}
	if err := <-streamDone; err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("the peer's writes: %v", err)
	}
	t.Logf("%d messages and %d stream bytes arrived in order", len(wantMsgs), len(wantStream))
	r.Close()
	srv.Close()
	ln.Close()
	checkFallbackClean(t, g0)
}

// The process's fallback pool is capped by the first fallback user's
// Config.PoolMaxBytes (here a listener's, 16 MiB): a later listener or
// dialer with a larger one does not raise it, and Alloc past it fails with
// buffer.ErrExhausted. Run in a child process, whose fallback pool is not
// made yet.
func TestFallbackPoolFirstConfig(t *testing.T) {
	const child = "VERBLINE_TEST_FALLBACK_POOL_CHILD"
	if os.Getenv(child) == "" {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestFallbackPoolFirstConfig$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), child+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("--- PASS: TestFallbackPoolFirstConfig")) {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return
	}
	if tcpPool.p != nil {
		t.Fatal("the fallback pool exists before the first fallback user")
	}
	const capBytes = 16 << 20
	first := fallbackListen(t, ListenConfig{Config: Config{PoolMaxBytes: capBytes}})
	defer first.Close()
	c, s, ln := fallbackPair(t, Config{PoolMaxBytes: 1 << 30}, Config{PoolMaxBytes: 1 << 30})
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	var held []buffer.Buf
	defer func() {
		for _, b := range held {
			b.Release()
		}
	}()
	var err error
	for len(held) <= capBytes/(4<<20) {
		var b buffer.Buf
		if b, err = c.Alloc(4 << 20); err != nil {
			break
		}
		held = append(held, b)
	}
	if len(held) != capBytes/(4<<20) || !errors.Is(err, buffer.ErrExhausted) {
		t.Fatalf("Alloc of 4 MiB buffers under a 16 MiB cap: %d succeeded, then %v; want 4, then buffer.ErrExhausted", len(held), err)
	}
	t.Logf("the first user's PoolMaxBytes holds: %d buffers of 4 MiB, then %v", len(held), err)
}
