//go:build linux && cgo

package rdmaprom

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/rdmatest/baseline"
	"github.com/verbline/rdma/internal/rdmatest/echopair"
)

// value returns the gathered value of the metric name whose labels
// include want (label -> value), and whether there is one.
func value(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue metrics
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestPrometheusRDMA registers the collector, moves 1 MiB each way over an
// RDMA connection and gathers: the connection gauge, the bytes each way,
// the device's hardware counters, and clean lint; after Close the gauge
// is back to 0 and the totals are kept.
func TestPrometheusRDMA(t *testing.T) {
	env := rdmatest.Require(t)
	baseRes, baseG := baseline.Take(t, env)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector())
	dev := map[string]string{"device": env.Device}
	get := func(name string, labels map[string]string) float64 {
		t.Helper()
		v, ok := value(t, reg, name, labels)
		if !ok {
			t.Fatalf("no %s%v gathered", name, labels)
		}
		return v
	}
	sent0 := get("verbline_rdma_sent_bytes_total", dev)
	recv0 := get("verbline_rdma_received_bytes_total", dev)
	total0 := get("verbline_rdma_connections_total", dev)
	if open := get("verbline_rdma_connections_open", dev); open != 0 {
		t.Fatalf("%v connections open before the test", open)
	}

	p := echopair.Open(t, env)
	const n = 1 << 20
	p.RoundTrip(t, n)
	if open := get("verbline_rdma_connections_open", dev); open != 2 {
		t.Errorf("connections_open %v, want 2 (both ends)", open)
	}
	if got := get("verbline_rdma_connections_total", dev) - total0; got != 2 {
		t.Errorf("connections_total +%v, want +2", got)
	}
	if got := get("verbline_rdma_sent_bytes_total", dev) - sent0; got != 2*n {
		t.Errorf("sent_bytes_total +%v, want +%d", got, 2*n)
	}
	if got := get("verbline_rdma_received_bytes_total", dev) - recv0; got != 2*n {
		t.Errorf("received_bytes_total +%v, want +%d", got, 2*n)
	}
	if get("verbline_rdma_doorbells_total", map[string]string{"device": env.Device, "queue": "send"}) == 0 {
		t.Error("no send doorbells counted")
	}
	if strings.HasPrefix(env.Device, "rxe") {
		for _, stat := range []string{"sent_pkts", "rcvd_rnr_err", "retry_exceeded_err", "rcvd_seq_err"} {
			v := get("verbline_rdma_port_hw_stat_total", map[string]string{"device": env.Device, "port": "1", "stat": stat})
			if stat == "sent_pkts" && v == 0 {
				t.Error("port_hw_stat_total{stat=sent_pkts} is 0 after 2 MiB")
			}
		}
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range problems {
		t.Errorf("lint: %s: %s", pr.Metric, pr.Text)
	}
	sent := get("verbline_rdma_sent_bytes_total", dev)

	p.Close(t)
	if open := get("verbline_rdma_connections_open", dev); open != 0 {
		t.Errorf("after Close: connections_open %v, want 0", open)
	}
	if got := get("verbline_rdma_sent_bytes_total", dev); got < sent {
		t.Errorf("after Close: sent_bytes_total went down from %v to %v", sent, got)
	}
	rdmatest.CheckNoLeaks(t, baseRes, baseG)
}
