package grpcrdma

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/rdmatest/baseline"
	"github.com/verbline/rdma/internal/testpb"
)

// rdmaListen listens over RDMA on the test device's address.
func rdmaListen(env rdmatest.Env) listenFn {
	return func(t testing.TB) *rdma.Listener {
		ln, err := rdma.Listen("rdma", net.JoinHostPort(env.Addr, "0"))
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
}

// TestSuiteRDMA runs the behaviour suite over RDMA connections, then
// checks that no RDMA object or goroutine is left.
func TestSuiteRDMA(t *testing.T) {
	env := rdmatest.Require(t)
	baseRes, baseG := baseline.Take(t, env)
	start := time.Now()
	runSuite(t, rdmaListen(env), nil)
	t.Logf("suite over RDMA: %v", time.Since(start))
	rdmatest.CheckNoLeaks(t, baseRes, baseG)
}

// TestRDMATransport checks the calls really run over RDMA and that a
// message above the receive buffers moves whole (the library's rendezvous).
func TestRDMATransport(t *testing.T) {
	env := rdmatest.Require(t)
	baseRes, baseG := baseline.Take(t, env)
	p := newPair(t, rdmaListen(env), nil)
	p.cc.mu.Lock()
	c := p.cc.t.conn
	p.cc.mu.Unlock()
	if c.Transport() != "rdma" || c.LocalAddr().Network() != "rdma" {
		t.Fatalf("transport %q, local address %v (%s)", c.Transport(), c.LocalAddr(), c.LocalAddr().Network())
	}
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(10*time.Second))
	defer cancel()
	before := c.Stats()
	payload := make([]byte, 1<<20)
	if r, err := p.client.Say(ctx, &testpb.EchoRequest{Payload: payload}); err != nil || len(r.Payload) != len(payload) {
		t.Fatalf("1 MiB: %v", err)
	}
	after := c.Stats()
	t.Logf("stats before %+v after %+v", before, after)
	p.close(t)
	rdmatest.CheckNoLeaks(t, baseRes, baseG)
}

func rdmaListenAt(t testing.TB, addr string) *rdma.Listener {
	ln, err := rdma.Listen("rdma", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// TestLifecycleRDMA: reconnect, GracefulStop and Stop over RDMA.
func TestLifecycleRDMA(t *testing.T) {
	env := rdmatest.Require(t)
	baseRes, baseG := baseline.Take(t, env)
	runLifecycle(t, net.JoinHostPort(env.Addr, "0"), rdmaListenAt, nil)
	rdmatest.CheckNoLeaks(t, baseRes, baseG)
}

// TestAllocsRDMA: no message copied, and the allocations of a unary call
// over RDMA.
func TestAllocsRDMA(t *testing.T) {
	env := rdmatest.Require(t)
	baseRes, baseG := baseline.Take(t, env)
	p := newPair(t, rdmaListen(env), nil)
	t.Run("ZeroCopy", func(t *testing.T) { testZeroCopy(t, p) })
	t.Logf("allocations per unary call over RDMA, client and server together: %.1f", unaryAllocs(t, p))
	p.close(t)
	rdmatest.CheckNoLeaks(t, baseRes, baseG)
}

func BenchmarkUnaryRDMA(b *testing.B) {
	env := rdmatest.Require(b)
	p := newPair(b, rdmaListen(env), nil)
	defer p.close(b)
	benchUnary(b, p)
}

// BenchmarkUnaryGRPCGo is BenchmarkUnaryRDMA's call through grpc-go over
// HTTP/2 on an rdma.Conn's byte stream (rdma.Dialer as its dialer), for
// comparison in the same run.
func BenchmarkUnaryGRPCGo(b *testing.B) {
	env := rdmatest.Require(b)
	ln := rdmaListen(env)(b)
	srv := grpc.NewServer()
	testpb.RegisterEchoServer(srv, newEchoServer())
	go srv.Serve(ln)
	defer srv.Stop()
	var d rdma.Dialer
	cc, err := grpc.NewClient("passthrough:///"+ln.Addr().String(),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "rdma", a) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	client := testpb.NewEchoClient(cc)
	ctx := context.Background()
	req := &testpb.EchoRequest{Message: "bench", Payload: make([]byte, 64)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := client.Say(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
