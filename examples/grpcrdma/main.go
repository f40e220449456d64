// Command grpcrdma serves gRPC's generated health service with grpcrdma
// (gRPC over the message view, without HTTP/2) and calls it through the
// generated client: unary Check calls, then a Watch stream that sees a
// status change.
//
//	grpcrdma -listen 192.168.1.10:7473                 # server
//	grpcrdma -connect 192.168.1.10:7473 -calls 1000    # client
//
// With neither flag it runs both in one process on -addr (default
// $RDMA_TEST_ADDR, which scripts/softroce sets), stops the server gracefully
// and exits 0 if every answer was right.
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

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/grpcrdma"
)

func main() {
	listen := flag.String("listen", "", "serve on this address (host:port)")
	connect := flag.String("connect", "", "call a server at this address (host:port)")
	addr := flag.String("addr", os.Getenv("RDMA_TEST_ADDR"), "IP of an RDMA netdev, for the all-in-one mode")
	calls := flag.Int("calls", 500, "unary Check calls")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("grpcrdma example: ")

	switch {
	case *listen != "":
		ln, err := rdma.Listen("rdma", *listen)
		if err != nil {
			log.Fatal(err)
		}
		srv, hs := newServer()
		go func() {
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, os.Interrupt)
			<-sig
			srv.GracefulStop()
		}()
		go flip(hs)
		log.Printf("serving grpc.health.v1.Health on %s (interrupt to stop)", ln.Addr())
		if err := srv.Serve(ln); err != nil {
			log.Fatal(err)
		}
	case *connect != "":
		if err := client(*connect, *calls, nil); err != nil {
			log.Fatal(err)
		}
	default:
		if *addr == "" {
			log.Fatal(errors.New("no address: give -listen, -connect, or -addr (an IP of an RDMA netdev; `rdma link show` lists them)"))
		}
		if err := allInOne(*addr, *calls); err != nil {
			log.Fatal(err)
		}
		fmt.Println("ok")
	}
}

// newServer returns a grpcrdma server with the health service registered.
func newServer() (*grpcrdma.Server, *health.Server) {
	srv := grpcrdma.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("example", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs) // the generated registration, unchanged
	return srv, hs
}

// flip toggles the "example" service's status every second, for Watch.
func flip(hs *health.Server) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	for range time.Tick(time.Second) {
		hs.SetServingStatus("example", st)
		st ^= healthpb.HealthCheckResponse_SERVING ^ healthpb.HealthCheckResponse_NOT_SERVING
	}
}

func allInOne(ip string, calls int) error {
	ln, err := rdma.Listen("rdma", net.JoinHostPort(ip, "0"))
	if err != nil {
		return err
	}
	srv, hs := newServer()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	err = client(ln.Addr().String(), calls, hs)
	start := time.Now()
	srv.GracefulStop()
	if serr := <-served; err == nil && serr != nil {
		err = fmt.Errorf("serve: %w", serr)
	}
	if err == nil {
		fmt.Printf("server stopped gracefully in %v\n", time.Since(start).Round(time.Millisecond))
	}
	return err
}

// client makes the calls; hs, if set, is the server's health state, which
// it changes to see Watch report it.
func client(addr string, calls int, hs *health.Server) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cc, err := grpcrdma.Dial(ctx, addr)
	if err != nil {
		return err
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc) // the generated client, unchanged
	rtts := make([]time.Duration, 0, calls)
	for i := range calls {
		start := time.Now()
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return fmt.Errorf("call %d of Check: %w", i, err)
		}
		if r.Status != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("call %d of Check: status %v", i, r.Status)
		}
		rtts = append(rtts, time.Since(start))
	}
	slices.Sort(rtts)
	if calls > 0 {
		fmt.Printf("%d Check calls: median %v, p99 %v\n", calls, rtts[calls/2], rtts[calls*99/100])
	}
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: "example"})
	if err != nil {
		return err
	}
	first, err := w.Recv()
	if err != nil {
		return fmt.Errorf("watching: %w", err)
	}
	if hs != nil {
		want := healthpb.HealthCheckResponse_NOT_SERVING
		if first.Status == want {
			want = healthpb.HealthCheckResponse_SERVING
		}
		hs.SetServingStatus("example", want)
	}
	next, err := w.Recv()
	if err != nil {
		return fmt.Errorf("watching: %w", err)
	}
	fmt.Printf("Watch: %v, then %v\n", first.Status, next.Status)
	return nil
}
