// Package rdmaprom exports the metrics of github.com/verbline/rdma to
// Prometheus: a [prometheus.Collector] that takes an [rdma.ReadMetrics]
// snapshot at each scrape. It lives apart from package rdma so that the
// library itself does not depend on the Prometheus client.
//
//	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer
//	reg.MustRegister(rdmaprom.NewCollector())
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// Every metric has a device label (the RDMA device's name, e.g. "mlx5_0");
// sum over it for the process's totals. The connection metrics count this
// process's connections, open and closed, since it started (a device's
// totals outlive its connections). The port hardware counters count every
// user of the device:
//
//	verbline_rdma_connections_open              gauge    connections established and not closed
//	verbline_rdma_connections_total             counter  connections established (dialed and accepted)
//	verbline_rdma_sent_bytes_total              counter  payload posted by Write, Send and PostSend
//	verbline_rdma_received_bytes_total          counter  payload received (stream bytes and messages)
//	verbline_rdma_sent_messages_total           counter  messages posted by Send and PostSend
//	verbline_rdma_received_messages_total       counter  messages received
//	verbline_rdma_credit_stalls_total           counter  times a sender found the peer's receive window closed
//	verbline_rdma_doorbells_total               counter  post calls, by queue ("send", "recv")
//	verbline_rdma_work_requests_total           counter  work requests posted, by queue
//	verbline_rdma_signaled_work_requests_total  counter  send work requests that asked for a completion
//	verbline_rdma_inline_work_requests_total    counter  send work requests that carried their payload inline
//	verbline_rdma_completions_total             counter  completions dispatched
//	verbline_rdma_poller_polls_total            counter  CQ polls by the pollers' own goroutines
//	verbline_rdma_poller_sleeps_total           counter  times a poller armed its CQ and slept
//	verbline_rdma_poller_wakeups_total          counter  times a completion event woke a poller
//	verbline_rdma_caller_polls_total            counter  CQ polls by waiting callers (Read, Write, Recv, ...)
//	verbline_rdma_caller_empty_polls_total      counter  ... of which found nothing
//	verbline_rdma_parks_total                   counter  waits that spent their spin budget and slept
//	verbline_rdma_cq_arms_total                 counter  requests for a completion event
//	verbline_rdma_pool_mapped_bytes             gauge    registered buffer pool: bytes mapped
//	verbline_rdma_pool_in_use_bytes             gauge    registered buffer pool: bytes in buffers in use
//	verbline_rdma_pool_exhausted_total          counter  allocations that found the pool at its limit
//	verbline_rdma_port_hw_stat_total            counter  the driver's hw_counters, by port and stat (file name)
//	verbline_rdma_port_ib_stat_total            counter  the port's InfiniBand counters, by port and stat
//
// The completion and polling metrics (completions_total, poller_polls_total,
// poller_sleeps_total, poller_wakeups_total, caller_polls_total,
// caller_empty_polls_total, parks_total, cq_arms_total) are diagnostics of
// how the library drives completions: what each counts follows the
// implementation and may change between versions (see [rdma.ConnStats]).
// Build alerts on the other metrics.
//
// The hardware counters are the driver's, by file name in sysfs (see
// [rdma.PortCounters]): retransmissions, RNR NAKs and sequence errors are
// among them, e.g. verbline_rdma_port_hw_stat_total{stat="rcvd_rnr_err"}
// on Soft-RoCE or {stat="rnr_nak_retry_err"} on mlx5. Port 0 holds the
// counters a driver keeps for the whole device.
//
// A listener's handshake outcomes are a collector of their own, one per
// listener (see [NewListenerCollector]):
//
//	reg.MustRegister(rdmaprom.NewListenerCollector("api", ln))
package rdmaprom

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/verbline/rdma"
)

const namespace = "verbline_rdma"

// Collector is a prometheus.Collector of the library's metrics. Register
// one per registry.
type Collector struct {
	read func() rdma.Metrics // rdma.ReadMetrics; tests give a fixed snapshot
}

// NewCollector returns a Collector that reads rdma.ReadMetrics at each
// scrape. Nothing is counted while no one scrapes: the library's counters
// are always kept, this only reads them.
func NewCollector() *Collector { return &Collector{read: rdma.ReadMetrics} }

// metric is one per-device metric: how to read it from a device's counters.
type metric struct {
	desc  *prometheus.Desc
	typ   prometheus.ValueType
	value func(*rdma.Counters) float64
}

func newMetric(name, help string, typ prometheus.ValueType, value func(*rdma.Counters) float64) metric {
	return metric{prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, []string{"device"}, nil), typ, value}
}

func counter(name, help string, value func(*rdma.Counters) uint64) metric {
	return newMetric(name, help, prometheus.CounterValue, func(c *rdma.Counters) float64 { return float64(value(c)) })
}

func gauge(name, help string, value func(*rdma.Counters) int64) metric {
	return newMetric(name, help, prometheus.GaugeValue, func(c *rdma.Counters) float64 { return float64(value(c)) })
}

