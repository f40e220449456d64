package grpcrdma_test

import (
	"context"
	"fmt"
	"log"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/grpcrdma"
)

// Serve the generated health service and call it through its generated
// client. With an RDMA device, listen with rdma.Listen("rdma", addr) on the
// device's IP; here a Fallback listener and dialer on 127.0.0.1 make the
// example run anywhere, over TCP-backed connections.
func Example() {
	lc := rdma.ListenConfig{Fallback: &rdma.Fallback{}}
	ln, err := lc.Listen(context.Background(), "rdma", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := grpcrdma.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer()) // any generated RegisterXServer
	go srv.Serve(ln)
	defer srv.GracefulStop()

	ctx := context.Background()
	cc, err := grpcrdma.Dial(ctx, ln.Addr().String(), grpcrdma.WithFallback(rdma.Fallback{}))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	fmt.Println(r.GetStatus(), err)
	// Output: SERVING <nil>
}
