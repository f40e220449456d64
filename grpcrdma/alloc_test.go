package grpcrdma

import (
	"context"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/testpb"
)

// serverTransports returns the server's transports.
func (p *pair) serverTransports() []*transport {
	p.srv.mu.Lock()
	defer p.srv.mu.Unlock()
	var ts []*transport
	for t := range p.srv.conns {
		ts = append(ts, t)
	}
	return ts
}

// testZeroCopy: one call at a time, every message (up to 3 MiB, above the
// receive buffers) is decoded from the buffer it arrived in, on both
// sides: none is copied.
func testZeroCopy(t *testing.T, p *pair) {
	ctx := ctxT(t, 20*time.Second)
	for _, n := range []int{10, 1000, 40 << 10, 1 << 20, 3 << 20} {
		if _, err := p.client.Say(ctx, &testpb.EchoRequest{Payload: make([]byte, n)}); err != nil {
			t.Fatal(err)
		}
	}
	p.cc.mu.Lock()
	ct := p.cc.t
	p.cc.mu.Unlock()
	ts := append(p.serverTransports(), ct)
	for _, tr := range ts {
		if c := tr.copied.Load(); c != 0 {
			t.Errorf("%d messages copied (server %v)", c, tr.server)
		}
	}
}

// unaryAllocs reports the allocations of one unary call (both sides, as
// they share the process) with a small message.
func unaryAllocs(t *testing.T, p *pair) float64 {
	ctx := context.Background()
	req := &testpb.EchoRequest{Message: "allocs", Payload: make([]byte, 64)}
	for range 100 { // warm the pools
		if _, err := p.client.Say(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	return testing.AllocsPerRun(500, func() {
		if _, err := p.client.Say(ctx, req); err != nil {
			t.Fatal(err)
		}
	})
}

func TestAllocsFallback(t *testing.T) {
	if hostOnly(t) {
		return
	}
	p := newPair(t, fallbackListen, []DialOption{fallbackDial()})
	defer p.close(t)
	t.Run("ZeroCopy", func(t *testing.T) { testZeroCopy(t, p) })
	t.Logf("allocations per unary call over the TCP fallback, client and server together: %.1f", unaryAllocs(t, p))
}

// BenchmarkUnaryFallback measures a unary call over the TCP fallback on the
// host (client and server in this process); BenchmarkUnaryRDMA the same
// over RDMA.
func BenchmarkUnaryFallback(b *testing.B) {
	p := newPair(b, fallbackListen, []DialOption{fallbackDial()})
	defer p.close(b)
	benchUnary(b, p)
}

func benchUnary(b *testing.B, p *pair) {
	ctx := context.Background()
	req := &testpb.EchoRequest{Message: "bench", Payload: make([]byte, 64)}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := p.client.Say(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	_ = rdmatest.Scale
}
