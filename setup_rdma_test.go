//go:build linux && cgo

package rdma

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// stepStats aggregates setupTrace reports per side and step.
type stepStats struct {
	mu    sync.Mutex
	order []string
	sum   map[string]time.Duration
	max   map[string]time.Duration
	n     map[string]int
}

func traceSteps(t testing.TB) *stepStats {
	s := &stepStats{sum: map[string]time.Duration{}, max: map[string]time.Duration{}, n: map[string]int{}}
	f := func(side, step string, d time.Duration) {
		k := side + ": " + step
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.n[k]; !ok {
			s.order = append(s.order, k)
		}
		s.sum[k] += d
		s.n[k]++
		s.max[k] = max(s.max[k], d)
	}
	setupTrace.Store(&f)
	t.Cleanup(func() { setupTrace.Store(nil) })
	return s
}

// report writes one line per step: count, mean and max in microseconds,
// and a total per side of the means.
func (s *stepStats) report(title string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%s: per-step set-up times (us)\n", title)
	keys := append([]string(nil), s.order...)
	sort.SliceStable(keys, func(i, j int) bool { return side(keys[i]) < side(keys[j]) })
	total := map[string]float64{}
	for _, k := range keys {
		mean := float64(s.sum[k].Microseconds()) / float64(s.n[k])
		if side(k) != "endpoint" { // part of "new conn"
			total[side(k)] += mean
		}
		fmt.Fprintf(&b, "  %-40s n=%-5d mean=%9.1f max=%9.1f\n", k, s.n[k], mean, float64(s.max[k].Microseconds()))
	}
	for _, sd := range []string{"dial", "accept"} {
		fmt.Fprintf(&b, "  %-40s mean=%9.1f\n", sd+": total", total[sd])
	}
	return b.String()
}

func side(k string) string { return k[:strings.IndexByte(k, ':')] }

// TestSetupProfile measures connection set-up against an in-process
// listener while a long-lived connection holds the device (as cmtime's
// process holds its device context): RDMA_SETUP_SEQ (default 10)
// sequential dial+close cycles, then RDMA_SETUP_CONNS (default 10)
// concurrent dials, reporting per-connection times, connections per
// second and the per-step times of dial and accept. scripts/setupbench runs
// it with larger counts next to rdma-core's cmtime.
func TestSetupProfile(t *testing.T) {
	for _, pool := range []int32{0, 64} {
		t.Run(fmt.Sprintf("pool=%d", pool), func(t *testing.T) {
			old := qpPoolMax.Swap(pool)
			defer qpPoolMax.Store(old)
			setupProfile(t)
		})
	}
}

func setupProfile(t *testing.T) {
	seqN, conN := envInt("RDMA_SETUP_SEQ", 10), envInt("RDMA_SETUP_CONNS", 10)
	checkLeaksAtEnd(t)
	ln := listenTest(t, nil)
	wg := echoServer(ln)
	defer wg.Wait()
	defer ln.Close()
	keep, err := Dial("rdma", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	if err := echo(keep, -1); err != nil {
		t.Fatal(err)
	}

	steps := traceSteps(t)
	var dialSum, closeSum time.Duration
	start := time.Now()
	for i := range seqN {
		t0 := time.Now()
		c, err := Dial("rdma", ln.Addr().String())
		if err != nil {
			t.Fatalf("sequential dial %d: %v", i, err)
		}
		t1 := time.Now()
		if err := c.Close(); err != nil {
			t.Fatalf("sequential close %d: %v", i, err)
		}
		dialSum += t1.Sub(t0)
		closeSum += time.Since(t1)
	}
	seqWall := time.Since(start)
	st, pooled := poolStats(keep.dev)
	t.Logf("SETUP QP pool after the sequential dials: %+v, %d pooled", st, pooled)
	t.Logf("SETUP sequential n=%d dial_mean_us=%.1f close_mean_us=%.1f conns_per_s=%.1f",
		seqN, float64(dialSum.Microseconds())/float64(seqN), float64(closeSum.Microseconds())/float64(seqN),
		float64(seqN)/seqWall.Seconds())
	t.Log(steps.report("sequential"))

	steps = traceSteps(t)
	conns := make([]*Conn, conN)
	errs := make([]error, conN)
	durs := make([]time.Duration, conN)
	var dw sync.WaitGroup
	start = time.Now()
	for i := range conN {
		dw.Add(1)
		go func() {
			defer dw.Done()
			t0 := time.Now()
			conns[i], errs[i] = Dial("rdma", ln.Addr().String())
			durs[i] = time.Since(t0)
		}()
	}
	dw.Wait()
	conWall := time.Since(start)
	var sum, worst time.Duration
	for i := range conN {
		if errs[i] != nil {
			t.Errorf("concurrent dial %d: %v", i, errs[i])
		}
		sum += durs[i]
		worst = max(worst, durs[i])
	}
	t0 := time.Now()
	for _, c := range conns {
		if c != nil {
			if err := c.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}
	}
	t.Logf("SETUP concurrent n=%d wall_ms=%.1f per_conn_us=%.1f dial_mean_us=%.1f dial_max_us=%.1f conns_per_s=%.1f close_all_ms=%.1f",
		conN, float64(conWall.Microseconds())/1e3, float64(conWall.Microseconds())/float64(conN),
		float64(sum.Microseconds())/float64(conN), float64(worst.Microseconds()),
		float64(conN)/conWall.Seconds(), float64(time.Since(t0).Microseconds())/1e3)
	t.Log(steps.report("concurrent"))
	for i := range conN {
		if errs[i] == nil && durs[i] <= 0 {
			t.Errorf("dial %d took no time", i)
		}
	}
}
