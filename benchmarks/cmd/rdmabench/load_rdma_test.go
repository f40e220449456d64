//go:build linux

package main

import (
	"context"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
)

// TestLoadRDMA runs a short workload of each kind over our Conn, server and
// client in this process: closed loop with several connections and requests
// in flight and drawn sizes (some above the 32 KiB receive buffers, so
// rendezvous), a duration-bounded run with progress, and an open loop.
func TestLoadRDMA(t *testing.T) {
	env := rdmatest.Require(t)
	cfg := rdmaConfig(16, 0)
	ln, err := listenLoad("rdma", env.Addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go serveLoadListener(ln, "conn", t.Logf)
	lnMsg, err := listenLoad("rdma", env.Addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer lnMsg.Close()
	go serveLoadListener(lnMsg, "msg", t.Logf)
	lnWrite, err := listenLoad("rdma", env.Addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer lnWrite.Close()
	go serveLoadListener(lnWrite, "write", t.Logf)
	dialWrite := loadDialer("rdma", lnWrite.Addr().String(), cfg)
	dial := loadDialer("rdma", ln.Addr().String(), cfg)
	dialMsg := loadDialer("rdma", lnMsg.Addr().String(), cfg)
	for _, c := range []struct {
		name string
		spec loadSpec
		msg  bool
	}{
		{"write-closed-count", loadSpec{Conns: 2, InFlight: 4, Count: 200, View: "write", Req: mustDist(t, "uniform:1-2000"), Resp: mustDist(t, "list:8,64,40000")}, false},
		{"write-open-rate", loadSpec{Conns: 1, Rate: 100, Count: 100, View: "write", Req: mustDist(t, "64"), Resp: mustDist(t, "64")}, false},
		{"closed-count", loadSpec{Conns: 2, InFlight: 4, Count: 200, Req: mustDist(t, "uniform:1-2000"), Resp: mustDist(t, "list:8,64,40000")}, false},
		{"closed-duration", loadSpec{Conns: 1, InFlight: 2, Duration: 1500 * time.Millisecond, Req: mustDist(t, "64"), Resp: mustDist(t, "64")}, false},
		{"open-rate", loadSpec{Conns: 2, Rate: 100, Count: 100, Req: mustDist(t, "64"), Resp: mustDist(t, "4096")}, false},
		{"msg-closed-count", loadSpec{Conns: 2, InFlight: 4, Count: 200, View: "msg", Req: mustDist(t, "uniform:1-2000"), Resp: mustDist(t, "list:8,64,40000")}, true},
		{"msg-open-rate", loadSpec{Conns: 1, Rate: 100, Count: 100, View: "msg", Req: mustDist(t, "64"), Resp: mustDist(t, "64")}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(2*time.Minute))
			defer cancel()
			d := dial
			if c.msg {
				d = dialMsg
			}
			if c.spec.View == "write" {
				d = dialWrite
			}
			res, err := runLoad(ctx, d, c.spec)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d requests, %.0f req/s, %.2f MB/s, %s", c.name, res.Requests, res.Throughput, res.MBps, res.Latency)
			if c.spec.Count > 0 && res.Requests != uint64(c.spec.Count) {
				t.Fatalf("%d requests, want %d", res.Requests, c.spec.Count)
			}
			if res.Requests == 0 || res.Latency.Count != res.Requests || !(res.Latency.P50 > 0) || res.Latency.Max < res.Latency.P99 {
				t.Fatalf("result %+v", res)
			}
			if c.spec.Duration > 0 && len(res.Progress) == 0 {
				t.Fatalf("no progress points in %.1f s", res.Elapsed)
			}
		})
	}
}
