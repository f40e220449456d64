package grpcrdma

// The Echo service the tests serve, and the harness that connects a
// client to it: over TCP-backed connections of a Fallback listener on the
// host (fallbackPair), over RDMA in Soft-RoCE (rdmaPair, in
// grpcrdma_rdma_test.go).

import (
	"context"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/testpb"
)

type echoServer struct {
	testpb.UnimplementedEchoServer
	// ended receives each Say handler's context error when it returns
	// early (cancelled or past its deadline), with whether it had a deadline.
	ended chan handlerEnd
	// stalled is closed to release Chat streams that stall.
	stalled chan struct{}
}

type handlerEnd struct {
	err         error
	hadDeadline bool
}

func newEchoServer() *echoServer {
	return &echoServer{ended: make(chan handlerEnd, 16), stalled: make(chan struct{})}
}

// Say echoes the request. Messages with a meaning:
//
//	"method", "peer", "deadline"  the reply says grpc.Method, the peer's
//	                              address, the time left (or "none")
//	"status:CODE:MSG"             fails with that status, with a detail
//	"meta"                        sets headers and trailers, and echoes the
//	                              incoming "x-echo" into header "x-echo"
//	"sendheader"                  sends the headers before answering
func (e *echoServer) Say(ctx context.Context, req *testpb.EchoRequest) (*testpb.EchoReply, error) {
	if req.DelayMs > 0 {
		_, hasDL := ctx.Deadline()
		select {
		case <-time.After(time.Duration(req.DelayMs) * time.Millisecond):
		case <-ctx.Done():
			e.ended <- handlerEnd{ctx.Err(), hasDL}
			return nil, ctx.Err()
		}
	}
	reply := &testpb.EchoReply{Message: req.Message, Payload: req.Payload}
	switch m := req.Message; {
	case m == "method":
		reply.Message, _ = grpc.Method(ctx)
	case m == "peer":
		p, ok := peer.FromContext(ctx)
		if !ok {
			return nil, status.Error(codes.Internal, "no peer")
		}
		reply.Message = p.Addr.Network() + " " + p.Addr.String() + " " + p.LocalAddr.String()
	case m == "deadline":
		reply.Message = "none"
		if dl, ok := ctx.Deadline(); ok {
			reply.Message = time.Until(dl).String()
		}
	case strings.HasPrefix(m, "status:"):
		f := strings.SplitN(m, ":", 3)
		c, _ := strconv.Atoi(f[1])
		st, err := status.New(codes.Code(c), f[2]).WithDetails(&testpb.EchoReply{Message: "detail", Index: 42})
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	case m == "meta" || m == "sendheader":
		md, _ := metadata.FromIncomingContext(ctx)
		if err := grpc.SetHeader(ctx, metadata.Pairs("x-echo", strings.Join(md.Get("x-echo"), ","), "h-bin", "\x00\x01")); err != nil {
			return nil, err
		}
		if m == "sendheader" {
			if err := grpc.SendHeader(ctx, metadata.Pairs("h2", "sent")); err != nil {
				return nil, err
			}
			if err := grpc.SetHeader(ctx, metadata.Pairs("late", "x")); err == nil {
				return nil, status.Error(codes.Internal, "SetHeader after SendHeader succeeded")
			}
		}
		if err := grpc.SetTrailer(ctx, metadata.Pairs("t", "v1", "t", "v2")); err != nil {
			return nil, err
		}
	}
	return reply, nil
}

// Collect joins the messages of the stream; Index is their count.
func (e *echoServer) Collect(stream testpb.Echo_CollectServer) error {
	var msgs []string
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return stream.SendAndClose(&testpb.EchoReply{Message: strings.Join(msgs, ","), Index: int32(len(msgs))})
		}
		if err != nil {
			return err
		}
		if req.Message == "abort" {
			return status.Error(codes.Aborted, "asked to")
		}
		msgs = append(msgs, req.Message)
	}
}

// Expand sends Count replies carrying the payload, DelayMs apart.
func (e *echoServer) Expand(req *testpb.EchoRequest, stream testpb.Echo_ExpandServer) error {
	if err := stream.SendHeader(metadata.Pairs("x-count", strconv.Itoa(int(req.Count)))); err != nil {
		return err
	}
	for i := range req.Count {
		if req.DelayMs > 0 {
			time.Sleep(time.Duration(req.DelayMs) * time.Millisecond)
		}
		if err := stream.Send(&testpb.EchoReply{Message: req.Message, Payload: req.Payload, Index: i}); err != nil {
			return err
		}
	}
	stream.SetTrailer(metadata.Pairs("x-sent", strconv.Itoa(int(req.Count))))
	return nil
}

