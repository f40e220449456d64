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
	mu      sync.Mutex
	order   []string
	samples map[string][]time.Duration
}

func traceSteps(t testing.TB) *stepStats {
	s := &stepStats{samples: map[string][]time.Duration{}}
	f := func(side, step string, d time.Duration) {
		k := side + ": " + step
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.samples[k]; !ok {
			s.order = append(s.order, k)
		}
		s.samples[k] = append(s.samples[k], d)
	}
	setupTrace.Store(&f)
	t.Cleanup(func() { setupTrace.Store(nil) })
	return s
}

// median is the median of ds in microseconds (ds is sorted in place).
func median(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	if n := len(ds); n%2 == 0 {
		return float64((ds[n/2-1] + ds[n/2]).Microseconds()) / 2
	}
	return float64(ds[len(ds)/2].Microseconds())
}

// report writes one line per step: count, median, mean and max in
// microseconds, and a total per side of the medians and of the means (the
// guest's outliers, a page fault or a descheduled vCPU, weigh on the means).
func (s *stepStats) report(title string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%s: per-step set-up times (us)\n", title)
	keys := append([]string(nil), s.order...)
	sort.SliceStable(keys, func(i, j int) bool { return side(keys[i]) < side(keys[j]) })
	med, mean := map[string]float64{}, map[string]float64{}
	for _, k := range keys {
		ds := s.samples[k]
		var sum time.Duration
		for _, d := range ds {
			sum += d
		}
		m := float64(sum.Microseconds()) / float64(len(ds))
		p50 := median(ds)
		if side(k) != "endpoint" { // part of "new conn"
			med[side(k)] += p50
			mean[side(k)] += m
		}
		fmt.Fprintf(&b, "  %-40s n=%-5d median=%9.1f mean=%9.1f max=%9.1f\n", k, len(ds), p50, m,
			float64(ds[len(ds)-1].Microseconds()))
	}
	for _, sd := range []string{"dial", "accept"} {
		fmt.Fprintf(&b, "  %-40s median=%9.1f mean=%9.1f\n", sd+": total", med[sd], mean[sd])
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
		saved := setupTrace.Swap(nil) // the priming dials are not measured
		defer setupTrace.Store(saved)
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
	dials := make([]time.Duration, 0, seqN)
	var closeSum time.Duration
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
		dials = append(dials, t1.Sub(t0))
		closeSum += time.Since(t1)
	}
	seqWall := time.Since(start)
	st, pooled := poolStats(d)
	t.Logf("SETUP pool=%v sequential: QPs reused %d, created %d (%d pooled after)", pool,
		st.Reused-st0.Reused, st.Created-st0.Created, pooled)
	var dialSum time.Duration
	for _, x := range dials {
		dialSum += x
	}
	t.Logf("SETUP pool=%v sequential n=%d dial_median_us=%.1f dial_mean_us=%.1f close_mean_us=%.1f conns_per_s=%.1f",
		pool, seqN, median(dials), float64(dialSum.Microseconds())/float64(seqN),
		float64(closeSum.Microseconds())/float64(seqN), float64(seqN)/seqWall.Seconds())
	t.Log(steps.report("sequential"))

	// Concurrent: RDMA_SETUP_ROUNDS rounds (default 1) of conN dials at
	// once; the wall time of a round is what compares with cmtime -c conN.
	rounds := envInt("RDMA_SETUP_ROUNDS", 1)
	steps = traceSteps(t)
	var walls []time.Duration
	for r := range rounds {
		prime(conN)
		st0, _ = poolStats(d)
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
		walls = append(walls, conWall)
		for i := range conN {
			if errs[i] != nil {
				t.Errorf("concurrent dial %d: %v", i, errs[i])
			} else if durs[i] <= 0 {
				t.Errorf("dial %d took no time", i)
			}
		}
		st, _ = poolStats(d)
		t0 := time.Now()
		for _, c := range conns {
			if c != nil {
				if err := c.Close(); err != nil {
					t.Errorf("close: %v", err)
				}
			}
		}
		t.Logf("SETUP pool=%v concurrent round %d n=%d wall_ms=%.1f per_conn_us=%.1f dial_median_us=%.1f conns_per_s=%.1f close_all_ms=%.1f (QPs reused %d, created %d)",
			pool, r, conN, float64(conWall.Microseconds())/1e3, float64(conWall.Microseconds())/float64(conN),
			median(durs), float64(conN)/conWall.Seconds(), float64(time.Since(t0).Microseconds())/1e3,
			st.Reused-st0.Reused, st.Created-st0.Created)
	}
	w := median(walls)
	t.Logf("SETUP pool=%v concurrent n=%d rounds=%d wall_median_ms=%.1f per_conn_us=%.1f conns_per_s=%.1f",
		pool, conN, rounds, w/1e3, w/float64(conN), float64(conN)/(w/1e6))
	t.Log(steps.report("concurrent"))
}
