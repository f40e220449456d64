package grpcrdma

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/testpb"
)

// listenAtFn listens on a given address ("host:0" for any port).
type listenAtFn func(t testing.TB, addr string) *rdma.Listener

func fallbackListenAt(t testing.TB, addr string) *rdma.Listener {
	lc := rdma.ListenConfig{Fallback: &rdma.Fallback{}}
	ln, err := lc.Listen(context.Background(), "rdma", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func TestLifecycleFallback(t *testing.T) {
	if hostOnly(t) {
		return
	}
	g0 := rdmatest.Goroutines()
	runLifecycle(t, "127.0.0.1:0", fallbackListenAt, []DialOption{fallbackDial()})
	rdmatest.WaitGoroutines(t, g0)
}

func runLifecycle(t *testing.T, any string, listen listenAtFn, dopts []DialOption) {
	t.Run("Reconnect", func(t *testing.T) { testReconnect(t, any, listen, dopts) })
	t.Run("GracefulStop", func(t *testing.T) { testGracefulStop(t, any, listen, dopts) })
	t.Run("Stop", func(t *testing.T) { testStop(t, any, listen, dopts) })
}

// testReconnect: the server goes away; the call in flight fails with
// UNAVAILABLE, later calls too while nobody listens, and once a server
// listens again the same ClientConn's next call connects to it.
func testReconnect(t *testing.T, any string, listen listenAtFn, dopts []DialOption) {
	p := startServer(t, listen(t, any))
	cc, err := Dial(ctxT(t, 10*time.Second), p.addr, dopts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := testpb.NewEchoClient(cc)
	if _, err := client.Say(ctxT(t, 5*time.Second), &testpb.EchoRequest{}); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := client.Say(ctxT(t, 10*time.Second), &testpb.EchoRequest{DelayMs: 60_000})
		errc <- err
	}()
	time.Sleep(rdmatest.Scale(50 * time.Millisecond))
	p.srv.Stop()
	<-p.served
	wantCode(t, "the call in flight when the server stopped", <-errc, codes.Unavailable)
	_, err = client.Say(ctxT(t, 10*time.Second), &testpb.EchoRequest{})
	wantCode(t, "a call while nobody listens", err, codes.Unavailable)
	p2 := startServer(t, listen(t, p.addr))
	defer p2.close(t)
	var r *testpb.EchoReply
	deadline := time.Now().Add(rdmatest.Scale(5 * time.Second))
	for {
		r, err = client.Say(ctxT(t, 10*time.Second), &testpb.EchoRequest{Message: "again"})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(rdmatest.Scale(20 * time.Millisecond))
	}
	if err != nil || r.Message != "again" {
		t.Fatalf("after the restart: %v, %v", r, err)
	}
}

// testGracefulStop: the call in flight finishes; calls started afterwards
// are refused (UNAVAILABLE); GracefulStop returns once it ended, and Serve
// returns nil.
func testGracefulStop(t *testing.T, any string, listen listenAtFn, dopts []DialOption) {
	p := startServer(t, listen(t, any))
	cc, err := Dial(ctxT(t, 10*time.Second), p.addr, dopts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := testpb.NewEchoClient(cc)
	slow := make(chan error, 1)
	go func() {
		r, err := client.Say(ctxT(t, 10*time.Second), &testpb.EchoRequest{Message: "slow", DelayMs: int32(rdmatest.Scale(300*time.Millisecond) / time.Millisecond)})
		if err == nil && r.Message != "slow" {
			err = fmt.Errorf("reply %q", r.Message)
		}
		slow <- err
	}()
	time.Sleep(rdmatest.Scale(50 * time.Millisecond))
	stopped := make(chan struct{})
	go func() { p.srv.GracefulStop(); close(stopped) }()
	time.Sleep(rdmatest.Scale(50 * time.Millisecond))
	select {
	case <-stopped:
		t.Fatal("GracefulStop returned with a call in flight")
	default:
	}
	_, err = client.Say(ctxT(t, 10*time.Second), &testpb.EchoRequest{})
	wantCode(t, "a call after GracefulStop", err, codes.Unavailable)
	if err := <-slow; err != nil {
		t.Fatalf("the call in flight: %v", err)
	}
	select {
	case <-stopped:
	case <-time.After(rdmatest.Scale(5 * time.Second)):
		t.Fatal("GracefulStop did not return after the last call")
	}
	if err := <-p.served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if err := p.srv.Serve(listen(t, any)); err != ErrServerStopped {
		t.Fatalf("Serve after GracefulStop: %v", err)
	}
}

// testStop: calls in flight end (UNAVAILABLE on the client, a cancelled
// context in the handler) and Stop returns without waiting for handlers.
func testStop(t *testing.T, any string, listen listenAtFn, dopts []DialOption) {
	p := startServer(t, listen(t, any))
	cc, err := Dial(ctxT(t, 10*time.Second), p.addr, dopts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	bs, err := testpb.NewEchoClient(cc).Chat(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	bs.Send(&testpb.EchoRequest{Message: "stall"})
	bs.Send(&testpb.EchoRequest{Message: "x"})
	time.Sleep(rdmatest.Scale(50 * time.Millisecond))
	p.srv.Stop()
	<-p.served
	_, err = bs.Recv()
	wantCode(t, "a stream when the server stopped", err, codes.Unavailable)
}

// TestInterceptors: server interceptors run in the order given, outermost
// first, around unary and stream handlers; client interceptors likewise,
// with a nil *grpc.ClientConn.
func TestInterceptors(t *testing.T) {
	var mu sync.Mutex
	var trace []string
	rec := func(s string) { mu.Lock(); trace = append(trace, s); mu.Unlock() }
	unary := func(name string) grpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			rec(name + " " + info.FullMethod)
			return h(ctx, req)
		}
	}
	stream := func(name string) grpc.StreamServerInterceptor {
		return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			rec(fmt.Sprintf("%s %s %v %v", name, info.FullMethod, info.IsClientStream, info.IsServerStream))
			return h(srv, ss)
		}
	}
	cunary := func(name string) grpc.UnaryClientInterceptor {
		return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			rec(fmt.Sprintf("%s %s nil-cc=%v", name, method, cc == nil))
			return inv(ctx, method, req, reply, cc, opts...)
		}
	}
	cstream := func(name string) grpc.StreamClientInterceptor {
		return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, s grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			rec(fmt.Sprintf("%s %s nil-cc=%v", name, method, cc == nil))
			return s(ctx, desc, cc, method, opts...)
		}
	}
	p := newPair(t, anyListen,
		[]DialOption{fallbackDial(), WithUnaryInterceptor(cunary("c1"), cunary("c2")), WithStreamInterceptor(cstream("cs1"), cstream("cs2"))},
		UnaryInterceptor(unary("s1")), UnaryInterceptor(unary("s2")), StreamInterceptor(stream("ss1"), stream("ss2")))
	defer p.close(t)
	if _, err := p.client.Say(ctxT(t, 5*time.Second), &testpb.EchoRequest{}); err != nil {
		t.Fatal(err)
	}
	cs, err := p.client.Collect(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"c1 /grpcrdma.test.Echo/Say nil-cc=true", "c2 /grpcrdma.test.Echo/Say nil-cc=true",
		"s1 /grpcrdma.test.Echo/Say", "s2 /grpcrdma.test.Echo/Say",
		"cs1 /grpcrdma.test.Echo/Collect nil-cc=true", "cs2 /grpcrdma.test.Echo/Collect nil-cc=true",
		"ss1 /grpcrdma.test.Echo/Collect true false", "ss2 /grpcrdma.test.Echo/Collect true false",
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(trace, "\n") != strings.Join(want, "\n") {
		t.Fatalf("interceptors ran as\n%s\nwant\n%s", strings.Join(trace, "\n"), strings.Join(want, "\n"))
	}
}

// jsonCodec is a codec of grpc's registry other than proto: protojson.
type jsonCodec struct{ used *atomic.Int32 }

func (c jsonCodec) Marshal(v any) (mem.BufferSlice, error) {
	c.used.Add(1)
	b, err := protojson.Marshal(v.(proto.Message))
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (c jsonCodec) Unmarshal(d mem.BufferSlice, v any) error {
	c.used.Add(1)
	b := d.Materialize()
	if !json.Valid(b) {
		return fmt.Errorf("not JSON: %q", b)
	}
	return protojson.Unmarshal(b, v.(proto.Message))
}

func (jsonCodec) Name() string { return "testjson" }

var jsonUsed atomic.Int32

func init() { encoding.RegisterCodecV2(jsonCodec{&jsonUsed}) }

// TestCodecs: a call's content-subtype picks the registry's codec on both
// sides; ForceCodecV2 does on the client, ForceServerCodec on the server.
func TestCodecs(t *testing.T) {
	p := newPair(t, anyListen, []DialOption{fallbackDial()})
	defer p.close(t)
	ctx := ctxT(t, 5*time.Second)
	before := jsonUsed.Load()
	r, err := p.client.Say(ctx, &testpb.EchoRequest{Message: "json"}, grpc.CallContentSubtype("testjson"))
	if err != nil || r.Message != "json" {
		t.Fatalf("Say over testjson: %v, %v", r, err)
	}
	if n := jsonUsed.Load() - before; n != 4 {
		t.Fatalf("the JSON codec ran %d times, want 4 (two marshals, two unmarshals)", n)
	}
	r, err = p.client.Say(ctx, &testpb.EchoRequest{Message: "forced"}, grpc.ForceCodecV2(jsonCodec{&jsonUsed}))
	if err != nil || r.Message != "forced" {
		t.Fatalf("Say with ForceCodecV2: %v, %v", r, err)
	}
	_, err = p.client.Say(ctx, &testpb.EchoRequest{}, grpc.CallContentSubtype("nosuchcodec"))
	wantCode(t, "an unknown content-subtype", err, codes.Internal)

	// A server that forces proto refuses a JSON request's bytes.
	p2 := newPair(t, anyListen, []DialOption{fallbackDial()}, ForceServerCodec(encoding.GetCodecV2("proto")))
	defer p2.close(t)
	_, err = p2.client.Say(ctx, &testpb.EchoRequest{Message: "json"}, grpc.CallContentSubtype("testjson"))
	if err == nil {
		t.Fatal("a forced proto server decoded JSON")
	}
}

// TestServeConn: a Server serves a connection the application accepted
// (ServeConn), a ClientConn calls over connections its own dialer makes
// (WithDialer) and dials again after the connection ends; ServeConn
// returns when its connection ends, and after Stop it refuses.
func TestServeConn(t *testing.T) {
	g0 := rdmatest.Goroutines()
	defer rdmatest.WaitGoroutines(t, g0)
	ln := anyListen(t)
	defer ln.Close()
	srv := NewServer()
	testpb.RegisterEchoServer(srv, newEchoServer())
	served := make(chan error, 4)
	go func() {
		for {
			c, err := ln.AcceptRDMA()
			if err != nil {
				return
			}
			go func() { served <- srv.ServeConn(c) }()
		}
	}()
	var dials atomic.Int32
	dial := func(ctx context.Context, addr string) (*rdma.Conn, error) {
		dials.Add(1)
		d := rdma.Dialer{Fallback: &rdma.Fallback{RDMATimeout: rdmatest.Scale(2 * time.Second)}}
		nc, err := d.DialContext(ctx, "rdma", addr)
		if err != nil {
			return nil, err
		}
		return nc.(*rdma.Conn), nil
	}
	cc, err := Dial(ctxT(t, 10*time.Second), ln.Addr().String(), WithDialer(dial))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := testpb.NewEchoClient(cc)
	for i := range 2 {
		r, err := client.Say(ctxT(t, 5*time.Second), &testpb.EchoRequest{Message: fmt.Sprint(i)})
		if err != nil || r.Message != fmt.Sprint(i) {
			t.Fatalf("call %d: %v, %v", i, r, err)
		}
		if i == 0 {
			// The connection ends: ServeConn returns nil, and the next call
			// dials again through the dialer.
			cc.mu.Lock()
			tr := cc.t
			cc.mu.Unlock()
			tr.close(errors.New("test: connection closed"))
			select {
			case err := <-served:
				if err != nil {
					t.Fatalf("ServeConn after its connection ended: %v", err)
				}
			case <-time.After(rdmatest.Scale(5 * time.Second)):
				t.Fatal("ServeConn did not return after its connection ended")
			}
		}
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("the dialer ran %d times, want 2", n)
	}
	srv.Stop()
	<-served // the second connection's ServeConn, ended by Stop
	c, err := dial(ctxT(t, 10*time.Second), ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case err := <-served:
		if !errors.Is(err, ErrServerStopped) {
			t.Fatalf("ServeConn after Stop: %v, want ErrServerStopped", err)
		}
	case <-time.After(rdmatest.Scale(5 * time.Second)):
		t.Fatal("ServeConn after Stop did not return")
	}
}

// goroutineID is the running goroutine's id, from its stack's first line.
func goroutineID() string {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return ""
	}
	return f[1]
}

// TestHandlerWorkers: calls one after another run on the goroutines of
// calls before them (their stacks already grown), and Stop ends the idle
// workers.
func TestHandlerWorkers(t *testing.T) {
	g0 := rdmatest.Goroutines()
	var mu sync.Mutex
	ids := map[string]int{}
	record := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		mu.Lock()
		ids[goroutineID()]++
		mu.Unlock()
		return h(ctx, req)
	}
	p := newPair(t, anyListen, []DialOption{fallbackDial()}, UnaryInterceptor(record))
	const calls = 20
	for i := range calls {
		if _, err := p.client.Say(ctxT(t, 5*time.Second), &testpb.EchoRequest{Message: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	n := len(ids)
	mu.Unlock()
	if n > calls/2 {
		t.Errorf("%d calls ran on %d goroutines: workers were not reused", calls, n)
	}
	p.close(t)
	rdmatest.WaitGoroutines(t, g0)
}
