package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
)

// checkSummary fails t unless both clients got every answer: calls Check
// calls and a Watch change each, grpcrdma's over rdmaNetwork and grpc-go's
// over TCP.
func checkSummary(t *testing.T, s summary, calls int, rdmaNetwork string) {
	t.Helper()
	for _, c := range []struct {
		name    string
		a       answers
		network string
	}{{"grpcrdma", s.rdma, rdmaNetwork}, {"grpc-go", s.tcp, "tcp"}} {
		if c.a.checks != calls {
			t.Errorf("%s: %d Check calls answered, want %d", c.name, c.a.checks, calls)
		}
		if len(c.a.watched) != 2 || c.a.watched[0] == c.a.watched[1] {
			t.Errorf("%s: Watch reported %v, want two different statuses", c.name, c.a.watched)
		}
		if c.a.network != c.network {
			t.Errorf("%s: calls went over %q, want %q", c.name, c.a.network, c.network)
		}
		t.Logf("%s: %v", c.name, c.a)
	}
	t.Logf("both servers stopped gracefully in %v", s.stopped.Round(time.Millisecond))
}

// TestRunFallback runs the all-in-one mode on a host with no RDMA device:
// grpcrdma's listener and client fall back to TCP (rdma.Fallback) and run
// the same calls over the connections' message view.
func TestRunFallback(t *testing.T) {
	if os.Getenv("RDMA_TEST_DEVICE") != "" {
		// make test counts skips as failures inside Soft-RoCE.
		t.Log("covered inside Soft-RoCE by TestRun; runs on the host")
		return
	}
	g0 := rdmatest.Goroutines()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const calls = 100
	s, err := run(ctx, "127.0.0.1", calls, &rdma.Fallback{RDMATimeout: rdmatest.Scale(2 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	checkSummary(t, s, calls, "tcp")
	cancel()
	rdmatest.WaitGoroutines(t, g0)
}
