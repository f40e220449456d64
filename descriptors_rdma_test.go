//go:build linux && cgo

package rdma

import (
	"os"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/rdmatest"
)

// cmFDs counts this process's descriptors open on /dev/infiniband/rdma_cm
// (rdma_cm event channels).
func cmFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if p, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && p == "/dev/infiniband/rdma_cm" {
			n++
		}
	}
	return n
}

// TestDescriptorsAfterChurn: after RDMA_TEST_FD_CYCLES (default 100)
// sequential dial / echo / close cycles against one listener and the
// listener's Close, the process's rdma_cm descriptors come back to what
// they were before the cycles, within the device's linger, the
// connections' timewait and a few seconds more (channels kept for reuse
// expire), with no call that releases them.
func TestDescriptorsAfterChurn(t *testing.T) {
	n := envInt("RDMA_TEST_FD_CYCLES", 100)
	checkLeaksAtEnd(t) // settles what earlier tests left
	rdmacm.DrainIdleChannels()
	base := cmFDs(t)

	ln := listenTest(t, nil)
	wg := echoServer(ln)
	peak := 0
	for i := range n {
		c, err := Dial("rdma", ln.Addr().String())
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		if err := echo(c, i); err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("cycle %d: close: %v", i, err)
		}
		peak = max(peak, cmFDs(t))
	}
	ln.Close()
	wg.Wait() // every server side closed
	closed := time.Now()

	// TIMEWAIT_EXIT comes about 2 s after Close on Soft-RoCE.
	bound := defaultDeviceLinger + 2*time.Second + rdmatest.Scale(5*time.Second)
	for {
		fds := cmFDs(t)
		if fds <= base {
			t.Logf("%d cycles: %d rdma_cm descriptors before, at most %d during, back to %d %v after the last Close",
				n, base, peak, fds, time.Since(closed).Round(time.Millisecond))
			return
		}
		if time.Since(closed) > bound {
			t.Fatalf("%d cycles: %d rdma_cm descriptors %v after the last Close (%d idle channels kept), want at most the %d before",
				n, fds, time.Since(closed).Round(time.Millisecond), rdmacm.IdleChannels(), base)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