var metrics = []metric{
	gauge("connections_open", "RDMA connections of this process established and not closed yet.",
		func(c *rdma.Counters) int64 { return c.ConnsOpen }),
	counter("connections_total", "RDMA connections this process established (dialed and accepted).",
		func(c *rdma.Counters) uint64 { return c.ConnsTotal }),
	counter("sent_bytes_total", "Payload bytes posted to the NIC by Write, Send and PostSend.",
		func(c *rdma.Counters) uint64 { return c.BytesSent }),
	counter("received_bytes_total", "Payload bytes received: stream bytes and messages, large ones included.",
		func(c *rdma.Counters) uint64 { return c.BytesReceived }),
	counter("sent_messages_total", "Messages of the message view posted by Send and PostSend.",
		func(c *rdma.Counters) uint64 { return c.MessagesSent }),
	counter("received_messages_total", "Messages of the message view received.",
		func(c *rdma.Counters) uint64 { return c.MessagesReceived }),
	counter("credit_stalls_total", "Times a sender found the peer's receive window closed and waited for credit.",
		func(c *rdma.Counters) uint64 { return c.CreditStalls }),
	counter("signaled_work_requests_total", "Send work requests that asked for a completion.",
		func(c *rdma.Counters) uint64 { return c.Signaled }),
	counter("inline_work_requests_total", "Send work requests that carried their payload inline.",
		func(c *rdma.Counters) uint64 { return c.Inlined }),
	counter("completions_total", "Work completions dispatched to connections.",
		func(c *rdma.Counters) uint64 { return c.Completions }),
	counter("poller_polls_total", "Completion queue polls made by the pollers' own goroutines.",
		func(c *rdma.Counters) uint64 { return c.PollCalls }),
	counter("poller_sleeps_total", "Times a poller armed its completion queue and slept.",
		func(c *rdma.Counters) uint64 { return c.PollerSleeps }),
	counter("poller_wakeups_total", "Times a completion event woke a poller.",
		func(c *rdma.Counters) uint64 { return c.PollerWakeups }),
	counter("caller_polls_total", "Completion queue polls made by callers waiting in Read, Write, Recv and the like.",
		func(c *rdma.Counters) uint64 { return c.InlinePolls }),
	counter("caller_empty_polls_total", "Completion queue polls by waiting callers that found nothing.",
		func(c *rdma.Counters) uint64 { return c.EmptyPolls }),
	counter("parks_total", "Waits that spent their spin budget and slept until a completion woke them.",
		func(c *rdma.Counters) uint64 { return c.Parks }),
	counter("cq_arms_total", "Requests for a completion event (ibv_req_notify_cq).",
		func(c *rdma.Counters) uint64 { return c.Arms }),
	gauge("pool_mapped_bytes", "Bytes mapped and registered by the device's buffer pool.",
		func(c *rdma.Counters) int64 { return c.PoolMappedBytes }),
	gauge("pool_in_use_bytes", "Bytes of the device's buffer pool held by buffers in use.",
		func(c *rdma.Counters) int64 { return c.PoolInUseBytes }),
	counter("pool_exhausted_total", "Buffer allocations that found the pool at its limit (Config.PoolMaxBytes).",
		func(c *rdma.Counters) uint64 { return c.PoolExhausted }),
}

var (
	doorbells = prometheus.NewDesc(namespace+"_doorbells_total",
		"Post calls (doorbells) to the NIC, by queue.", []string{"device", "queue"}, nil)
	workRequests = prometheus.NewDesc(namespace+"_work_requests_total",
		"Work requests posted to the NIC, by queue.", []string{"device", "queue"}, nil)
	hwCounter = prometheus.NewDesc(namespace+"_port_hw_stat_total",
		"The RDMA driver's hardware counters of a port (sysfs hw_counters; port 0: the device's), "+
			"counting every user of the device: retransmissions, RNR NAKs, sequence errors and more, by driver-specific name.",
		[]string{"device", "port", "stat"}, nil)
	portCounter = prometheus.NewDesc(namespace+"_port_ib_stat_total",
		"The InfiniBand performance counters of a port (sysfs counters; port_xmit_data and port_rcv_data count 4-byte words), "+
			"counting every user of the device.",
		[]string{"device", "port", "stat"}, nil)
)

// Describe sends the descriptors of every metric the Collector makes.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range metrics {
		ch <- m.desc
	}
	ch <- doorbells
	ch <- workRequests
	ch <- hwCounter
	ch <- portCounter
}

// Collect reads a snapshot of the library's metrics and sends them.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	snap := c.read()
	for i := range snap.Devices {
		d := &snap.Devices[i]
		for _, m := range metrics {
			ch <- prometheus.MustNewConstMetric(m.desc, m.typ, m.value(&d.Counters), d.Device)
		}
		for _, q := range []struct {
			queue     string
			posts, wr uint64
		}{{"send", d.SendPosts, d.SendWRs}, {"recv", d.RecvPosts, d.RecvWRs}} {
			ch <- prometheus.MustNewConstMetric(doorbells, prometheus.CounterValue, float64(q.posts), d.Device, q.queue)
			ch <- prometheus.MustNewConstMetric(workRequests, prometheus.CounterValue, float64(q.wr), d.Device, q.queue)
		}
		for _, p := range d.Ports {
			port := strconv.Itoa(p.Port)
			for name, v := range p.HW {
				ch <- prometheus.MustNewConstMetric(hwCounter, prometheus.CounterValue, float64(v), d.Device, port, name)
			}
			for name, v := range p.Standard {
				ch <- prometheus.MustNewConstMetric(portCounter, prometheus.CounterValue, float64(v), d.Device, port, name)
			}
		}
	}
}
