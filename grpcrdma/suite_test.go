package grpcrdma

// The behaviour suite: each case runs on its own pair, over the transport
// the caller's listener and dial options give (TestSuiteFallback on the
// host, TestSuiteRDMA in Soft-RoCE).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/testpb"
)

type suiteCase struct {
	name string
	run  func(t *testing.T, p *pair)
	sopt []ServerOption
	dopt []DialOption
}

var suite = []suiteCase{
	{name: "Unary", run: testUnary},
	{name: "Metadata", run: testMetadata},
	{name: "Streams", run: testStreams},
	{name: "Status", run: testStatus},
	{name: "Unimplemented", run: testUnimplemented},
	{name: "Deadline", run: testDeadline},
	{name: "Cancel", run: testCancel},
	{name: "Health", run: testHealth},
	{name: "LargeMessages", run: testLargeMessages},
	{name: "Concurrent", run: testConcurrent},
	{name: "StalledStream", run: testStalledStream, sopt: []ServerOption{StreamWindow(4096)}, dopt: []DialOption{WithStreamWindow(4096)}},
	{name: "ConnWindow", run: testConnWindow, dopt: []DialOption{WithStreamWindow(4096), WithConnWindow(16384)}},
	{name: "MessageLimits", run: testMessageLimits, sopt: []ServerOption{MaxRecvMsgSize(1000)}},
	{name: "LargeMetadata", run: testLargeMetadata, dopt: []DialOption{WithMaxHeaderBlock(2048)}},
	{name: "StreamLimit", run: testStreamLimit, sopt: []ServerOption{MaxConcurrentStreams(2)}},
}

func runSuite(t *testing.T, listen listenFn, dopts []DialOption) {
	for _, c := range suite {
		t.Run(c.name, func(t *testing.T) {
			p := newPair(t, listen, append(append([]DialOption{}, dopts...), c.dopt...), c.sopt...)
			defer p.close(t)
			c.run(t, p)
		})
	}
}

func testUnary(t *testing.T, p *pair) {
	ctx := ctxT(t, 5*time.Second)
	r, err := p.client.Say(ctx, &testpb.EchoRequest{Message: "hello", Payload: []byte{1, 2, 3}})
	if err != nil || r.Message != "hello" || !bytes.Equal(r.Payload, []byte{1, 2, 3}) {
		t.Fatalf("Say: %v, %v", r, err)
	}
	r, err = p.client.Say(ctx, &testpb.EchoRequest{Message: "method"})
	if err != nil || r.Message != "/grpcrdma.test.Echo/Say" {
		t.Fatalf("grpc.Method in the handler: %v, %v", r, err)
	}
	var pr peer.Peer
	r, err = p.client.Say(ctx, &testpb.EchoRequest{Message: "peer"}, grpc.Peer(&pr))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(r.Message)
	if len(f) != 3 || f[1] != pr.LocalAddr.String() || f[2] != pr.Addr.String() || pr.Addr.String() != p.addr {
		t.Fatalf("peers: the server saw %q, the client %v -> %v (server %s)", r.Message, pr.LocalAddr, pr.Addr, p.addr)
	}
	r, err = p.client.Say(ctx, &testpb.EchoRequest{Message: "deadline"})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := time.ParseDuration(r.Message); err != nil || d <= 0 || d > rdmatest.Scale(5*time.Second) {
		t.Fatalf("the handler's deadline: %q (%v), want the caller's", r.Message, err)
	}
	r, err = p.client.Say(context.Background(), &testpb.EchoRequest{Message: "deadline"})
	if err != nil || r.Message != "none" {
		t.Fatalf("no deadline: %v, %v", r, err)
	}
	r, err = p.client.Say(ctx, &testpb.EchoRequest{})
	if err != nil || r.Message != "" {
		t.Fatalf("an empty message: %v, %v", r, err)
	}
}

