// Package rdmaexpvar publishes the metrics of github.com/verbline/rdma
// through the standard library's expvar, on request:
//
//	if err := rdmaexpvar.Publish("rdma"); err != nil { ... }
//	http.ListenAndServe("localhost:6060", nil) // GET /debug/vars: {"rdma": {...}, ...}
//
// The variable's value is an [rdma.ReadMetrics] snapshot, taken at each
// read, as JSON: the process's totals at the top level (ConnsOpen,
// ConnsTotal, BytesSent, BytesReceived, MessagesSent, MessagesReceived,
// CreditStalls, the ConnStats fields such as PollerWakeups and Parks, the
// pool gauges) and Devices, one object per RDMA device with the same fields
// and the device's hardware counters (Ports). The poller and completion
// counters among them (PollerWakeups, Parks and the like) are diagnostics
// whose meaning follows the implementation.
//
// It lives apart from package rdma because importing expvar imports
// net/http and registers the /debug/vars handler on http.DefaultServeMux;
// importing this package does that, and nothing more until Publish.
package rdmaexpvar

import (
	"expvar"
	"fmt"
	"sync"

	"github.com/verbline/rdma"
)

var mu sync.Mutex // serializes Publish's check and publication

// Publish publishes the library's metrics as the expvar variable name. An
// expvar name is published once per process: a second Publish of a name
// already taken (by this package or anyone) returns an error.
func Publish(name string) error {
	if name == "" {
		return fmt.Errorf("rdmaexpvar: empty variable name")
	}
	mu.Lock()
	defer mu.Unlock()
	if expvar.Get(name) != nil {
		return fmt.Errorf("rdmaexpvar: an expvar variable named %q is already published (names are process-wide: pick another)", name)
	}
	expvar.Publish(name, Func())
	return nil
}

// Func returns the variable Publish publishes, for callers that publish it
// themselves (e.g. inside an expvar.Map): its value is rdma.ReadMetrics()
// at each read.
func Func() expvar.Func {
	return func() any { return rdma.ReadMetrics() }
}
