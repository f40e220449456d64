package rdmaprom

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/verbline/rdma"
)

// Two listeners' collectors register side by side (the listener label
// tells them apart) and export each one's counts by outcome.
func TestListenerCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newListenerCollector("api", func() rdma.ListenerStats {
		return rdma.ListenerStats{Accepted: 7, Refused: 2, Dropped: 1, Failed: 3}
	}))
	reg.MustRegister(newListenerCollector("admin", func() rdma.ListenerStats { return rdma.ListenerStats{Accepted: 1} }))
	want := listenerHeader + `verbline_rdma_listener_handshakes_total{listener="admin",outcome="accepted"} 1
verbline_rdma_listener_handshakes_total{listener="admin",outcome="dropped"} 0
verbline_rdma_listener_handshakes_total{listener="admin",outcome="failed"} 0
verbline_rdma_listener_handshakes_total{listener="admin",outcome="refused"} 0
verbline_rdma_listener_handshakes_total{listener="api",outcome="accepted"} 7
verbline_rdma_listener_handshakes_total{listener="api",outcome="dropped"} 1
verbline_rdma_listener_handshakes_total{listener="api",outcome="failed"} 3
verbline_rdma_listener_handshakes_total{listener="api",outcome="refused"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// A real listener's counts reach the scrape: a fallback listener on
// loopback (TCP alone, on any host) and one dialer it accepts.
func TestListenerCollectorListener(t *testing.T) {
	lc := rdma.ListenConfig{Fallback: &rdma.Fallback{}}
	ln, err := lc.Listen(context.Background(), "rdma", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewListenerCollector("api", ln))
	d := rdma.Dialer{Fallback: &rdma.Fallback{}}
	c, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := listenerHeader + `verbline_rdma_listener_handshakes_total{listener="api",outcome="accepted"} 1
verbline_rdma_listener_handshakes_total{listener="api",outcome="dropped"} 0
verbline_rdma_listener_handshakes_total{listener="api",outcome="failed"} 0
verbline_rdma_listener_handshakes_total{listener="api",outcome="refused"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// listenerHeader is the exposition's HELP and TYPE lines of the listener
// metric, which the expected texts above start with.
const listenerHeader = `
# HELP verbline_rdma_listener_handshakes_total Connect requests a listener received, by outcome: accepted (queued for Accept), refused (backlog full, Admit refused or timed out, closing), dropped (a handshake in progress ended for a newer one), failed (timed out, the dialer went away or broke the protocol).
# TYPE verbline_rdma_listener_handshakes_total counter
`
