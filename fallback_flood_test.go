package rdma

// The TCP fallback under peers that announce frames and never send them:
// host tests, with and without cgo (every connection is TCP-backed here,
// as in fallback_test.go).

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/tcpframe"
)

// rawFallbackDial connects to a fallback listener as a raw TCP client and
// runs the dialer's hello; it returns the connection ready for frames.
func rawFallbackDial(addr string) (net.Conn, error) {
	nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	h := tcpframe.Hello{Major: tcpframe.Major, Minor: tcpframe.Minor, MaxMessage: 4 << 20, MaxChunk: 32 << 10}
	if _, err := nc.Write(h.AppendTo(nil)); err != nil {
		nc.Close()
		return nil, err
	}
	peer, err := tcpframe.ReadHello(nc)
	if err == nil && peer.Reject {
		err = errors.New("refused: " + peer.Reason)
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	return nc, nil
}

// frameHeader is a frame header announcing n bytes of type typ.
func frameHeader(typ byte, n int) []byte {
	var h [tcpframe.HeaderLen]byte
	tcpframe.PutHeader(&h, typ, n)
	return h[:]
}

// Enough raw clients, each announcing one largest message and sending no
// byte of it, to take the whole fallback pool if each announcement took
// its buffer: a well-behaved fallback client then still connects, sends
// and receives, and the announcements together hold a small part of the
// pool.
func TestFallbackHeaderFlood(t *testing.T) {
	g0 := rdmatest.Goroutines()
	pool, err := fallbackPool()
	if err != nil {
		t.Fatal(err)
	}
	const maxMsg = 4 << 20
	flood := int(int64(1<<30)/maxMsg) + 44 // the pool's cap (buffer.Options{} default) in largest messages, and more
	ln := fallbackListen(t, ListenConfig{Config: Config{Backlog: 2 * flood, HandshakeTimeout: 30 * time.Second}})
	defer ln.Close()

	acc := acceptAll(ln)
	defer acc.closeAll()

	base := pool.Stats().InUseBytes
	raws := make([]net.Conn, 0, flood)
	defer func() {
		for _, r := range raws {
			r.Close()
		}
	}()
	for i := range flood {
		r, err := rawFallbackDial(ln.Addr().String())
		if err != nil {
			t.Fatalf("raw client %d: %v", i, err)
		}
		raws = append(raws, r)
		if _, err := r.Write(frameHeader(tcpframe.TypeMessage, maxMsg)); err != nil {
			t.Fatalf("raw client %d: %v", i, err)
		}
	}
	// Let the server's readers take in every header (and, if a header
	// takes its message's buffer, the pool run dry).
	deadline := time.Now().Add(rdmatest.Scale(2 * time.Second))
	for {
		if n := len(acc.conns()); n >= flood || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	held := pool.Stats().InUseBytes - base
	t.Logf("%d raw clients announcing %d-byte messages: the fallback pool holds %d bytes more", flood, maxMsg, held)

	// A well-behaved client: dial, write and send, get an echo.
	c, _ := wellBehavedEcho(t, ln, acc, "hello during a flood", 64<<10)
	defer c.Close()
	if limit := int64(flood) * 256 << 10; held > limit {
		t.Fatalf("%d announcements without payload hold %d bytes of the fallback pool; want at most %d", flood, held, limit)
	}

	for _, r := range raws {
		r.Close()
	}
	raws = nil
	c.Close()
	acc.closeAll()
	checkFallbackClean(t, g0)
}

// A peer that starts a frame and then stops sending ends its connection
// within the listener's HandshakeTimeout: inside a header, or inside a
// payload after some of it. While open, the frame holds at most four times
// the payload received (or tcpframe.CommitFirst); what it held goes back to
// the pool.
func TestFallbackFrameStall(t *testing.T) {
	g0 := rdmatest.Goroutines()
	stall := rdmatest.Scale(300 * time.Millisecond)
	ln := fallbackListen(t, ListenConfig{Config: Config{HandshakeTimeout: stall}})
	defer ln.Close()
	cases := []struct {
		name string
		send []byte
	}{
		{"inside a header", frameHeader(tcpframe.TypeMessage, 1<<20)[:3]},
		{"after a header", frameHeader(tcpframe.TypeMessage, 1<<20)},
		{"inside a payload", append(frameHeader(tcpframe.TypeMessage, 1<<20), make([]byte, 100<<10)...)},
		{"inside a stream frame", append(frameHeader(tcpframe.TypeStream, 1000), make([]byte, 10)...)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			acc := make(chan *Conn, 1)
			go func() {
				c, err := ln.AcceptRDMA()
				if err != nil {
					close(acc)
					return
				}
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
			pool, _ := fallbackPool()
			base := pool.Stats().InUseBytes
			if _, err := r.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			// While the frame is open, it holds at most four times what
			// arrived of it, or the first commitment for its header.
			time.Sleep(stall / 3)
			sent := max(len(tc.send)-tcpframe.HeaderLen, 0)
			if held := pool.Stats().InUseBytes - base; held > int64(max(4*sent, tcpframe.CommitFirst)) {
				t.Errorf("a frame open after %d bytes of payload holds %d bytes of the pool", sent, held)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*stall+5*time.Second)
			defer cancel()
			var rerr error
			if tc.send[0] == tcpframe.TypeStream {
				srv.SetReadDeadline(time.Now().Add(10*stall + 5*time.Second))
				_, rerr = srv.Read(make([]byte, 10))
			} else {
				var b buffer.Buf
				b, rerr = srv.Recv(ctx)
				b.Release()
			}
			took := time.Since(start)
			if !errors.Is(rerr, ErrProtocol) || !errors.Is(rerr, os.ErrDeadlineExceeded) {
				t.Fatalf("Recv after a stalled frame: %v; want ErrProtocol and os.ErrDeadlineExceeded", rerr)
			}
			if ctx.Err() != nil || took > 3*stall+time.Second {
				t.Fatalf("the stalled frame ended its connection after %v; HandshakeTimeout is %v", took, stall)
			}
			t.Logf("%v after %v", rerr, took)
			// The server closed the connection: the raw peer sees its end.
			r.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.Copy(io.Discard, r); err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("raw peer after the stall: %v; want the end of the connection", err)
			}
		})
	}
	ln.Close()
	checkFallbackClean(t, g0)
}

// Messages whose buffer grows while their payload arrives (past
// tcpframe.CommitFirst, up to the largest message) arrive whole and intact.
func TestFallbackLargeMessagesGrow(t *testing.T) {
	g0 := rdmatest.Goroutines()
	c, s, ln := fallbackPair(t, Config{}, Config{})
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(20*time.Second))
	defer cancel()
	sizes := []int{tcpframe.CommitFirst - 1, tcpframe.CommitFirst, tcpframe.CommitFirst + 1, 1<<20 + 3, 4 << 20}
	go func() {
		for i, n := range sizes {
			b, err := c.Alloc(n)
			if err != nil {
				t.Error(err)
				return
			}
			copy(b.Bytes(), pattern(n, i))
			if err := c.Send(ctx, b); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i, n := range sizes {
		m, err := s.Recv(ctx)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if m.Len() != n || !bytes.Equal(m.Bytes(), pattern(n, i)) {
			t.Fatalf("message %d: %d bytes, want %d, content equal %v", i, m.Len(), n, m.Len() == n && bytes.Equal(m.Bytes(), pattern(n, i)))
		}
		m.Release()
	}
	c.Close()
	s.Close()
	ln.Close()
	checkFallbackClean(t, g0)
}

// pattern returns n bytes of a pattern that shows a lost or moved byte.
func pattern(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((i + seed) % 251)
	}
	return b
}
