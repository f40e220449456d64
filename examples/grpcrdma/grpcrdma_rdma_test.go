package main

import (
	"context"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/rdmatest/baseline"
)

// TestRun runs the all-in-one mode over RDMA: grpcrdma on an rdma.Listener
// and grpc-go on a TCP port serve the one health implementation at once,
// both clients get every Check and Watch answer right (grpcrdma's over
// "rdma", grpc-go's over "tcp"), both servers stop gracefully, and no RDMA
// object or goroutine is left.
func TestRun(t *testing.T) {
	env := rdmatest.Require(t)
	baseRes, baseG := baseline.Take(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(2*time.Minute))
	defer cancel()

	const calls = 200
	s, err := run(ctx, env.Addr, calls, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkSummary(t, s, calls, "rdma")
	cancel()
	rdmatest.CheckNoLeaks(t, baseRes, baseG)
}
