//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/grpcrdma"
	"github.com/verbline/rdma/internal/testpb"
)

// The gRPC cases (-grpc): one generated service (internal/testpb's Echo)
// served and called three ways over the connection the harness made:
// grpcrdma over the message view (ours), grpc-go over the rdma.Conn as a
// net.Conn (a comparison column, "peer"), and grpc-go over TCP (the same
// case run over TCP: the metric's tcp column). The raw message view's
// stream of the same messages is the ceiling of the stream metric.
func init() {
	register(Case{Name: "grpcrdma-unary", Metric: GRPCUnary, Run: grpcUnary(grpcrdmaSide)})
	register(Case{Name: "grpc-go-unary", Metric: GRPCUnary, Run: grpcUnary(grpcGoSide), TCP: true, Peer: true})
	register(Case{Name: "grpcrdma-callers", Metric: GRPCCallers, Run: grpcCallers(grpcrdmaSide)})
	register(Case{Name: "grpc-go-callers", Metric: GRPCCallers, Run: grpcCallers(grpcGoSide), TCP: true, Peer: true})
	register(Case{Name: "grpcrdma-stream", Metric: GRPCStream, Run: grpcStream(grpcrdmaSide)})
	register(Case{Name: "grpc-go-stream", Metric: GRPCStream, Run: grpcStream(grpcGoSide), TCP: true, Peer: true})
	register(Case{Name: "msg-stream-ceiling", Metric: GRPCStream, Run: msgStream, Peer: true})
}

// grpcCallersN is how many goroutines call at once in the callers metric.
const grpcCallersN = 16

// A grpcSide serves the Echo service on the server's connection until the
// client has closed its end, or returns a client over the client's.
type grpcSide func(s *Side) (grpc.ClientConnInterface, func(), error)

// grpcrdmaSide: grpcrdma's Server.ServeConn and a ClientConn whose dialer
// hands over the harness's connection once.
func grpcrdmaSide(s *Side) (grpc.ClientConnInterface, func(), error) {
	c, err := rdmaConn(s)
	if err != nil {
		return nil, nil, err
	}
	// RDMABENCH_GRPC_WINDOW sets grpcrdma's stream window on both sides
	// (bytes; default the package's), to compare windows.
	window, _ := strconv.Atoi(os.Getenv("RDMABENCH_GRPC_WINDOW"))
	if s.Server {
		var opts []grpcrdma.ServerOption
		if window > 0 {
			opts = append(opts, grpcrdma.StreamWindow(window))
		}
		srv := grpcrdma.NewServer(opts...)
		testpb.RegisterEchoServer(srv, benchEcho{})
		return nil, nil, srv.ServeConn(c)
	}
	var used atomic.Bool
	opts := []grpcrdma.DialOption{grpcrdma.WithDialer(
		func(context.Context, string) (*rdma.Conn, error) {
			if used.Swap(true) {
				return nil, errors.New("the benchmark's connection is gone")
			}
			return c, nil
		})}
	if window > 0 {
		opts = append(opts, grpcrdma.WithStreamWindow(window))
	}
	cc, err := grpcrdma.Dial(context.Background(), c.RemoteAddr().String(), opts...)
	if err != nil {
		return nil, nil, err
	}
	return cc, func() { cc.Close() }, nil
}

// grpcGoSide: grpc-go's server and client over the connection as a
// net.Conn, HTTP/2 and all, as a service that drops the library in gets.
func grpcGoSide(s *Side) (grpc.ClientConnInterface, func(), error) {
	conn := &heldConn{Conn: s.Conn, closed: make(chan struct{})}
	if s.Server {
		srv := grpc.NewServer()
		testpb.RegisterEchoServer(srv, benchEcho{})
		ln := &oneConnListener{conn: conn, done: make(chan struct{})}
		go srv.Serve(ln)
		<-conn.closed // grpc-go closes it when the client has gone
		srv.Stop()
		return nil, nil, nil
	}
	var used atomic.Bool
	cc, err := grpc.NewClient("passthrough:///bench",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) {
			if used.Swap(true) {
				return nil, errors.New("the benchmark's connection is gone")
			}
			return conn, nil
		}))
	if err != nil {
		return nil, nil, err
	}
	return cc, func() { cc.Close() }, nil
}

// heldConn is the harness's connection lent to grpc-go: its Close only
// says grpc-go is done with it; the harness closes the connection.
type heldConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *heldConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

