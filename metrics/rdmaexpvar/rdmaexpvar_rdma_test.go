//go:build linux && cgo

package rdmaexpvar

import (
	"encoding/json"
	"expvar"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/rdmatest/baseline"
	"github.com/verbline/rdma/internal/rdmatest/echopair"
)

// scrape reads /debug/vars as a client would and decodes the variable.
func scrape(t *testing.T, name, device string) rdma.DeviceMetrics {
	t.Helper()
	rec := httptest.NewRecorder()
	expvar.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/vars", nil))
	var vars map[string]json.RawMessage
	if err := json.Unmarshal(rec.Body.Bytes(), &vars); err != nil {
		t.Fatalf("/debug/vars: %v", err)
	}
	var m rdma.Metrics
	if err := json.Unmarshal(vars[name], &m); err != nil {
		t.Fatalf("/debug/vars %s: %v\n%s", name, err, vars[name])
	}
	for _, d := range m.Devices {
		if d.Device == device {
			return d
		}
	}
	return rdma.DeviceMetrics{Device: device}
}

// TestExpvarRDMA publishes the metrics, moves 1 MiB each way over an RDMA
// connection and reads /debug/vars: the connection's two ends open, the
// bytes counted each way, the device's hardware counters; after Close no
// connection open and the totals kept.
func TestExpvarRDMA(t *testing.T) {
	env := rdmatest.Require(t)
	baseRes, baseG := baseline.Take(t, env)
	if err := Publish("rdma"); err != nil {
		t.Fatal(err)
	}
	before := scrape(t, "rdma", env.Device)
	if before.ConnsOpen != 0 {
		t.Fatalf("%d connections open before the test", before.ConnsOpen)
	}

	p := echopair.Open(t, env)
	const n = 1 << 20
	p.RoundTrip(t, n)
	during := scrape(t, "rdma", env.Device)
	if during.ConnsOpen != 2 || during.ConnsTotal-before.ConnsTotal != 2 {
		t.Errorf("one connection (two ends): ConnsOpen %d, ConnsTotal +%d; want 2, +2", during.ConnsOpen, during.ConnsTotal-before.ConnsTotal)
	}
	// Client to server and back: each end sent and received n bytes.
	if got := during.BytesSent - before.BytesSent; got != 2*n {
		t.Errorf("BytesSent +%d, want +%d", got, 2*n)
	}
	if got := during.BytesReceived - before.BytesReceived; got != 2*n {
		t.Errorf("BytesReceived +%d, want +%d", got, 2*n)
	}
	if during.SendPosts == before.SendPosts || during.Completions == before.Completions {
		t.Errorf("no posts or completions counted: %+v", during.Counters)
	}
	// A driver without counters in sysfs (Soft-iWARP) lists no ports.
	exported, _ := filepath.Glob("/sys/class/infiniband/" + env.Device + "/ports/*/*counters")
	if during.PortsError != "" || len(during.Ports) == 0 && len(exported) > 0 {
		t.Errorf("no hardware counters for %s: %s", env.Device, during.PortsError)
	}
	t.Logf("/debug/vars rdma, %s: %+v", env.Device, during.Counters)

	p.Close(t)
	after := scrape(t, "rdma", env.Device)
	if after.ConnsOpen != 0 {
		t.Errorf("after Close: ConnsOpen %d, want 0", after.ConnsOpen)
	}
	if after.BytesSent < during.BytesSent || after.BytesReceived < during.BytesReceived || after.ConnsTotal != during.ConnsTotal {
		t.Errorf("after Close the totals changed: %+v\nwere %+v", after.Counters, during.Counters)
	}
	rdmatest.CheckNoLeaks(t, baseRes, baseG)
}