func testMetadata(t *testing.T, p *pair) {
	ctx := metadata.AppendToOutgoingContext(ctxT(t, 5*time.Second), "x-echo", "a", "x-echo", "b")
	var hdr, trl metadata.MD
	if _, err := p.client.Say(ctx, &testpb.EchoRequest{Message: "meta"}, grpc.Header(&hdr), grpc.Trailer(&trl)); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(hdr.Get("x-echo"), ";"); got != "a,b" {
		t.Errorf("header x-echo %q, want the incoming a,b: %v", got, hdr)
	}
	if got := hdr.Get("h-bin"); len(got) != 1 || got[0] != "\x00\x01" {
		t.Errorf("binary header %q", got)
	}
	if got := trl.Get("t"); len(got) != 2 || got[0] != "v1" || got[1] != "v2" {
		t.Errorf("trailer t %q: %v", got, trl)
	}
	hdr, trl = nil, nil
	if _, err := p.client.Say(ctx, &testpb.EchoRequest{Message: "sendheader"}, grpc.Header(&hdr), grpc.Trailer(&trl)); err != nil {
		t.Fatal(err)
	}
	if hdr.Get("h2")[0] != "sent" || len(hdr.Get("x-echo")) != 1 || len(hdr.Get("late")) != 0 {
		t.Errorf("SendHeader's headers: %v", hdr)
	}
	// Streams: headers before the first message, trailers after the last.
	st, err := p.client.Expand(ctx, &testpb.EchoRequest{Message: "x", Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	h, err := st.Header()
	if err != nil || h.Get("x-count")[0] != "3" {
		t.Fatalf("stream Header: %v, %v", h, err)
	}
	for {
		if _, err := st.Recv(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if got := st.Trailer().Get("x-sent"); len(got) != 1 || got[0] != "3" {
		t.Errorf("stream Trailer: %v", st.Trailer())
	}
}

func testStreams(t *testing.T, p *pair) {
	ctx := ctxT(t, 10*time.Second)
	// Client streaming.
	cs, err := p.client.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"a", "b", "c"} {
		if err := cs.Send(&testpb.EchoRequest{Message: m}); err != nil {
			t.Fatal(err)
		}
	}
	r, err := cs.CloseAndRecv()
	if err != nil || r.Message != "a,b,c" || r.Index != 3 {
		t.Fatalf("Collect: %v, %v", r, err)
	}
	// The server ends the call early: Send sees io.EOF, then the status.
	cs, err = p.client.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cs.Send(&testpb.EchoRequest{Message: "abort"})
	for i := 0; ; i++ {
		if err := cs.Send(&testpb.EchoRequest{Message: "more"}); err == io.EOF {
			break
		} else if err != nil || i > 10000 {
			t.Fatalf("Send after the server's end: %v (%d sends)", err, i)
		}
		time.Sleep(time.Millisecond)
	}
	_, err = cs.CloseAndRecv()
	wantCode(t, "Collect aborted", err, codes.Aborted)

	// Server streaming.
	ss, err := p.client.Expand(ctx, &testpb.EchoRequest{Message: "e", Count: 50, Payload: make([]byte, 1000)})
	if err != nil {
		t.Fatal(err)
	}
	for i := int32(0); ; i++ {
		r, err := ss.Recv()
		if err == io.EOF {
			if i != 50 {
				t.Fatalf("Expand: %d replies, want 50", i)
			}
			break
		}
		if err != nil || r.Index != i || len(r.Payload) != 1000 {
			t.Fatalf("Expand reply %d: %v, %v", i, r, err)
		}
	}
	// Bidi, with the client reading as it writes and after CloseSend.
	bs, err := p.client.Chat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := bs.Send(&testpb.EchoRequest{Message: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			for j := i - 1; j <= i; j++ {
				r, err := bs.Recv()
				if err != nil || r.Message != fmt.Sprint(j) {
					t.Fatalf("Chat %d: %v, %v", j, r, err)
				}
			}
		}
	}
	bs.CloseSend()
	if _, err := bs.Recv(); err != io.EOF {
		t.Fatalf("Chat end: %v", err)
	}
	// Header before anything was sent: the call starts all the same.
	bs, err = p.client.Chat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := bs.Header(); done <- err }()
	if err := bs.Send(&testpb.EchoRequest{Message: "x"}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	bs.CloseSend()
	if r, err := bs.Recv(); err != nil || r.Message != "x" {
		t.Fatalf("Chat after Header: %v, %v", r, err)
	}
	if _, err := bs.Recv(); err != io.EOF {
		t.Fatal(err)
	}
}

func testStatus(t *testing.T, p *pair) {
	ctx := ctxT(t, 5*time.Second)
	var trl metadata.MD
	_, err := p.client.Say(ctx, &testpb.EchoRequest{Message: "status:5:no such thing: é"}, grpc.Trailer(&trl))
	st := wantCode(t, "Say status", err, codes.NotFound)
	if st.Message() != "no such thing: é" {
		t.Errorf("message %q", st.Message())
	}
	d := st.Details()
	if len(d) != 1 {
		t.Fatalf("details %v", d)
	}
	if r, ok := d[0].(*testpb.EchoReply); !ok || r.Message != "detail" || r.Index != 42 {
		t.Fatalf("detail %v", d[0])
	}
	for c := codes.Canceled; c <= codes.Unauthenticated; c++ {
		_, err := p.client.Say(ctx, &testpb.EchoRequest{Message: fmt.Sprintf("status:%d:m%d", c, c)})
		if st := status.Convert(err); st.Code() != c || st.Message() != fmt.Sprintf("m%d", c) {
			t.Errorf("code %v: got %v", c, err)
		}
	}
}

func testUnimplemented(t *testing.T, p *pair) {
	ctx := ctxT(t, 5*time.Second)
	var r testpb.EchoReply
	err := p.cc.Invoke(ctx, "/grpcrdma.test.Echo/Nope", &testpb.EchoRequest{}, &r)
	if st := wantCode(t, "unknown method", err, codes.Unimplemented); !strings.Contains(st.Message(), "Nope") {
		t.Errorf("message %q", st.Message())
	}
	err = p.cc.Invoke(ctx, "/no.Such/Method", &testpb.EchoRequest{}, &r)
	wantCode(t, "unknown service", err, codes.Unimplemented)
	err = p.cc.Invoke(ctx, "garbage", &testpb.EchoRequest{}, &r)
	wantCode(t, "a malformed method", err, codes.Unimplemented)
	s, err := p.cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/grpcrdma.test.Echo/NopeStream")
	if err != nil {
		t.Fatal(err)
	}
	err = s.RecvMsg(&r)
	wantCode(t, "unknown stream method", err, codes.Unimplemented)
	// The connection serves on.
	if _, err := p.client.Say(ctx, &testpb.EchoRequest{Message: "ok"}); err != nil {
		t.Fatal(err)
	}
}

func testDeadline(t *testing.T, p *pair) {
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(100*time.Millisecond))
	defer cancel()
	_, err := p.client.Say(ctx, &testpb.EchoRequest{Message: "slow", DelayMs: 60_000})
	wantCode(t, "Say past its deadline", err, codes.DeadlineExceeded)
	select {
	case e := <-p.echo.ended:
		if !errors.Is(e.err, context.DeadlineExceeded) || !e.hadDeadline {
			t.Fatalf("the handler ended with %v (deadline %v), want DeadlineExceeded", e.err, e.hadDeadline)
		}
	case <-time.After(rdmatest.Scale(5 * time.Second)):
		t.Fatal("the handler did not see its deadline")
	}
	// A stream past its deadline.
	ctx2, cancel2 := context.WithTimeout(context.Background(), rdmatest.Scale(100*time.Millisecond))
	defer cancel2()
	bs, err := p.client.Chat(ctx2)
	if err != nil {
		t.Fatal(err)
	}
	bs.Send(&testpb.EchoRequest{Message: "stall"})
	_, err = bs.Recv()
	wantCode(t, "Chat past its deadline", err, codes.DeadlineExceeded)
	// A deadline already past fails at once.
	ctx3, cancel3 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel3()
	_, err = p.client.Say(ctx3, &testpb.EchoRequest{})
	wantCode(t, "Say with a past deadline", err, codes.DeadlineExceeded)
}

func testCancel(t *testing.T, p *pair) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := p.client.Say(ctx, &testpb.EchoRequest{Message: "slow", DelayMs: 60_000})
		errc <- err
	}()
	time.Sleep(rdmatest.Scale(50 * time.Millisecond))
	cancel()
	wantCode(t, "cancelled Say", <-errc, codes.Canceled)
	select {
	case e := <-p.echo.ended:
		if !errors.Is(e.err, context.Canceled) {
			t.Fatalf("the handler ended with %v, want Canceled", e.err)
		}
	case <-time.After(rdmatest.Scale(5 * time.Second)):
		t.Fatal("the handler's context was not cancelled")
	}
	// A stream whose context is cancelled while nobody is in a call.
	ctx2, cancel2 := context.WithCancel(context.Background())
	bs, err := p.client.Chat(ctx2)
	if err != nil {
		t.Fatal(err)
	}
	if err := bs.Send(&testpb.EchoRequest{Message: "stall"}); err != nil {
		t.Fatal(err)
	}
	cancel2()
	_, err = bs.Recv()
	wantCode(t, "cancelled Chat", err, codes.Canceled)
}

