//go:build linux && cgo

package rdma

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/cmsetup"
	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/testhooks"
	"golang.org/x/sys/unix"
)

// stepStats aggregates the step trace's reports per side and step.
type stepStats struct {
	mu      sync.Mutex
	order   []string
	samples map[string][]time.Duration
}

func newStepStats() *stepStats { return &stepStats{samples: map[string][]time.Duration{}} }

// install makes s receive the set-up steps from now on.
func (s *stepStats) install() {
	f := func(side, step string, d time.Duration) {
		k := side + ": " + step
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.samples[k]; !ok {
			s.order = append(s.order, k)
		}
		s.samples[k] = append(s.samples[k], d)
	}
	cmsetup.SetStepTrace(f)
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
// process holds its device context), without and with the QP pool:
// RDMA_SETUP_ROUNDS rounds (default 1), each running, for both modes in
// alternating order (so that the guest's drift weighs on both alike),
// RDMA_SETUP_SEQ (default 10) sequential dial+close cycles and then
// RDMA_SETUP_CONNS (default 10) concurrent dials. It reports per mode the
// median sequential dial, the median wall time of the concurrent rounds
// (per connection and connections per second: what compares with
// cmtime -c N) and the per-step times of dial and accept.
// scripts/setupbench runs it with larger counts next to rdma-core's cmtime.
//
// Before each measured phase the device is primed: RDMA_SETUP_CONNS
// connections dialled and closed, and with the pool their QPs back in the
// pool, which they join only at their TIMEWAIT_EXIT (the kernel CM's
// timewait after Close); both modes then wait until RDMA_SETUP_QUIET_MS
// (default 3000) after those closes, so that neither measures the other's
// disconnects. The figures with the pool are thus those of dials that come
// at least that long after earlier connections closed (steady churn),
// with a pool large enough for both ends of every measured connection
// (this process is both dialer and listener).
//
// With RDMA_SETUP_SERVER=host:port it dials a listener in another process
// instead (this binary run with RDMA_SETUP_LISTEN=host:port: setupServer).
// Tools over each measured round: RDMA_SETUP_CPUPROFILE=dir (a Go CPU
// profile), RDMA_SETUP_TRACE=dir (a runtime trace: go tool trace
// -pprof=sched / -pprof=syscall), RDMA_SETUP_PERF=dir (perf record of the
// whole guest; RDMA_SETUP_PERF_EVENTS=ev,... records those events, e.g.
// syscalls:sys_enter_write, instead of CPU samples).
func TestSetupProfile(t *testing.T) {
	seqN, conN := envInt("RDMA_SETUP_SEQ", 10), envInt("RDMA_SETUP_CONNS", 10)
	if os.Getenv("RDMA_SETUP_SEQ") == "0" { // concurrent rounds only (scripts/setupbench's pairs)
		seqN = 0
	}
	rounds := envInt("RDMA_SETUP_ROUNDS", 1)
	// The listener is in this process, or with RDMA_SETUP_SERVER=host:port
	// in a process of its own (setupServer), as cmtime's server is.
	addr := os.Getenv("RDMA_SETUP_SERVER")
	remote := addr != ""
	if !remote { // system-wide counts: a server process of its own holds objects
		checkLeaksAtEnd(t)
	}
	// Measure what users run: without the tests' allocation-site tracking
	// (a stack captured per buffer Get, which costs CPU), on a device
	// set up here.
	device.FlushLingering()
	testhooks.TrackAllocations.Store(false)
	defer testhooks.TrackAllocations.Store(true)
	if !remote {
		ln := listenTest(t, nil)
		wg := echoServer(ln)
		defer wg.Wait()
		defer ln.Close()
		addr = ln.Addr().String()
	}
	keep, err := Dial("rdma", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	if err := echo(keep, -1); err != nil {
		t.Fatal(err)
	}
	d := keep.dev
	size := 2 * max(seqN, conN) // QPs the pool holds before a measured phase
	primed := size              // pooled QPs a priming waits for: both ends' in this process, else the dialers'
	if remote {
		primed = size / 2
	}
	quiet := time.Duration(envInt("RDMA_SETUP_QUIET_MS", 3000)) * time.Millisecond

	type mode struct {
		pool               bool
		seq, walls         []time.Duration
		seqSteps, conSteps *stepStats
		reused, created    int
		closeSum           time.Duration
		seqWall            time.Duration
	}
	modes := []*mode{{pool: false}, {pool: true}}
	switch os.Getenv("RDMA_SETUP_MODES") { // scripts/setupbench's paired rounds measure one mode
	case "pool":
		modes = modes[1:]
	case "nopool":
		modes = modes[:1]
	}
	if d.Caps.CMConnectsQP {
		// The CM connects the QP there (iWARP): no QP is pooled.
		t.Logf("%s: the CM connects its QPs, so no QP pool: measuring without one", d.Name())
		modes = slices.DeleteFunc(modes, func(m *mode) bool { return m.pool })
	}
	for _, m := range modes {
		m.seqSteps, m.conSteps = newStepStats(), newStepStats()
	}
	t.Cleanup(func() { cmsetup.SetStepTrace(nil) })

	// setMode switches the device's pool on (size QPs) or off (emptied).
	setMode := func(m *mode) {
		if m.pool {
			d.QPMax.Store(int32(size))
			return
		}
		d.QPMax.Store(0)
		d.QPs.Empty()
	}
	// prime dials n connections at once and closes them, then waits for
	// their QPs to come back to the pool (for their ends to be gone without).
	prime := func(m *mode, n int) {
		cmsetup.SetStepTrace(nil) // the priming dials are not measured
		conns := make([]*Conn, n)
		var dw sync.WaitGroup
		for i := range n {
			dw.Add(1)
			go func() {
				defer dw.Done()
				c, err := Dial("rdma", addr)
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
		closed := time.Now()
		if m.pool {
			waitPool(t, d, "priming", func(_ device.QPPoolStats, n int) bool { return n >= primed })
		}
		// Both modes start quiet: the priming connections' disconnects and
		// timewaits done in the kernel (with the pool their ids live until
		// TIMEWAIT_EXIT; without it Close destroys the id but the kernel's
		// CM still holds the connection's timewait).
		settleDevices(rdmatest.Scale(15 * time.Second))
		time.Sleep(time.Until(closed.Add(quiet)))
	}
	count := func(m *mode, st0 device.QPPoolStats) {
		st, _ := poolStats(d)
		m.reused += st.Reused - st0.Reused
		m.created += st.Created - st0.Created
	}
	sequential := func(m *mode) {
		if seqN == 0 {
			return
		}
		prime(m, max(seqN, conN))
		st0, _ := poolStats(d)
		m.seqSteps.install()
		start := time.Now()
		for i := range seqN {
			t0 := time.Now()
			c, err := Dial("rdma", addr)
			if err != nil {
				t.Fatalf("sequential dial %d: %v", i, err)
			}
			t1 := time.Now()
			if err := c.Close(); err != nil {
				t.Fatalf("sequential close %d: %v", i, err)
			}
			m.seq = append(m.seq, t1.Sub(t0))
			m.closeSum += time.Since(t1)
		}
		m.seqWall += time.Since(start)
		cmsetup.SetStepTrace(nil)
		count(m, st0)
	}
	concurrent := func(m *mode) {
		prime(m, conN)
		st0, _ := poolStats(d)
		conns := make([]*Conn, conN)
		errs := make([]error, conN)
		m.conSteps.install()
		name := fmt.Sprintf("setup-pool%v-%d", m.pool, len(m.walls)) // of this round's files
		stopProfile := func() {}
		if dir := os.Getenv("RDMA_SETUP_CPUPROFILE"); dir != "" { // a CPU profile of each measured round
			f, err := os.Create(fmt.Sprintf("%s/%s.prof", dir, name))
			if err != nil {
				t.Fatal(err)
			}
			runtime.SetCPUProfileRate(envInt("RDMA_SETUP_CPUPROFILE_HZ", 100))
			if err := pprof.StartCPUProfile(f); err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			stopProfile = pprof.StopCPUProfile
		}
		// Every round starts right after a collection: otherwise whether the
		// pacer's next cycle falls inside the round would decide its time
		// (a collection costs a round far more than its share), and a
		// change in what a dial allocates would move that phase. What
		// collections cost per connection follows from the bytes
		// allocated (SETUPALLOC).
		runtime.GC()
		stopPerf := startPerf(t, name)
		stopEvents := recordEvents(t, name)
		stopTrace := func() {}
		if dir := os.Getenv("RDMA_SETUP_TRACE"); dir != "" { // the Go scheduler's view of each measured round
			f, err := os.Create(fmt.Sprintf("%s/%s.trace", dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if err := trace.Start(f); err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			stopTrace = trace.Stop
		}
		var dw sync.WaitGroup
		cpu0 := readCPUStat()
		var ru0, ru1 syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
		threads0 := osThreads()
		// The listener's process, when it is one of its own
		// (RDMA_SETUP_SERVER_PID, from scripts/setupbench), and this one.
		srvPID := os.Getenv("RDMA_SETUP_SERVER_PID")
		selfT0, srvT0 := threadCPU("self"), threadCPU(srvPID)
		self0, srv0 := procCPU(selfT0), procCPU(srvT0)
		selfF0, srvF0 := minorFaults("self"), minorFaults(srvPID)
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		start := time.Now()
		for i := range conN {
			dw.Add(1)
			go func() {
				defer dw.Done()
				conns[i], errs[i] = Dial("rdma", addr)
			}()
		}
		dw.Wait()
		wall := time.Since(start)
		selfT1, srvT1 := threadCPU("self"), threadCPU(srvPID)
		self1, srv1 := procCPU(selfT1), procCPU(srvT1)
		selfF1, srvF1 := minorFaults("self"), minorFaults(srvPID)
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
		runtime.ReadMemStats(&ms1)
		stopProfile() // the dials only, not the closes below
		stopTrace()
		stopPerf()
		stopEvents()
		if cpu0 != nil {
			if cpu1 := readCPUStat(); cpu1 != nil {
				t.Logf("guest CPU during the round (jiffies, all CPUs): %s", cpuDelta(cpu0, cpu1))
			}
		}
		usr := time.Duration(syscall.TimevalToNsec(ru1.Utime) - syscall.TimevalToNsec(ru0.Utime))
		sys := time.Duration(syscall.TimevalToNsec(ru1.Stime) - syscall.TimevalToNsec(ru0.Stime))
		t.Logf("SETUPCPU process CPU during the round: user %v system %v, per connection %.0f us (this process's ends), context switches %d voluntary %d involuntary, threads %d -> %d",
			usr, sys, float64((usr+sys).Microseconds())/float64(conN), ru1.Nvcsw-ru0.Nvcsw, ru1.Nivcsw-ru0.Nivcsw, threads0, osThreads())
		if srvPID != "" && srv0 >= 0 && srv1 >= 0 && self0 >= 0 && self1 >= 0 {
			t.Logf("SETUPCPU2 threads' CPU per connection during the round: dialers' process %.0f us, listener's process %.0f us, both %.0f us",
				float64((self1-self0).Microseconds())/float64(conN), float64((srv1-srv0).Microseconds())/float64(conN),
				float64((self1-self0+srv1-srv0).Microseconds())/float64(conN))
			t.Logf("SETUPTHREADS busiest threads (tid:ms) dialers' process %s; listener's process %s; minor page faults per connection %.1f and %.1f",
				busiest(selfT0, selfT1), busiest(srvT0, srvT1), float64(selfF1-selfF0)/float64(conN), float64(srvF1-srvF0)/float64(conN))
		} else if self0 >= 0 && self1 >= 0 {
			t.Logf("SETUPCPU2 threads' CPU per connection during the round: this process (both ends) %.0f us", float64((self1-self0).Microseconds())/float64(conN))
			t.Logf("SETUPTHREADS busiest threads (tid:ms) %s; minor page faults per connection %.1f", busiest(selfT0, selfT1), float64(selfF1-selfF0)/float64(conN))
		}
		// Go memory allocated per connection (both ends when the listener
		// is in this process) and collections during the round.
		t.Logf("SETUPALLOC per connection: %.0f bytes in %.0f allocations (this process's ends); collections %d",
			float64(ms1.TotalAlloc-ms0.TotalAlloc)/float64(conN), float64(ms1.Mallocs-ms0.Mallocs)/float64(conN), ms1.NumGC-ms0.NumGC)
		cmsetup.SetStepTrace(nil)
		m.walls = append(m.walls, wall)
		count(m, st0)
		for i, c := range conns {
			if errs[i] != nil {
				t.Errorf("concurrent dial %d: %v", i, errs[i])
			} else if err := c.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}
		t.Logf("SETUP pool=%v concurrent n=%d wall_ms=%.1f", m.pool, conN, float64(wall.Microseconds())/1e3)
	}
	for r := range rounds {
		order := modes
		if r%2 == 1 && len(modes) == 2 {
			order = []*mode{modes[1], modes[0]}
		}
		for _, m := range order {
			setMode(m)
			sequential(m)
			concurrent(m)
		}
	}
	for _, m := range modes {
		n := len(m.seq)
		if n == 0 {
			w := median(m.walls)
			t.Logf("SETUP pool=%v concurrent n=%d rounds=%d wall_median_ms=%.1f per_conn_us=%.1f conns_per_s=%.1f",
				m.pool, conN, rounds, w/1e3, w/float64(conN), float64(conN)/(w/1e6))
			t.Log(m.conSteps.report(fmt.Sprintf("pool=%v concurrent", m.pool)))
			continue
		}
		t.Logf("SETUP pool=%v sequential n=%d dial_median_us=%.1f close_mean_us=%.1f conns_per_s=%.1f (QPs reused %d, created %d in all)",
			m.pool, n, median(m.seq), float64(m.closeSum.Microseconds())/float64(n), float64(n)/m.seqWall.Seconds(),
			m.reused, m.created)
		w := median(m.walls)
		t.Logf("SETUP pool=%v concurrent n=%d rounds=%d wall_median_ms=%.1f per_conn_us=%.1f conns_per_s=%.1f",
			m.pool, conN, rounds, w/1e3, w/float64(conN), float64(conN)/(w/1e6))
		t.Log(m.seqSteps.report(fmt.Sprintf("pool=%v sequential", m.pool)))
		t.Log(m.conSteps.report(fmt.Sprintf("pool=%v concurrent", m.pool)))
	}
	for _, m := range modes {
		if m.pool && m.reused == 0 {
			t.Error("with the pool on, no dial reused a pooled QP")
		}
		if !m.pool && m.reused != 0 {
			t.Errorf("with the pool off, %d QPs were reused", m.reused)
		}
	}
}

// osThreads is the process's thread count (/proc/self/status), or -1.
func osThreads() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	_, rest, _ := strings.Cut(string(b), "\nThreads:")
	n, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(rest, "\n", 2)[0]))
	if err != nil {
		return -1
	}
	return n
}

// threadCPU is the CPU time each live thread of a process has run, by
// thread id (/proc/PID/task/*/schedstat), or nil (also for no pid).
func threadCPU(pid string) map[string]time.Duration {
	if pid == "" {
		return nil
	}
	tasks, err := os.ReadDir("/proc/" + pid + "/task")
	if err != nil {
		return nil
	}
	m := map[string]time.Duration{}
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/" + pid + "/task/" + task.Name() + "/schedstat")
		if err != nil {
			continue // the thread exited
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				m[task.Name()] = time.Duration(ns)
			}
		}
	}
	return m
}

// busiest lists the threads that ran most between two threadCPU reads,
// in milliseconds.
func busiest(a, b map[string]time.Duration) string {
	type th struct {
		tid string
		d   time.Duration
	}
	var ts []th
	for tid, d := range b {
		ts = append(ts, th{tid, d - a[tid]})
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].d > ts[j].d })
	var out []string
	for i, t := range ts {
		if i == 6 {
			break
		}
		out = append(out, fmt.Sprintf("%s:%.1f", t.tid, float64(t.d.Microseconds())/1e3))
	}
	return strings.Join(out, " ")
}

