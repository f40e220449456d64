// Command grpcrdma shows the migration path from grpc-go to grpcrdma (gRPC
// over RDMA messages, without HTTP/2): one implementation of gRPC's
// generated health service, served both ways at once from one process,
// grpc-go on a TCP port for ordinary clients and grpcrdma on an RDMA
// listener for RDMA clients. Both clients run the same code, the generated
// client over a grpc.ClientConnInterface, which *grpc.ClientConn and
// *grpcrdma.ClientConn both implement: unary Check calls, then a Watch
// stream that sees a status change.
//
//	grpcrdma -listen 192.168.1.10:7473 -listen-tcp 192.168.1.10:7474   # server, both ways
//	grpcrdma -connect 192.168.1.10:7473 -calls 1000                     # client over RDMA (grpcrdma)
//	grpcrdma -connect-tcp 192.168.1.10:7474 -calls 1000                 # client over TCP (grpc-go)
//
// A server takes either listen flag or both, a client either connect flag
// or both. With none of them it runs both servers and both clients in one
// process on -addr (default $RDMA_TEST_ADDR, which scripts/softroce sets),
// stops both servers gracefully and exits 0 if every answer was right.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/grpcrdma"
)

func main() {
	listen := flag.String("listen", "", "serve grpcrdma on this RDMA address (host:port)")
	listenTCP := flag.String("listen-tcp", "", "serve grpc-go on this TCP address (host:port)")
	connect := flag.String("connect", "", "call a grpcrdma server at this RDMA address (host:port)")
	connectTCP := flag.String("connect-tcp", "", "call a grpc-go server at this TCP address (host:port)")
	addr := flag.String("addr", os.Getenv("RDMA_TEST_ADDR"), "IP of an RDMA netdev, for the all-in-one mode")
	calls := flag.Int("calls", 500, "unary Check calls per client")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("grpcrdma example: ")
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	defer cancel()

	var err error
	switch {
	case *calls < 1:
		err = errors.New("-calls must be at least 1")
	case *listen != "" || *listenTCP != "":
		err = serve(ctx, *listen, *listenTCP)
	case *connect != "" || *connectTCP != "":
		err = callBoth(ctx, *connect, *connectTCP, *calls)
	case *addr == "":
		err = errors.New("no address: give -listen, -listen-tcp, -connect, -connect-tcp, or -addr (an IP of an RDMA netdev; `rdma link show` lists them)")
	default:
		var s summary
		if s, err = run(ctx, *addr, *calls, nil); err == nil {
			fmt.Printf("grpcrdma: %v\ngrpc-go: %v\nboth servers stopped gracefully in %v\nok\n",
				s.rdma, s.tcp, s.stopped.Round(time.Millisecond))
		}
	}
	if err != nil {
		log.Fatal(err)
	}
}

// servers are the two servers of one health service implementation.
type servers struct {
	health *health.Server
	grpc   *grpc.Server     // grpc-go: HTTP/2 over TCP
	rdma   *grpcrdma.Server // grpcrdma: gRPC over RDMA messages
}

func newServers() *servers {
	s := &servers{health: health.NewServer(), grpc: grpc.NewServer(), rdma: grpcrdma.NewServer()}
	s.health.SetServingStatus("example", healthpb.HealthCheckResponse_SERVING)
	// The generated registration, unchanged, on both: grpcrdma.Server is a
	// grpc.ServiceRegistrar too.
	healthpb.RegisterHealthServer(s.grpc, s.health)
	healthpb.RegisterHealthServer(s.rdma, s.health)
	return s
}

// start serves grpcrdma on rl and grpc-go on tl, each if not nil; the
// channel gets each Serve's result.
func (s *servers) start(rl *rdma.Listener, tl net.Listener) <-chan error {
	served := make(chan error, 2)
	if rl != nil {
		go func() { served <- s.rdma.Serve(rl) }()
	}
	if tl != nil {
		go func() { served <- s.grpc.Serve(tl) }()
	}
	return served
}

// stop stops both servers gracefully: each refuses new calls, lets those
// in flight end and returns when they have.
func (s *servers) stop() {
	s.rdma.GracefulStop()
	s.grpc.GracefulStop()
}

// serve serves on the addresses given until ctx ends (an interrupt) or a
// server fails.
func serve(ctx context.Context, rdmaAddr, tcpAddr string) error {
	var rl *rdma.Listener
	var tl net.Listener
	var err error
	if rdmaAddr != "" {
		if rl, err = rdma.Listen("rdma", rdmaAddr); err != nil {
			return err
		}
		log.Printf("serving grpc.health.v1.Health with grpcrdma on %s", rl.Addr())
	}
	if tcpAddr != "" {
		if tl, err = net.Listen("tcp", tcpAddr); err != nil {
			if rl != nil {
				rl.Close()
			}
			return err
		}
		log.Printf("serving grpc.health.v1.Health with grpc-go on %s", tl.Addr())
	}
	s := newServers()
	served := s.start(rl, tl)
	go flip(ctx, s.health)
	log.Print("interrupt to stop")
	select {
	case <-ctx.Done():
	case err = <-served:
		err = fmt.Errorf("serve: %w", err)
	}
	s.stop()
	return err
}

// flip toggles the "example" service's status every second, for Watch.
func flip(ctx context.Context, hs *health.Server) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			hs.SetServingStatus("example", st)
			st ^= healthpb.HealthCheckResponse_SERVING ^ healthpb.HealthCheckResponse_NOT_SERVING
		}
	}
}

