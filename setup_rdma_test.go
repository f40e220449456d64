//go:build linux && cgo

package rdma

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
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
// second and the per-step times of dial and accept; without the QP pool,
// then with it. scripts/setupbench runs it with larger counts next to
// rdma-core's cmtime.
//
// Both runs first prime the device: RDMA_SETUP_CONNS connections dialled
// and closed, and (with the pool) their QPs back in the pool, which they
// join only at their TIMEWAIT_EXIT, about 2 s after Close here. The
// figures with the pool are thus those of dials that come at least that
// long after earlier connections closed (steady churn), with a pool large
// enough for both ends of every measured connection (this process is both
// dialer and listener).
func TestSetupProfile(t *testing.T) {
	for _, pool := range []bool{false, true} {
		t.Run(fmt.Sprintf("pool=%v", pool), func(t *testing.T) { setupProfile(t, pool) })
	}
}

func setupProfile(t *testing.T, pool bool) {
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
	d := keep.dev
	want := 0 // QPs the pool must hold before a measured phase
	if pool {
		want = 2 * max(seqN, conN)
		d.qpMax.Store(int32(want))
	} else {
		d.qpMax.Store(0)
	}
	// prime dials n connections at once and closes them, then waits for
	// their QPs to come back to the pool (none without it).
	prime := func(n int) {
		conns := make([]*Conn, n)
		var dw sync.WaitGroup
		for i := range n {
			dw.Add(1)
			go func() {
				defer dw.Done()
				c, err := Dial("rdma", ln.Addr().String())
				if err != nil {
					t.Errorf("priming dial %d: %v", i, err)
				}
				conns[i] = c
			}()
		}
		dw.Wait()
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		if t.Failed() {
			t.FailNow()
		}
		if pool {
			waitPool(t, d, "priming", func(_ qpPoolStats, n int) bool { return n >= want })
		} else {
			settleDevices(rdmatest.Scale(15 * time.Second)) // the closed connections' ends are gone
		}
	}
	prime(max(seqN, conN))
	st0, _ := poolStats(d)

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
	st, pooled := poolStats(d)
	t.Logf("SETUP pool=%v sequential: QPs reused %d, created %d (%d pooled after)", pool,
		st.Reused-st0.Reused, st.Created-st0.Created, pooled)
	t.Logf("SETUP pool=%v sequential n=%d dial_mean_us=%.1f close_mean_us=%.1f conns_per_s=%.1f",
		pool, seqN, float64(dialSum.Microseconds())/float64(seqN), float64(closeSum.Microseconds())/float64(seqN),
		float64(seqN)/seqWall.Seconds())
	t.Log(steps.report("sequential"))

	prime(conN)
	st0, _ = poolStats(d)
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
	st, _ = poolStats(d)
	t.Logf("SETUP pool=%v concurrent: QPs reused %d, created %d", pool, st.Reused-st0.Reused, st.Created-st0.Created)
	t0 := time.Now()
	for _, c := range conns {
		if c != nil {
			if err := c.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}
	}
	t.Logf("SETUP pool=%v concurrent n=%d wall_ms=%.1f per_conn_us=%.1f dial_mean_us=%.1f dial_max_us=%.1f conns_per_s=%.1f close_all_ms=%.1f",
		pool, conN, float64(conWall.Microseconds())/1e3, float64(conWall.Microseconds())/float64(conN),
		float64(sum.Microseconds())/float64(conN), float64(worst.Microseconds()),
		float64(conN)/conWall.Seconds(), float64(time.Since(t0).Microseconds())/1e3)
	t.Log(steps.report("concurrent"))
	for i := range conN {
		if errs[i] == nil && durs[i] <= 0 {
			t.Errorf("dial %d took no time", i)
		}
	}
}