// minorFaults is a process's minor page faults so far (/proc/PID/stat's
// tenth field), or -1.
func minorFaults(pid string) int64 {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return -1
	}
	_, rest, ok := strings.Cut(string(b), ") ") // the command may hold spaces
	f := strings.Fields(rest)
	if !ok || len(f) < 8 {
		return -1
	}
	n, err := strconv.ParseInt(f[7], 10, 64) // fields from the state (third) on
	if err != nil {
		return -1
	}
	return n
}

// procCPU is the CPU time a process's live threads have run, the sum of
// a threadCPU read (nanosecond resolution: /proc/PID/stat's clock ticks
// are too coarse for a round of a few dials), or -1 if it failed.
func procCPU(threads map[string]time.Duration) time.Duration {
	if threads == nil {
		return -1
	}
	var sum time.Duration
	for _, d := range threads {
		sum += d
	}
	return sum
}

// readCPUStat returns /proc/stat's aggregate cpu line (user nice system idle
// iowait irq softirq ...), or nil.
func readCPUStat() []int64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return nil
	}
	var out []int64
	for _, x := range f[1:8] {
		n, _ := strconv.ParseInt(x, 10, 64)
		out = append(out, n)
	}
	return out
}

func cpuDelta(a, b []int64) string {
	names := []string{"user", "nice", "system", "idle", "iowait", "irq", "softirq"}
	var sb strings.Builder
	for i, n := range names {
		fmt.Fprintf(&sb, "%s %d ", n, b[i]-a[i])
	}
	return sb.String()
}

