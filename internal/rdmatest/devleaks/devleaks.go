//go:build linux && cgo

// Package devleaks is the tests' leak check for what is set up on the
// shared devices (internal/device): the rdma package's connections and
// PacketConns, and internal/ud's endpoints, check with it.
package devleaks

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/rdmatest"
)

// CheckAtEnd makes t, once it and its deferred closes are done, wait for
// every device to be torn down (which needs every buffer of its pool back:
// a Buf still out is reported with the stack that allocated it) and for
// the process's QPs, CQs, MRs, cm_ids and goroutines to come back to what
// they were now.
func CheckAtEnd(t testing.TB) {
	t.Helper()
	rdmatest.Require(t)
	base := rdmatest.Resources(t)
	delete(base, "pd") // librdmacm keeps a PD per device once it has seen it
	baseG := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(rdmatest.Scale(3 * time.Second))
		for {
			// Devices kept for the next connection (with their pooled QPs)
			// are owned, not leaked: tear them down now.
			device.FlushLingering()
			devs := device.All()
			var leaks []buffer.Leak
			for _, d := range devs {
				leaks = append(leaks, d.Pool.Leaks()...)
			}
			n := len(devs)
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				var sb strings.Builder
				for _, l := range leaks {
					fmt.Fprintf(&sb, "%d-byte buffer allocated at:\n%s\n", l.Size, l.Stack)
				}
				t.Errorf("%d device(s) still set up after the test: %d buffer(s) never released\n%s", n, len(leaks), sb.String())
				// Reported: now free them, so that the tests after this
				// one start without its device (one leak would otherwise
				// fail every later test that needs a fresh device).
				ForceTeardownUnused(t)
				t.FailNow()
			}
			time.Sleep(10 * time.Millisecond)
		}
		res := rdmatest.Resources(t)
		base["pd"] = res["pd"]
		rdmatest.CheckNoLeaks(t, base, baseG)
		if err := device.TakeTeardownErr(); err != nil {
			t.Errorf("a device teardown failed: %v", err)
		}
	})
}

// ForceTeardownUnused tears down every device no connection uses, whatever
// buffers of its pool are still out (their handles go stale), and waits
// for the teardowns: after a leak was reported, the next tests start
// clean. The pool's complaint about the outstanding buffers is expected.
func ForceTeardownUnused(t testing.TB) {
	device.TeardownUnused(true)
	for deadline := time.Now().Add(rdmatest.Scale(3 * time.Second)); device.TearingDown() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Error("forced device teardowns did not finish")
			return
		}
	}
	device.TakeTeardownErr()
}