// callBoth calls a grpcrdma server at rdmaAddr and a grpc-go one at
// tcpAddr, each if given.
func callBoth(ctx context.Context, rdmaAddr, tcpAddr string, calls int) error {
	if rdmaAddr != "" {
		a, err := callRDMA(ctx, rdmaAddr, calls, nil)
		if err != nil {
			return fmt.Errorf("grpcrdma: %w", err)
		}
		fmt.Printf("grpcrdma: %v\n", a)
	}
	if tcpAddr != "" {
		a, err := callTCP(ctx, tcpAddr, calls, nil)
		if err != nil {
			return fmt.Errorf("grpc-go: %w", err)
		}
		fmt.Printf("grpc-go: %v\n", a)
	}
	return nil
}

// summary is what the all-in-one mode saw.
type summary struct {
	rdma, tcp answers       // through grpcrdma and through grpc-go
	stopped   time.Duration // how long stopping both servers took
}

// run is the all-in-one mode: it serves both ways on ip, makes the calls
// through both clients, then stops both servers gracefully. fb, if not
// nil, lets grpcrdma's side fall back to TCP (for hosts with no RDMA
// device); the example itself passes nil.
func run(ctx context.Context, ip string, calls int, fb *rdma.Fallback) (summary, error) {
	lc := rdma.ListenConfig{Fallback: fb}
	rl, err := lc.Listen(ctx, "rdma", net.JoinHostPort(ip, "0"))
	if err != nil {
		return summary{}, err
	}
	tl, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		rl.Close()
		return summary{}, err
	}
	s := newServers()
	served := s.start(rl, tl)

	var sum summary
	var opts []grpcrdma.DialOption
	if fb != nil {
		opts = append(opts, grpcrdma.WithFallback(*fb))
	}
	sum.rdma, err = callRDMA(ctx, rl.Addr().String(), calls, s.health, opts...)
	if err != nil {
		err = fmt.Errorf("grpcrdma: %w", err)
	} else if sum.tcp, err = callTCP(ctx, tl.Addr().String(), calls, s.health); err != nil {
		err = fmt.Errorf("grpc-go: %w", err)
	}

	start := time.Now()
	s.stop()
	sum.stopped = time.Since(start)
	for range 2 {
		if serr := <-served; err == nil && serr != nil {
			err = fmt.Errorf("serve: %w", serr)
		}
	}
	return sum, err
}

// callRDMA dials a grpcrdma server and makes the calls through it.
func callRDMA(ctx context.Context, addr string, calls int, hs *health.Server, opts ...grpcrdma.DialOption) (answers, error) {
	cc, err := grpcrdma.Dial(ctx, addr, opts...)
	if err != nil {
		return answers{}, err
	}
	defer cc.Close()
	return exercise(ctx, cc, calls, hs)
}

// callTCP connects to a grpc-go server over TCP, without TLS, and makes
// the same calls through it.
func callTCP(ctx context.Context, addr string, calls int, hs *health.Server) (answers, error) {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return answers{}, err
	}
	defer cc.Close()
	return exercise(ctx, cc, calls, hs)
}

// answers are what one client got right.
type answers struct {
	checks  int                                          // Check calls answered SERVING
	median  time.Duration                                // their median round trip
	watched []healthpb.HealthCheckResponse_ServingStatus // the statuses Watch reported
	network string                                       // the network the calls went over: "rdma" or "tcp"
}

func (a answers) String() string {
	return fmt.Sprintf("%d Check calls over %s (median %v), Watch: %v", a.checks, a.network, a.median, a.watched)
}

// Generated clients take a grpc.ClientConnInterface, and generated
// registrations a grpc.ServiceRegistrar: grpc-go's and grpcrdma's types are
// both.
var (
	_ grpc.ClientConnInterface = (*grpc.ClientConn)(nil)
	_ grpc.ClientConnInterface = (*grpcrdma.ClientConn)(nil)
	_ grpc.ServiceRegistrar    = (*grpc.Server)(nil)
	_ grpc.ServiceRegistrar    = (*grpcrdma.Server)(nil)
)

// exercise makes the calls through the generated client on cc, whichever
// transport is under it: calls unary Check calls, then a Watch stream on
// the "example" service until it reports a change. hs, if set, is the
// server's health state, which exercise changes itself; otherwise the
// server must change it (as -listen's does every second). Any wrong answer
// is an error.
func exercise(ctx context.Context, cc grpc.ClientConnInterface, calls int, hs *health.Server) (answers, error) {
	hc := healthpb.NewHealthClient(cc) // the generated client, unchanged
	var a answers
	var p peer.Peer
	rtts := make([]time.Duration, 0, calls)
	for i := range calls {
		start := time.Now()
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
		if err != nil {
			return a, fmt.Errorf("call %d of Check: %w", i, err)
		}
		if r.Status != healthpb.HealthCheckResponse_SERVING {
			return a, fmt.Errorf("call %d of Check: status %v, want SERVING", i, r.Status)
		}
		rtts = append(rtts, time.Since(start))
		a.checks++
	}
	if calls > 0 {
		slices.Sort(rtts)
		a.median = rtts[calls/2]
	}
	if p.Addr != nil {
		a.network = p.Addr.Network()
	}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream, which Watch never does itself
	w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{Service: "example"})
	if err != nil {
		return a, err
	}
	first, err := w.Recv()
	if err != nil {
		return a, fmt.Errorf("watching: %w", err)
	}
	a.watched = append(a.watched, first.Status)
	want := healthpb.HealthCheckResponse_NOT_SERVING
	if first.Status == want {
		want = healthpb.HealthCheckResponse_SERVING
	}
	if hs != nil {
		hs.SetServingStatus("example", want)
	}
	next, err := w.Recv()
	if err != nil {
		return a, fmt.Errorf("watching: %w", err)
	}
	a.watched = append(a.watched, next.Status)
	if next.Status != want {
		return a, fmt.Errorf("watching: %v after %v, want %v", next.Status, first.Status, want)
	}
	return a, nil
}
