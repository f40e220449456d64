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

// churnFDs bounds the rdma_cm descriptors above the baseline while
// connections churn: the listener's channel, the two live ends' channels,
// the channel shared by the ids in timewait and a few channels kept for
// reuse, two descriptors each.
const churnFDs = 24

// TestDescriptorsAfterChurn: during RDMA_TEST_FD_CYCLES (default 200;
// make soak runs 1,000)
// sequential dial / echo / close cycles against one listener, the
// connections closed and waiting for their timewait (their QPs parked for
// the pool) hold no rdma_cm descriptor of their own: the process's count
// stays within a constant of what it was before the cycles however many of
// them wait. (Where the CM connects the QP, iWARP, no QP is parked for
// the pool and closed connections do not wait: the count must still stay
// within the constant.) After the listener's Close the count comes back to what it was
// before, within the device's linger, the connections' timewait and a few
// seconds more (channels kept for reuse expire), with no call that
// releases them.
func TestDescriptorsAfterChurn(t *testing.T) {
	n := envInt("RDMA_TEST_FD_CYCLES", 200)
	checkLeaksAtEnd(t) // settles what earlier tests left
	rdmacm.DrainIdleChannels()
	base := cmFDs(t)

	parks := !testDeviceCaps(t).CMConnectsQP
	ln := listenTest(t, nil)
	defer ln.Close() // on a failed cycle; closed below otherwise
	wg := echoServer(ln)
	peak, peakWaiting, maxWaiting := 0, 0, 0
	start := time.Now()
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
		fds, waiting := cmFDs(t), int(retiring.Load())
		if fds > peak {
			peak, peakWaiting = fds, waiting
		}
		maxWaiting = max(maxWaiting, waiting)
		if fds > base+churnFDs {
			t.Fatalf("cycle %d: %d rdma_cm descriptors while %d closed connections wait for their timewait, want at most %d (%d before the cycles)",
				i, fds, waiting, base+churnFDs, base)
		}
	}
	t.Logf("%d cycles in %v: %d rdma_cm descriptors before, at most %d during (%d closed connections in timewait then), up to %d closed connections in timewait at once",
		n, time.Since(start).Round(time.Millisecond), base, peak, peakWaiting, maxWaiting)
	if parks && maxWaiting <= churnFDs/2 {
		t.Fatalf("at most %d closed connections in timewait at once: too few to tell a constant count from two descriptors each (more cycles: RDMA_TEST_FD_CYCLES)", maxWaiting)
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