// startPerf, with RDMA_SETUP_PERF set to a directory, records the whole
// guest's CPU (perf record -a, kernel stacks included: a round's CM and
// rxe work runs in kernel threads outside this process) until the returned
// func is called, into DIR/NAME.data. Without it, or without perf, it does
// nothing.
func startPerf(t *testing.T, name string) (stop func()) {
	dir := os.Getenv("RDMA_SETUP_PERF")
	if dir == "" {
		return func() {}
	}
	out := fmt.Sprintf("%s/%s.data", dir, name)
	cmd := exec.Command("perf", "record", "-q", "-a", "-g", "-e", "cpu-clock", "-F", "2000", "-o", out)
	if ev := os.Getenv("RDMA_SETUP_PERF_EVENTS"); ev != "" { // e.g. system-call tracepoints, each recorded
		// In CLOCK_MONOTONIC, the clock RDMA_SETUP_EVENTS records reads in.
		cmd = exec.Command("perf", "record", "-q", "-a", "-k", "CLOCK_MONOTONIC", "-e", ev, "-o", out)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Logf("perf: %v", err)
		return func() {}
	}
	// perf opens its events after it starts: until its output file has a
	// header, the round would start unrecorded.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if st, err := os.Stat(out); err == nil && st.Size() > 0 {
			break
		}
	}
	time.Sleep(200 * time.Millisecond)
	return func() {
		cmd.Process.Signal(syscall.SIGINT)
		cmd.Wait()
	}
}