// Chat answers each message; "stall" makes it wait for e.stalled (or its
// context) before going on.
func (e *echoServer) Chat(stream testpb.Echo_ChatServer) error {
	for i := int32(0); ; i++ {
		req, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if req.Message == "stall" {
			select {
			case <-e.stalled:
			case <-stream.Context().Done():
				return stream.Context().Err()
			}
		}
		if err := stream.Send(&testpb.EchoReply{Message: req.Message, Payload: req.Payload, Index: i}); err != nil {
			return err
		}
	}
}

// pair is a server and a client connected to it.
type pair struct {
	srv    *Server
	echo   *echoServer
	health *health.Server
	cc     *ClientConn
	addr   string
	served chan error
	client testpb.EchoClient
}

// listenFn makes the listener a test serves on.
type listenFn func(t testing.TB) *rdma.Listener

// fallbackListen listens with Fallback on 127.0.0.1:0: without an RDMA
// device (the host) every connection is TCP-backed, and in the Soft-RoCE
// guest too, since rdma_cm cannot route to 127.0.0.1.
func fallbackListen(t testing.TB) *rdma.Listener {
	lc := rdma.ListenConfig{Fallback: &rdma.Fallback{}}
	ln, err := lc.Listen(context.Background(), "rdma", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// anyListen listens over RDMA where the tests have a device (inside
// Soft-RoCE) and with Fallback on 127.0.0.1 elsewhere: the tests that use it
// run over RDMA in the guest and over TCP on the host.
func anyListen(t testing.TB) *rdma.Listener {
	if a := os.Getenv("RDMA_TEST_ADDR"); a != "" && os.Getenv("RDMA_TEST_DEVICE") != "" {
		ln, err := rdma.Listen("rdma", net.JoinHostPort(a, "0"))
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	return fallbackListen(t)
}

// hostOnly reports whether t runs inside Soft-RoCE, where its RDMA twin
// covers it: the host's run (make unit, with -race) is the TCP fallback's.
// It returns without skipping, as make test counts skips as failures.
func hostOnly(t *testing.T) bool {
	if os.Getenv("RDMA_TEST_DEVICE") != "" {
		t.Log("covered inside Soft-RoCE by its RDMA variant; runs on the host")
		return true
	}
	return false
}

func fallbackDial() DialOption {
	return WithFallback(rdma.Fallback{RDMATimeout: rdmatest.Scale(2 * time.Second)})
}

// startServer serves Echo and Health on a listener from listen.
func startServer(t testing.TB, ln *rdma.Listener, sopts ...ServerOption) *pair {
	t.Helper()
	p := &pair{srv: NewServer(sopts...), echo: newEchoServer(), health: health.NewServer(), served: make(chan error, 1)}
	testpb.RegisterEchoServer(p.srv, p.echo)
	healthpb.RegisterHealthServer(p.srv, p.health)
	p.addr = ln.Addr().String()
	go func() { p.served <- p.srv.Serve(ln) }()
	return p
}

// newPair serves on a listener from listen and dials it.
func newPair(t testing.TB, listen listenFn, dopts []DialOption, sopts ...ServerOption) *pair {
	t.Helper()
	p := startServer(t, listen(t), sopts...)
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(10*time.Second))
	defer cancel()
	cc, err := Dial(ctx, p.addr, dopts...)
	if err != nil {
		p.srv.Stop()
		t.Fatal(err)
	}
	p.cc = cc
	p.client = testpb.NewEchoClient(cc)
	return p
}

// close ends the pair and checks Serve's result.
func (p *pair) close(t testing.TB) {
	t.Helper()
	p.echoRelease()
	if p.cc != nil {
		p.cc.Close()
	}
	p.srv.Stop()
	if err := <-p.served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

func (p *pair) echoRelease() {
	select {
	case <-p.echo.stalled:
	default:
		close(p.echo.stalled)
	}
}

// ctxT returns a context bounded by a scaled timeout.
func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(d))
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t testing.TB, what string, err error, c codes.Code) *status.Status {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != c {
		t.Fatalf("%s: %v (%T), want code %v", what, err, err, c)
	}
	return st
}
