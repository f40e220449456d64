package grpcrdma

import (
	"testing"

	"github.com/verbline/rdma/internal/rdmatest"
)

// TestSuiteFallback runs the behaviour suite over TCP-backed connections
// (a Fallback listener and dialer on 127.0.0.1): everything but RDMA itself.
func TestSuiteFallback(t *testing.T) {
	if hostOnly(t) {
		return
	}
	g0 := rdmatest.Goroutines()
	runSuite(t, fallbackListen, []DialOption{fallbackDial()})
	rdmatest.WaitGoroutines(t, g0)
}