func testHealth(t *testing.T, p *pair) {
	ctx := ctxT(t, 5*time.Second)
	hc := healthpb.NewHealthClient(p.cc)
	r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check: %v, %v", r, err)
	}
	p.health.SetServingStatus("echo", healthpb.HealthCheckResponse_NOT_SERVING)
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: "echo"})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Watch: %v, %v", r, err)
	}
	p.health.SetServingStatus("echo", healthpb.HealthCheckResponse_SERVING)
	if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Watch update: %v, %v", r, err)
	}
	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "unknown"})
	wantCode(t, "Check unknown", err, codes.NotFound)
}

func testLargeMessages(t *testing.T, p *pair) {
	ctx := ctxT(t, 20*time.Second)
	for _, n := range []int{32 << 10, 100 << 10, 1 << 20, 3 << 20} {
		payload := bytes.Repeat([]byte{byte(n), 1, 2, 3, 4, 5, 6}, n/7)
		r, err := p.client.Say(ctx, &testpb.EchoRequest{Payload: payload})
		if err != nil || !bytes.Equal(r.Payload, payload) {
			t.Fatalf("Say %d bytes: %v", n, err)
		}
	}
	ss, err := p.client.Expand(ctx, &testpb.EchoRequest{Count: 6, Payload: make([]byte, 1<<20)})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		r, err := ss.Recv()
		if err == io.EOF {
			break
		}
		if err != nil || len(r.Payload) != 1<<20 {
			t.Fatalf("Expand 1 MiB: %v", err)
		}
		n++
	}
	if n != 6 {
		t.Fatalf("%d replies", n)
	}
}

