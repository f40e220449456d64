package rdmaprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/verbline/rdma"
)

// ListenerCollector is a prometheus.Collector of one Listener's handshake
// outcomes ([rdma.ListenerStats]), read at each scrape:
//
//	verbline_rdma_listener_handshakes_total{listener, outcome}  counter  connect requests by outcome: accepted, refused, dropped, failed
//
// A handshake that fails never reaches Accept (its dialer gets the error):
// outcome="failed" rising while "accepted" does not is the listening side's
// sign of dialers it cannot talk to; Listener.Stats().LastFailure says why.
// Register one collector per listener, each with its own name (the
// listener label); a closed listener keeps its counts until the collector
// is unregistered.
type ListenerCollector struct {
	desc  *prometheus.Desc
	stats func() rdma.ListenerStats
}

// NewListenerCollector returns a collector of l's handshake outcomes,
// labelled listener=name.
func NewListenerCollector(name string, l *rdma.Listener) *ListenerCollector {
	return newListenerCollector(name, l.Stats)
}

func newListenerCollector(name string, stats func() rdma.ListenerStats) *ListenerCollector {
	return &ListenerCollector{
		desc: prometheus.NewDesc(namespace+"_listener_handshakes_total",
			"Connect requests a listener received, by outcome: accepted (queued for Accept), refused (backlog full, "+
				"Admit refused or timed out, closing), dropped (a handshake in progress ended for a newer one), "+
				"failed (timed out, the dialer went away or broke the protocol).",
			[]string{"outcome"}, prometheus.Labels{"listener": name}),
		stats: stats,
	}
}

// Describe sends the collector's one descriptor.
func (c *ListenerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect reads the listener's stats and sends one counter per outcome.
func (c *ListenerCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	for _, o := range []struct {
		outcome string
		n       uint64
	}{{"accepted", st.Accepted}, {"refused", st.Refused}, {"dropped", st.Dropped}, {"failed", st.Failed}} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(o.n), o.outcome)
	}
}
