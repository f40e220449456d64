//go:build linux && cgo

package rdma

import (
	"testing"

	"github.com/verbline/rdma/internal/verbs"
)

// TestPortCache: connections on a device share one ibv_query_port while
// the answer is fresh; a port event drops it (the next connection asks the
// device again); and a cached active MTU below the path MTU rdma_cm gives
// (a netdev MTU raised since the query, which rxe reports with no event)
// is read again before the QP's RTR instead of failing the dial (where
// the library moves the QP to RTR: not on iWARP).
func TestPortCache(t *testing.T) {
	checkLeaksAtEnd(t)
	ln, keep := heldDevice(t)
	d := keep.dev
	port := keep.port

	// The dials below come well within the cache's TTL of each other only if
	// the guest is not stalled; a stall shows as extra queries, so count
	// the dials that found the port cached instead of requiring all.
	q0 := d.Ports.Queries()
	for i := range 4 {
		dialEcho(t, ln, i).Close()
	}
	if got := d.Ports.Queries() - q0; got >= 8 { // 4 dials, 2 ends each on this device
		t.Errorf("8 connection ends queried the port %d times: the cache was not used", got)
	} else {
		t.Logf("8 connection ends, %d port queries", got)
	}

	// A port event (here a GID change, as when an address is added to the
	// netdev) drops the entry: the next connection end queries the port.
	d.HandleAsync(verbs.AsyncEvent{Type: verbs.EventGIDChange, Port: port})
	_, cached := d.Ports.Cached(port)
	if cached {
		t.Fatal("a GID change event left the port's limits cached")
	}
	q1 := d.Ports.Queries()
	dialEcho(t, ln, 10).Close()
	if d.Ports.Queries() == q1 {
		t.Error("after a GID change event, a new connection did not query the port")
	}

	// A stale active MTU (256, the smallest) below the path's: the dial
	// must query the port again at RTR and succeed with the real MTU.
	lim, err := d.Ports.Limits(port, false)
	if err != nil {
		t.Fatal(err)
	}
	if lim.ActiveMTU <= verbs.MTU256 {
		t.Fatalf("the port's active MTU is %v: no smaller value to make stale (the test needs a netdev MTU above 256)", lim.ActiveMTU)
	}
	stale := func() {
		l := lim
		l.ActiveMTU = verbs.MTU256
		d.Ports.Replace(port, l)
	}
	stale()
	q2 := d.Ports.Queries()
	c := dialEcho(t, ln, 11)
	defer c.Close()
	info, err := c.QPInfo()
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Caps.CMConnectsQP:
		// iWARP: the CM connects the QP; no path MTU is checked or set
		// by the library, so the stale entry is not consulted.
		t.Logf("the CM connects QPs on %s: the dial does not check the path MTU (%d port queries)", d.Name(), d.Ports.Queries()-q2)
	case d.Ports.Queries() == q2:
		t.Error("a path MTU above the cached active MTU did not make the dial query the port")
	}
	if info.PathMTU <= 256 {
		t.Errorf("path MTU %d after the refresh, want the port's %v", info.PathMTU, lim.ActiveMTU)
	}
	t.Logf("stale active MTU 256: the dial refreshed it and runs at a path MTU of %d", info.PathMTU)
}
