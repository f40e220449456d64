// Package rdmatest holds helpers for tests that need a real RDMA device.
//
// Such tests call Require first. Outside an RDMA environment it skips them (so
// `go test ./...` works anywhere); `make test` runs the test binaries inside
// scripts/softroce, where RDMA_TEST_DEVICE is set, and fails if any test
// skipped. Require also records the test's name in $RDMA_TEST_LOG, from which
// `make test` counts the RDMA tests that really ran.
package rdmatest

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/testhooks"
)

// Env is the RDMA environment scripts/softroce exports.
type Env struct {
	Device string // RDMA_TEST_DEVICE, e.g. rxe0
	Addr   string // RDMA_TEST_ADDR, an IPv4 address of the RDMA netdev
	Netdev string // RDMA_TEST_NETDEV
}

var logMu sync.Mutex

// Require skips t unless an RDMA device is available, and returns its environment.
func Require(t testing.TB) Env {
	t.Helper()
	e := Env{Device: os.Getenv("RDMA_TEST_DEVICE"), Addr: os.Getenv("RDMA_TEST_ADDR"), Netdev: os.Getenv("RDMA_TEST_NETDEV")}
	if e.Device == "" || e.Addr == "" {
		t.Skip("needs an RDMA device: run through scripts/softroce run (make test does)")
	}
	if p := os.Getenv("RDMA_TEST_LOG"); p != "" {
		logMu.Lock()
		if f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			f.WriteString(t.Name() + "\n")
			f.Close()
		}
		logMu.Unlock()
	}
	return e
}

// Scale stretches a timeout by RDMA_TEST_TIMESCALE (default 1): emulated
// Soft-RoCE under TCG is one to two orders of magnitude slower than hardware.
func Scale(d time.Duration) time.Duration {
	if f, err := strconv.ParseFloat(os.Getenv("RDMA_TEST_TIMESCALE"), 64); err == nil && f > 0 {
		return time.Duration(float64(d) * f)
	}
	return d
}

// Resources counts this process's RDMA objects by kind (qp, cq, mr, pd,
// cm_id) as the kernel reports them (`rdma resource show KIND`). The kernel
// names the creating thread, not the process, so objects are matched by the
// command name (test binaries run one at a time under make test). The five
// listings come from one run of `rdma -b -` (batch mode, commands on stdin):
// starting a process is the slow part in the emulated guest, and the leak
// checks call this three times per test.
func Resources(t testing.TB) map[string]int {
	t.Helper()
	runSettle()
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("rdma", "-b", "-")
	cmd.Stdin = strings.NewReader("resource show qp\nresource show cq\nresource show mr\nresource show pd\nresource show cm_id\n")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("rdma -b - (resource show qp, cq, mr, pd, cm_id): %v: %s", err, b)
	}
	out, err := countResources(string(b), strings.TrimSpace(string(comm)))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// resourceKinds maps the field that follows the device in each listing's
// lines ("link rxe0/1 lqpn 17 ...", "dev rxe0 cqn 1 ...") to its kind.
var resourceKinds = map[string]string{"lqpn": "qp", "cqn": "cq", "mrn": "mr", "pdn": "pd", "cm-idn": "cm_id"}

// countResources counts the lines of `rdma resource show` listings whose
// command is comm, by kind. A line of no known kind is an error: the
// counts would silently miss a kind if iproute2 changed its format.
func countResources(listing, comm string) (map[string]int, error) {
	out := map[string]int{}
	for _, line := range strings.Split(listing, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		var kind string
		ok := len(f) > 2
		if ok {
			kind, ok = resourceKinds[f[2]]
		}
		if !ok {
			return nil, fmt.Errorf("rdma resource show: a line of no known kind: %q", line)
		}
		if strings.Contains(line+" ", " comm "+comm+" ") {
			out[kind]++
		}
	}
	return out, nil
}

// Settle, if set, runs before Resources, CheckNoLeaks and WaitGoroutines
// count, instead of testhooks.Settle: the rdma package registers there what
// releases what it holds on purpose beyond its live connections (QPs
// waiting for their connection's TIMEWAIT_EXIT, its QP pool and devices
// kept a while for the next connection), so that the counts show leaks,
// not caches. A test that must see those caches sets a no-op.
var Settle func()

func runSettle() {
	if Settle != nil {
		Settle()
		return
	}
	testhooks.Settle(Scale(15 * time.Second))
}

// CheckNoLeaks fails t if, within a scaled grace period, the process's RDMA
// objects or goroutines do not come back to the baseline.
func CheckNoLeaks(t testing.TB, baseRes map[string]int, baseGoroutines int) {
	t.Helper()
	deadline := time.Now().Add(Scale(2 * time.Second))
	for {
		// Goroutines first: Resources runs `rdma` through os/exec, whose
		// output-copying goroutine may not have exited yet when it returns
		// (under load, on every check of the grace period). Settle before
		// it: what the package releases there (retiring connections'
		// goroutines, lingering devices' pollers) is not a leak.
		runSettle()
		g := runtime.NumGoroutine()
		res := Resources(t)
		same := g <= baseGoroutines
		for k, v := range res {
			if v != baseRes[k] {
				same = false
			}
		}
		if same {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("leak: RDMA objects %v (before %v), goroutines %d (before %d)\n%s", res, baseRes, g, baseGoroutines, buf[:n])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Goroutines is the process's goroutine count (runtime.NumGoroutine).
func Goroutines() int { return runtime.NumGoroutine() }

// WaitGoroutines waits (scaled, 2 s) until at most n goroutines remain and
// fails t with every goroutine's stack if they do not.
func WaitGoroutines(t testing.TB, n int) {
	t.Helper()
	runSettle()
	deadline := time.Now().Add(Scale(2 * time.Second))
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, want at most %d:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}
