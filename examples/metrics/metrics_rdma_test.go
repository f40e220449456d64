//go:build linux && cgo

package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/rdmatest/baseline"
)

// TestMetricsExample runs the example as `make demo` does: it echoes 4 MiB
// over RDMA and reads its own /debug/vars and /metrics over HTTP (run
// checks that both counted the bytes each way, the open connections, and
// none after Close). Then no RDMA object or goroutine is left but the
// HTTP server's.
func TestMetricsExample(t *testing.T) {
	env := rdmatest.Require(t)
	baseRes, baseG := baseline.Take(t, env)
	srv, err := serveMetrics("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var out bytes.Buffer
	if err := run(&out, srv.url, env.Addr, 32, 64<<10); err != nil {
		t.Fatalf("%v\noutput:\n%s", err, &out)
	}
	t.Logf("output:\n%s", &out)
	counters := env.Device + " port 1 hardware counters: "
	if m, _ := filepath.Glob("/sys/class/infiniband/" + env.Device + "/ports/1/*counters"); len(m) == 0 {
		counters = env.Device + ": its driver exports no hardware counters"
	}
	for _, want := range []string{
		"/debug/vars rdma: 2 connections open, 4194304 bytes sent, 4194304 received",
		"/metrics: verbline_rdma_connections_open 2,",
		"closed: /debug/vars 0 connections open",
		"verbline_rdma_connections_open 0",
		counters,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	srv.Close()
	rdmatest.CheckNoLeaks(t, baseRes, baseG)
}