// oneConnListener accepts conn once, then waits until closed.
type oneConnListener struct {
	conn net.Conn
	used atomic.Bool
	once sync.Once
	done chan struct{}
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	if !l.used.Swap(true) {
		return l.conn, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return l.conn.LocalAddr() }

// benchEcho is the benchmark's Echo service: Say returns the request's
// payload; Chat answers each request with an empty reply (its index).
type benchEcho struct {
	testpb.UnimplementedEchoServer
}

func (benchEcho) Say(_ context.Context, req *testpb.EchoRequest) (*testpb.EchoReply, error) {
	return &testpb.EchoReply{Payload: req.Payload}, nil
}

func (benchEcho) Chat(stream testpb.Echo_ChatServer) error {
	for i := int32(0); ; i++ {
		if _, err := stream.Recv(); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		if err := stream.Send(&testpb.EchoReply{Index: i}); err != nil {
			return err
		}
	}
}

// grpcClient is the client side's set-up: the server side serves and
// returns nil.
func grpcClient(s *Side, side grpcSide) (testpb.EchoClient, func(), error) {
	cc, closeCC, err := side(s)
	if err != nil || s.Server {
		return nil, nil, err
	}
	return testpb.NewEchoClient(cc), closeCC, nil
}

// grpcUnary: Iters unary calls one after another, each Size bytes each
// way; the value is a call's round trip.
func grpcUnary(side grpcSide) func(s *Side) (*Sample, error) {
	return func(s *Side) (*Sample, error) {
		client, closeCC, err := grpcClient(s, side)
		if err != nil || s.Server {
			return nil, err
		}
		defer closeCC()
		req := &testpb.EchoRequest{Payload: pattern(s.Size)}
		ctx := context.Background()
		times := make([]time.Duration, 0, s.Iters)
		for i := range s.Warmup + s.Iters {
			start := time.Now()
			r, err := client.Say(ctx, req)
			if err != nil {
				return nil, fmt.Errorf("call %d: %w", i, err)
			}
			if len(r.Payload) != s.Size {
				return nil, fmt.Errorf("call %d: a reply of %d bytes, want %d", i, len(r.Payload), s.Size)
			}
			if i >= s.Warmup {
				times = append(times, time.Since(start))
			}
		}
		return durationSample(times, 1), nil
	}
}

// grpcCallers: grpcCallersN goroutines share Iters unary calls of Size
// bytes over the one connection; the value is calls per second.
func grpcCallers(side grpcSide) func(s *Side) (*Sample, error) {
	return func(s *Side) (*Sample, error) {
		client, closeCC, err := grpcClient(s, side)
		if err != nil || s.Server {
			return nil, err
		}
		defer closeCC()
		req := &testpb.EchoRequest{Payload: pattern(s.Size)}
		ctx := context.Background()
		for range grpcCallersN { // connection and first-call set-up, untimed
			if _, err := client.Say(ctx, req); err != nil {
				return nil, err
			}
		}
		var next atomic.Int64
		errs := make(chan error, grpcCallersN)
		start := time.Now()
		for range grpcCallersN {
			go func() {
				for next.Add(1) <= int64(s.Iters) {
					if _, err := client.Say(ctx, req); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		for range grpcCallersN {
			if err := <-errs; err != nil {
				return nil, err
			}
		}
		return &Sample{Value: float64(s.Iters) / time.Since(start).Seconds()}, nil
	}
}

// grpcStream: one bidirectional stream; the client sends Iters messages
// of Size bytes as fast as flow control lets it, the server answers each
// with an empty reply; the value is the request bytes over the time until
// the last reply, in MB/s.
func grpcStream(side grpcSide) func(s *Side) (*Sample, error) {
	return func(s *Side) (*Sample, error) {
		client, closeCC, err := grpcClient(s, side)
		if err != nil || s.Server {
			return nil, err
		}
		defer closeCC()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		stream, err := client.Chat(ctx)
		if err != nil {
			return nil, err
		}
		req := &testpb.EchoRequest{Payload: pattern(s.Size)}
		// One message, answered, before the clock starts: the stream is set up.
		if err := stream.Send(req); err != nil {
			return nil, err
		}
		if _, err := stream.Recv(); err != nil {
			return nil, err
		}
		replies := make(chan error, 1)
		go func() {
			for i := range s.Iters {
				if _, err := stream.Recv(); err != nil {
					replies <- fmt.Errorf("reply %d: %w", i, err)
					return
				}
			}
			replies <- nil
		}()
		start := time.Now()
		for i := range s.Iters {
			if err := stream.Send(req); err != nil {
				return nil, fmt.Errorf("message %d: %w", i, err)
			}
		}
		if err := <-replies; err != nil {
			return nil, err
		}
		el := time.Since(start)
		stream.CloseSend()
		return &Sample{Value: float64(s.Iters) * float64(s.Size) / el.Seconds() / 1e6}, nil
	}
}