func testConcurrent(t *testing.T, p *pair) {
	ctx := ctxT(t, 30*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := fmt.Sprint(i)
			r, err := p.client.Say(ctx, &testpb.EchoRequest{Message: m, Payload: make([]byte, i*100)})
			if err == nil && (r.Message != m || len(r.Payload) != i*100) {
				err = fmt.Errorf("call %d got %q", i, r.Message)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// testStalledStream: a stream whose client reads nothing fills its window
// and stops its server; the other calls on the connection go on.
func testStalledStream(t *testing.T, p *pair) {
	ctx, cancel := context.WithCancel(ctxT(t, 20*time.Second))
	defer cancel()
	ss, err := p.client.Expand(ctx, &testpb.EchoRequest{Count: 1000, Payload: make([]byte, 1000)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ss.Header(); err != nil {
		t.Fatal(err)
	}
	// And one whose server reads nothing: the client's Send blocks.
	bs, err := p.client.Chat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bs.Send(&testpb.EchoRequest{Message: "stall"})
	sendDone := make(chan error, 1)
	go func() {
		for range 100 {
			if err := bs.Send(&testpb.EchoRequest{Payload: make([]byte, 1000)}); err != nil {
				sendDone <- err
				return
			}
		}
		sendDone <- nil
	}()
	time.Sleep(rdmatest.Scale(100 * time.Millisecond))
	select {
	case err := <-sendDone:
		t.Fatalf("100 KB sent into a 4 KiB window nobody reads: %v", err)
	default:
	}
	for i := range 50 {
		if _, err := p.client.Say(ctx, &testpb.EchoRequest{Message: fmt.Sprint(i), Payload: make([]byte, 2000)}); err != nil {
			t.Fatalf("call %d beside stalled streams: %v", i, err)
		}
	}
	// What the connection holds for the stalled server stream is its window.
	p.cc.mu.Lock()
	tr := p.cc.t
	p.cc.mu.Unlock()
	tr.mu.Lock()
	var unread int64
	for _, s := range tr.streams {
		s.mu.Lock()
		unread += s.recv.Unread()
		s.mu.Unlock()
	}
	tr.mu.Unlock()
	if unread > 4096+1100 {
		t.Errorf("the client holds %d bytes unread, above the window", unread)
	}
	// Reading resumes both.
	p.echoRelease()
	chatDone := make(chan error, 1)
	go func() {
		for {
			if _, err := bs.Recv(); err != nil {
				chatDone <- err
				return
			}
		}
	}()
	for i := 0; ; i++ {
		if _, err := ss.Recv(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("Expand after the stall: %v (reply %d)", err, i)
		}
	}
	if err := <-sendDone; err != nil {
		t.Fatalf("Chat's sends: %v (Recv: %v)", err, <-chatDone)
	}
	bs.CloseSend()
	if err := <-chatDone; err != io.EOF {
		t.Fatalf("Chat: %v", err)
	}
}

func testMessageLimits(t *testing.T, p *pair) {
	ctx := ctxT(t, 5*time.Second)
	// The server takes at most 1000 bytes.
	_, err := p.client.Say(ctx, &testpb.EchoRequest{Payload: make([]byte, 2000)})
	wantCode(t, "a request above the server's limit", err, codes.ResourceExhausted)
	// The caller takes at most 100.
	_, err = p.client.Say(ctx, &testpb.EchoRequest{Payload: make([]byte, 500)}, grpc.MaxCallRecvMsgSize(100))
	wantCode(t, "a reply above the caller's limit", err, codes.ResourceExhausted)
	_, err = p.client.Say(ctx, &testpb.EchoRequest{Payload: make([]byte, 500)}, grpc.MaxCallSendMsgSize(100))
	wantCode(t, "a request above the caller's send limit", err, codes.ResourceExhausted)
	_, err = p.client.Say(ctx, &testpb.EchoRequest{}, grpc.PerRPCCredentials(nil))
	wantCode(t, "per-RPC credentials", err, codes.Unimplemented)
	if _, err := p.client.Say(ctx, &testpb.EchoRequest{Payload: make([]byte, 500)}); err != nil {
		t.Fatalf("within the limits: %v", err)
	}
}

// testLargeMetadata: metadata above what the peer accepts fails the call
// (ResourceExhausted on the request side, Internal for a response's),
// and the connection serves on.
func testLargeMetadata(t *testing.T, p *pair) {
	ctx := ctxT(t, 5*time.Second)
	big := strings.Repeat("x", DefaultMaxHeaderBlock)
	_, err := p.client.Say(metadata.AppendToOutgoingContext(ctx, "big", big), &testpb.EchoRequest{})
	wantCode(t, "request metadata above the server's limit", err, codes.ResourceExhausted)
	k := strings.Repeat("k", 1100)
	_, err = p.client.Say(metadata.AppendToOutgoingContext(ctx, "x-echo", k, "x-echo", k), &testpb.EchoRequest{Message: "meta"})
	wantCode(t, "response metadata above the client's limit", err, codes.Internal)
	_, err = p.client.Say(metadata.AppendToOutgoingContext(ctx, "Mixed-Case", "1", "bad key", "2"), &testpb.EchoRequest{})
	if err != nil {
		t.Fatalf("keys to lower-case or leave out: %v", err)
	}
	if _, err := p.client.Say(ctx, &testpb.EchoRequest{Message: "ok"}); err != nil {
		t.Fatal(err)
	}
}

// testStreamLimit: with a server running two calls at once, ten concurrent
// slow calls all succeed: the client waits for a free slot.
func testStreamLimit(t *testing.T, p *pair) {
	ctx := ctxT(t, 20*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := p.client.Say(ctx, &testpb.EchoRequest{Message: fmt.Sprint(i), DelayMs: 20}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// testConnWindow: server streams whose client reads nothing fill their
// stream windows until together they fill the connection window; past it
// the connection holds no more (max(C, C/2 + a message)) and every
// response waits, and reading the stalled streams lets all go on.
func testConnWindow(t *testing.T, p *pair) {
	const streams, window, connWindow, msg = 8, 4096, 16384, 1000
	ctx, cancel := context.WithCancel(ctxT(t, 20*time.Second))
	defer cancel()
	var stalled []testpb.Echo_ExpandClient
	for range streams {
		ss, err := p.client.Expand(ctx, &testpb.EchoRequest{Count: 20, Payload: make([]byte, msg)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ss.Header(); err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, ss)
	}
	p.cc.mu.Lock()
	tr := p.cc.t
	p.cc.mu.Unlock()
	connUnread := func() int64 {
		tr.recvMu.Lock()
		defer tr.recvMu.Unlock()
		return tr.connRecv.Unread()
	}
	// The servers fill the window, then stop: wait for it to stay still.
	var last int64 = -1
	for deadline := time.Now().Add(rdmatest.Scale(5 * time.Second)); ; {
		time.Sleep(rdmatest.Scale(50 * time.Millisecond))
		u := connUnread()
		if u == last && u > connWindow/2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client's unread bytes never settled above half the connection window (%d)", u)
		}
		last = u
	}
	if u := connUnread(); u > connWindow {
		t.Fatalf("the client holds %d bytes unread, above the connection window %d", u, connWindow)
	}
	if streams*window <= connWindow {
		t.Fatal("the stream windows alone would bound this; the case tests nothing")
	}
	// A response larger than what is left waits for the window.
	short, cancelShort := context.WithTimeout(ctx, rdmatest.Scale(300*time.Millisecond))
	_, err := p.client.Say(short, &testpb.EchoRequest{Payload: make([]byte, 2*msg)})
	cancelShort()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a call beside streams holding the connection window: %v, want DeadlineExceeded", err)
	}
	// Reading the stalled streams lets everything go on.
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for _, ss := range stalled {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if _, err := ss.Recv(); err == io.EOF {
					return
				} else if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	if _, err := p.client.Say(ctx, &testpb.EchoRequest{Payload: make([]byte, 2*msg)}); err != nil {
		t.Fatalf("a call once the stalled streams read: %v", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a stalled stream after reading resumed: %v", err)
	}
	if u := connUnread(); u != 0 {
		t.Fatalf("%d bytes still counted unread after every stream was read", u)
	}
}
