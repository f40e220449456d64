package rdmaprom

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/verbline/rdma"
)

// Host tests: the collector over a fixed snapshot. The RDMA test
// (rdmaprom_rdma_test.go) scrapes real connections.

func snapshot() rdma.Metrics {
	d0 := rdma.DeviceMetrics{Device: "mlx5_0", Ports: []rdma.PortCounters{
		{Port: 0, HW: map[string]uint64{"cq_overflow": 0}},
		{Port: 1, HW: map[string]uint64{"rnr_nak_retry_err": 3, "out_of_sequence": 12},
			Standard: map[string]uint64{"port_xmit_data": 1000}},
	}}
	d0.ConnsOpen, d0.ConnsTotal = 2, 5
	d0.BytesSent, d0.BytesReceived, d0.MessagesSent, d0.MessagesReceived = 1<<20, 1<<19, 7, 6
	d0.CreditStalls = 4
	d0.SendPosts, d0.SendWRs, d0.RecvPosts, d0.RecvWRs, d0.Signaled, d0.Inlined = 10, 20, 30, 40, 2, 9
	d0.Completions, d0.PollCalls, d0.PollerSleeps, d0.PollerWakeups = 50, 5, 3, 2
	d0.InlinePolls, d0.EmptyPolls, d0.Parks, d0.Arms = 60, 6, 1, 4
	d0.PoolMappedBytes, d0.PoolInUseBytes, d0.PoolExhausted = 4<<20, 1<<20, 0
	d1 := rdma.DeviceMetrics{Device: "rxe0", PortsError: "no such device"}
	d1.ConnsTotal = 1
	return rdma.Metrics{Devices: []rdma.DeviceMetrics{d0, d1}}
}

func fixed() *Collector { return &Collector{read: snapshot} }

func TestCollect(t *testing.T) {
	want := `
# HELP verbline_rdma_connections_open RDMA connections of this process established and not closed yet.
# TYPE verbline_rdma_connections_open gauge
verbline_rdma_connections_open{device="mlx5_0"} 2
verbline_rdma_connections_open{device="rxe0"} 0
# HELP verbline_rdma_connections_total RDMA connections this process established (dialed and accepted).
# TYPE verbline_rdma_connections_total counter
verbline_rdma_connections_total{device="mlx5_0"} 5
verbline_rdma_connections_total{device="rxe0"} 1
# HELP verbline_rdma_sent_bytes_total Payload bytes posted to the NIC by Write, Send and PostSend.
# TYPE verbline_rdma_sent_bytes_total counter
verbline_rdma_sent_bytes_total{device="mlx5_0"} 1.048576e+06
verbline_rdma_sent_bytes_total{device="rxe0"} 0
# HELP verbline_rdma_credit_stalls_total Times a sender found the peer's receive window closed and waited for credit.
# TYPE verbline_rdma_credit_stalls_total counter
verbline_rdma_credit_stalls_total{device="mlx5_0"} 4
verbline_rdma_credit_stalls_total{device="rxe0"} 0
# HELP verbline_rdma_doorbells_total Post calls (doorbells) to the NIC, by queue.
# TYPE verbline_rdma_doorbells_total counter
verbline_rdma_doorbells_total{device="mlx5_0",queue="recv"} 30
verbline_rdma_doorbells_total{device="mlx5_0",queue="send"} 10
verbline_rdma_doorbells_total{device="rxe0",queue="recv"} 0
verbline_rdma_doorbells_total{device="rxe0",queue="send"} 0
# HELP verbline_rdma_parks_total Waits that spent their spin budget and slept until a completion woke them.
# TYPE verbline_rdma_parks_total counter
verbline_rdma_parks_total{device="mlx5_0"} 1
verbline_rdma_parks_total{device="rxe0"} 0
# HELP verbline_rdma_pool_in_use_bytes Bytes of the device's buffer pool held by buffers in use.
# TYPE verbline_rdma_pool_in_use_bytes gauge
verbline_rdma_pool_in_use_bytes{device="mlx5_0"} 1.048576e+06
verbline_rdma_pool_in_use_bytes{device="rxe0"} 0
`
	names := []string{"verbline_rdma_connections_open", "verbline_rdma_connections_total", "verbline_rdma_sent_bytes_total",
		"verbline_rdma_credit_stalls_total", "verbline_rdma_doorbells_total", "verbline_rdma_parks_total", "verbline_rdma_pool_in_use_bytes"}
	if err := testutil.CollectAndCompare(fixed(), strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}

	hw := `
# HELP verbline_rdma_port_ib_stat_total The InfiniBand performance counters of a port (sysfs counters; port_xmit_data and port_rcv_data count 4-byte words), counting every user of the device.
# TYPE verbline_rdma_port_ib_stat_total counter
verbline_rdma_port_ib_stat_total{device="mlx5_0",port="1",stat="port_xmit_data"} 1000
# HELP verbline_rdma_port_hw_stat_total The RDMA driver's hardware counters of a port (sysfs hw_counters; port 0: the device's), counting every user of the device: retransmissions, RNR NAKs, sequence errors and more, by driver-specific name.
# TYPE verbline_rdma_port_hw_stat_total counter
verbline_rdma_port_hw_stat_total{device="mlx5_0",port="0",stat="cq_overflow"} 0
verbline_rdma_port_hw_stat_total{device="mlx5_0",port="1",stat="out_of_sequence"} 12
verbline_rdma_port_hw_stat_total{device="mlx5_0",port="1",stat="rnr_nak_retry_err"} 3
`
	if err := testutil.CollectAndCompare(fixed(), strings.NewReader(hw),
		"verbline_rdma_port_hw_stat_total", "verbline_rdma_port_ib_stat_total"); err != nil {
		t.Error(err)
	}

	// Every per-device metric once per device, two queues, and one per
	// hardware counter.
	if got, want := testutil.CollectAndCount(fixed()), 2*(len(metrics)+4)+4; got != want {
		t.Errorf("%d metrics collected, want %d", got, want)
	}
}

// TestRegistryChecks registers the collector with a pedantic registry,
// which checks that what it collects matches what it describes, and lints
// the metrics (names, units, help).
func TestRegistryChecks(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(fixed()); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	// With nothing to report (no RDMA device used), the real collector
	// registers and gathers too.
	if err := prometheus.NewPedanticRegistry().Register(NewCollector()); err != nil {
		t.Fatal(err)
	}
}
