package rdma

import (
	"context"
	"io"
	"net"
	"testing"
)

// BenchmarkFallbackStream: 64 KiB writes over a TCP-backed Conn pair
// (framed, a copy each way), against BenchmarkPlainTCPStream.
func BenchmarkFallbackStream(b *testing.B) {
	c, s, ln := fallbackPair(b, Config{}, Config{})
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	benchStream(b, c, s)
}

func BenchmarkPlainTCPStream(b *testing.B) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() { c, _ := l.Accept(); acc <- c }()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	s := <-acc
	defer c.Close()
	defer s.Close()
	benchStream(b, c, s)
}

func benchStream(b *testing.B, w, r net.Conn) {
	buf := make([]byte, 64<<10)
	done := make(chan error, 1)
	go func() {
		_, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{r}, make([]byte, 64<<10))
		done <- err
	}()
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := w.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	if cw, ok := w.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkFallbackPingPong: 64-byte message round trips over TCP.
func BenchmarkFallbackPingPong(b *testing.B) {
	c, s, ln := fallbackPair(b, Config{}, Config{})
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	ctx := context.Background()
	go func() {
		for {
			m, err := s.Recv(ctx)
			if err != nil {
				return
			}
			if s.Send(ctx, m) != nil {
				return
			}
		}
	}()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		m, err := c.Alloc(64)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Send(ctx, m); err != nil {
			b.Fatal(err)
		}
		r, err := c.Recv(ctx)
		if err != nil {
			b.Fatal(err)
		}
		r.Release()
	}
}
