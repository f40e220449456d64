package benchmarks

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
)

// Benchmarks of one connection in one process (both ends share the CPUs; the
// rdmabench command runs them in separate pinned processes and compares with
// perftest). They skip without an RDMA device:
//
//	go test -c -o .build/benchmarks.test ./benchmarks
//	scripts/softroce run -- .build/benchmarks.test -test.run '^$' -test.bench . -test.benchtime 2000x

// connPair returns both ends of one connection on the test device, closed at
// the end of the benchmark.
func connPair(b *testing.B) (client, server *rdma.Conn) {
	b.Helper()
	env := rdmatest.Require(b)
	ln, err := rdma.Listen("rdma", net.JoinHostPort(env.Addr, "0"))
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	type accepted struct {
		c   *rdma.Conn
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		c, err := ln.AcceptRDMA()
		ch <- accepted{c, err}
	}()
	d := rdma.Dialer{Timeout: rdmatest.Scale(10 * time.Second)}
	nc, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	a := <-ch
	if a.err != nil {
		nc.Close()
		b.Fatal(a.err)
	}
	client, server = nc.(*rdma.Conn), a.c
	b.Cleanup(func() {
		client.Close()
		server.Close()
	})
	return client, server
}

func sizeName(n int) string {
	if n >= 1<<10 && n%(1<<10) == 0 {
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// BenchmarkWriteRead streams b.N writes of each size through Conn.Write while
// another goroutine reads them with Conn.Read; the clock stops when the reader
// has every byte. MB/s counts the bytes written per second (MB = 10^6 B).
func BenchmarkWriteRead(b *testing.B) {
	for _, size := range []int{64, 4 << 10, 64 << 10} {
		b.Run(sizeName(size), func(b *testing.B) { benchWriteRead(b, size) })
	}
}

func benchWriteRead(b *testing.B, size int) {
	c, s := connPair(b)
	msg := make([]byte, size)
	for i := range msg {
		msg[i] = byte(i)
	}
	total := int64(size) * int64(b.N)
	done := make(chan error, 1)
	b.ReportAllocs()
	b.SetBytes(int64(size))
	b.ResetTimer()
	go func() {
		buf := make([]byte, max(size, 64<<10))
		var got int64
		for got < total {
			n, err := s.Read(buf)
			got += int64(n)
			if err != nil {
				done <- fmt.Errorf("read after %d of %d bytes: %w", got, total, err)
				return
			}
		}
		done <- nil
	}()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
}

// BenchmarkPingPong64 measures round trips of 64 B: Write, then io.ReadFull of
// the echo a goroutine sends back. ns/op is the round trip; one-way-µs is half
// of it, as perftest reports latency. SetBytes counts both directions.
func BenchmarkPingPong64(b *testing.B) {
	const size = 64
	c, s := connPair(b)
	go func() {
		buf := make([]byte, size)
		for {
			if _, err := io.ReadFull(s, buf); err != nil {
				return
			}
			if _, err := s.Write(buf); err != nil {
				return
			}
		}
	}()
	msg := make([]byte, size)
	buf := make([]byte, size)
	b.ReportAllocs()
	b.SetBytes(2 * size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed())/1e3/float64(b.N)/2, "one-way-µs")
}
