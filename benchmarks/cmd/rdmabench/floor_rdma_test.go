//go:build linux && cgo

package main

import (
	"net/netip"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/verbs"
)

func TestFloorSendFlags(t *testing.T) {
	for _, c := range []struct {
		size, maxInline int
		want            uint32
	}{
		{8, 256, verbs.SendSignaled | verbs.SendInline},
		{floorInline, 256, verbs.SendSignaled | verbs.SendInline},
		{floorInline + 1, 256, verbs.SendSignaled},
		{64, 32, verbs.SendSignaled},
		{64, 0, verbs.SendSignaled},
		{4096, 256, verbs.SendSignaled},
	} {
		if got := floorSendFlags(c.size, c.maxInline); got != c.want {
			t.Errorf("size %d, QP inline limit %d: flags %#x, want %#x", c.size, c.maxInline, got, c.want)
		}
	}
}

// TestFloorRDMA runs the floor's server and client in this process at each
// latency size and checks the sample and that every RDMA object is gone.
func TestFloorRDMA(t *testing.T) {
	env := rdmatest.Require(t)
	baseRes, baseG := rdmatest.Resources(t), rdmatest.Goroutines()
	for _, size := range Latency.Sizes(modeLong) {
		a := childArgs{caseName: "go-floor", network: "verbs", size: size, iters: 200, warmup: 20}
		ready := make(chan netip.AddrPort, 1)
		served := make(chan error, 1)
		go func() { served <- floorServe(a, env.Addr, func(ap netip.AddrPort) { ready <- ap }) }()
		var ap netip.AddrPort
		select {
		case ap = <-ready:
		case err := <-served:
			t.Fatalf("size %d: server: %v", size, err)
		case <-time.After(rdmatest.Scale(30 * time.Second)):
			t.Fatalf("size %d: the server is not ready", size)
		}
		s, err := floorClient(a, ap.String())
		if err != nil {
			t.Fatalf("size %d: client: %v", size, err)
		}
		if err := <-served; err != nil {
			t.Fatalf("size %d: server: %v", size, err)
		}
		if !(s.Value > 0 && s.Avg > 0 && s.P99 >= s.Value && s.P999 >= s.P99) || len(s.Series) == 0 || len(s.Hist) == 0 {
			t.Fatalf("size %d: sample %+v", size, s)
		}
		n := 0.0
		for _, b := range s.Hist {
			n += b[1]
		}
		if int(n) != a.iters {
			t.Fatalf("size %d: histogram holds %v round trips, want %d", size, n, a.iters)
		}
		t.Logf("size %d: median %.2f µs, mean %.2f µs, p99 %.2f µs", size, s.Value, s.Avg, s.P99)
	}
	rdmatest.CheckNoLeaks(t, baseRes, baseG)
}