// setupServer is scripts/setupbench's server process (RDMA_SETUP_LISTEN=
// host:port): an echo listener with the default Config, as TestSetupProfile's
// own, until its standard input closes or it is killed. It prints
// "LISTENING host:port" once it accepts.
func setupServer(addr string) {
	var lc ListenConfig
	if os.Getenv("RDMA_SETUP_SERVER_POLLEVENT") != "" { // its readers never spin
		lc.Config.PollMode = PollEvent
	}
	ln, err := lc.Listen(context.Background(), "rdma", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "setup server:", err)
		os.Exit(1)
	}
	wg := echoServer(ln)
	steps := newStepStats()
	steps.install()
	fmt.Println("LISTENING", ln.Addr())
	io.Copy(io.Discard, os.Stdin)
	fmt.Println(steps.report("setup server, every accept"))
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	fmt.Printf("setup server: threads %d, collections %d, heap %d KB, minor faults %d, CPU user %v system %v\n",
		osThreads(), ms.NumGC, ms.HeapAlloc>>10, ru.Minflt,
		time.Duration(syscall.TimevalToNsec(ru.Utime)), time.Duration(syscall.TimevalToNsec(ru.Stime)))
	ln.Close()
	wg.Wait()
	os.Exit(0)
}

// recordEvents, with RDMA_SETUP_EVENTS=dir, writes every CM event this
// process reads during a round to DIR/NAME.events, one line each: the
// CLOCK_MONOTONIC time (ns) of its read off the kernel's channel, its type,
// and the id's local and peer ports. Recorded with perf's clock set to the
// same (perf record -k CLOCK_MONOTONIC over rdma_cma's tracepoints), it
// tells how long each event waited in the kernel's channel before the
// process read it.
func recordEvents(t *testing.T, name string) (stop func()) {
	dir := os.Getenv("RDMA_SETUP_EVENTS")
	if dir == "" {
		return func() {}
	}
	var mu sync.Mutex
	var lines []string
	seen := map[string]bool{}
	f := func(ev rdmacm.Event) {
		var ts unix.Timespec
		if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) != nil {
			return
		}
		read := ts.Nano() - int64(time.Since(ev.Read))
		key := fmt.Sprintf("%s %d %d", ev.Type, ev.ID.LocalAddr().Port(), ev.ID.PeerAddr().Port())
		mu.Lock()
		defer mu.Unlock()
		if !seen[key] { // a connect request is traced twice (to the listener's loop, through it)
			seen[key] = true
			lines = append(lines, fmt.Sprintf("%d %s", read, key))
		}
	}
	cmsetup.SetEventTrace(f)
	return func() {
		cmsetup.SetEventTrace(nil)
		mu.Lock()
		defer mu.Unlock()
		if err := os.WriteFile(fmt.Sprintf("%s/%s.events", dir, name), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Errorf("events: %v", err)
		}
	}
}
