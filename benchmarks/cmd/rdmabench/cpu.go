//go:build linux

package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"
)

// CPU time per message, per CPU. On Soft-RoCE the device is the CPU: rxe
// builds, checksums and copies every packet in the kernel of the CPU that
// sends or receives it, so a stream is bound by its busiest CPU, and
// whatever a process spends per message beside rxe's work comes out of the
// rate. The harness samples a packet counter every sampleEvery, and
// /proc/stat every cpuEvery-th sample, through each run on one host and
// reports, per CPU, the busy
// time (user, nice, system, irq, softirq) per message and the kernel's
// share of it (system, irq, softirq: rxe and the system calls), over the
// run's active window: from the first to the last interval in which the
// counter moved at a quarter or more of its typical rate (the median of
// the intervals in which it moved), so that the processes' start, set-up
// and teardown are not counted (a default run is about a second, its
// set-up a large part of it). The CPU times are those of the /proc/stat
// readings that bound the largest span inside that window, and the
// messages charged to them are the run's messages in proportion to the
// packets counted in that span: /proc/stat is the expensive reading (the
// kernel formats every CPU's and interrupt's counters, slowly under
// emulation), and the harness's CPU is taken from the CPUs it measures,
// so it reads it at a fifth of the counter's rate. The counter is the RDMA ports'
// sent_pkts (packets.go) for RDMA runs and the loopback's tx_packets for
// TCP. With the processes pinned, CPU 0 is the server's and CPU 1 the
// client's. Latency runs (tens of milliseconds) are not sampled, and
// windows shorter than minCPUWindow report nothing: /proc/stat counts
// in 10 ms ticks.

const (
	sampleEvery  = 10 * time.Millisecond
	cpuEvery     = 5 // /proc/stat on every fifth sample: 50 ms
	minCPUWindow = 300 * time.Millisecond
)

// cpuTime is one CPU's busy and kernel time, in clock ticks.
type cpuTime struct{ busy, kernel uint64 }

// clockTick is the unit of /proc/stat (USER_HZ, 100 on every Linux ABI Go
// supports).
const clockTick = 10e3 // µs

// cpuTimes reads /proc/stat's per-CPU lines, indexed by CPU number; nil when
// it cannot be read.
func cpuTimes() []cpuTime {
	b, err := kernelStats.read("/proc/stat")
	if err != nil {
		return nil
	}
	return parseCPUTimes(b)
}

func parseCPUTimes(stat string) []cpuTime {
	var out []cpuTime
	for _, line := range strings.Split(stat, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		cpu, err := strconv.Atoi(f[0][3:])
		if err != nil || cpu < 0 || cpu > 4096 {
			continue
		}
		// user nice system idle iowait irq softirq ...
		var v [7]uint64
		for i := range v {
			if v[i], err = strconv.ParseUint(f[1+i], 10, 64); err != nil {
				return nil
			}
		}
		for len(out) <= cpu {
			out = append(out, cpuTime{})
		}
		kernel := v[2] + v[5] + v[6]
		out[cpu] = cpuTime{busy: v[0] + v[1] + kernel, kernel: kernel}
	}
	return out
}

// CPUUse is one CPU's busy time per message (round trip) of a run, µs.
type CPUUse struct {
	CPU    int     `json:"cpu"`
	Busy   float64 `json:"busy_us"`
	Kernel float64 `json:"kernel_us"` // of Busy: system, irq and softirq
	// Share is the CPU's busy time over the window's wall time (about 0
	// to 1; whole 10 ms ticks can take it a little past 1):
	// whether it was saturated, independent of how many messages the
	// packet counter put inside the window.
	Share float64 `json:"busy_share"`
}

// cpuPerMessage is what each CPU spent per message between two readings
// wall apart.
func cpuPerMessage(before, after []cpuTime, messages float64, wall time.Duration) []CPUUse {
	if messages <= 0 || len(before) == 0 || len(after) != len(before) {
		return nil
	}
	out := make([]CPUUse, len(after))
	for i := range after {
		if after[i].busy < before[i].busy || after[i].kernel < before[i].kernel {
			return nil
		}
		busy := float64(after[i].busy-before[i].busy) * clockTick // µs
		out[i] = CPUUse{CPU: i,
			Busy:   busy / messages,
			Kernel: float64(after[i].kernel-before[i].kernel) * clockTick / messages}
		if wall > 0 {
			out[i].Share = busy / float64(wall.Microseconds())
		}
	}
	return out
}

// measure runs f and sets its sample's device packets (RDMA runs only: TCP
// puts none on the device) and CPU time per message of messages messages
// (not for latency: a latency run is too short for /proc/stat's ticks).
func measure(m Metric, messages int, rdma bool, f func() (*Sample, error)) (*Sample, error) {
	if m == Latency {
		if rdma {
			return countPackets(messages, f)
		}
		return f()
	}
	counter := loopbackPackets
	if rdma {
		counter = devicePackets
	}
	sm := startSampler(counter)
	run := f
	if rdma {
		run = func() (*Sample, error) { return countPackets(messages, f) }
	}
	s, err := run()
	window := sm.stop()
	if err == nil && s != nil {
		s.CPU = window.perMessage(messages)
		if s.CPU != nil {
			s.Harness = window.selfShare()
		}
	}
	return s, err
}

// loopbackPackets is the loopback interface's tx_packets (TCP runs).
func loopbackPackets() (uint64, bool) {
	b, err := kernelStats.read("/sys/class/net/lo/statistics/tx_packets")
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseUint(strings.TrimSpace(b), 10, 64)
	return v, err == nil
}

// sample is one reading of the activity counter and the CPUs.
type sample struct {
	at   time.Time
	pkts uint64
	cpu  []cpuTime
	self time.Duration // this process's CPU time (user and system)
}

// selfCPU is this process's CPU time so far.
func selfCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type sampler struct {
	done    chan struct{}
	stopped chan []sample
}

// startSampler reads counter every sampleEvery, and /proc/stat with this
// process's CPU time on the first, every cpuEvery-th and the last reading,
// until stop.
func startSampler(counter func() (uint64, bool)) *sampler {
	sm := &sampler{done: make(chan struct{}), stopped: make(chan []sample, 1)}
	read := func(withCPU bool) (sample, bool) {
		n, ok := counter()
		s := sample{at: time.Now(), pkts: n}
		if withCPU {
			s.cpu, s.self = cpuTimes(), selfCPU()
			ok = ok && s.cpu != nil
		}
		return s, ok
	}
	go func() {
		var out []sample
		add := func(withCPU bool) bool {
			s, ok := read(withCPU)
			if ok {
				out = append(out, s)
			}
			return ok
		}
		ok := add(true)
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for n := 1; ok; n++ {
			select {
			case <-sm.done:
				add(true)
				sm.stopped <- out
				return
			case <-t.C:
				ok = add(n%cpuEvery == 0)
			}
		}
		<-sm.done
		sm.stopped <- nil // a reading failed: no window
	}()
	return sm
}

// stop ends the sampling and returns the active window.
func (sm *sampler) stop() cpuWindow {
	close(sm.done)
	return activeWindow(<-sm.stopped)
}

// cpuWindow is the CPU time spent between two samples with CPU times,
// which carried share of the active window's packets.
type cpuWindow struct {
	from, to sample
	share    float64 // of the active window's packets, those between from and to
	ok       bool
}

// activeWindow is the span of samples over which the counter moved at a
// quarter or more of its typical rate: the transfer, without the
// connection's set-up and teardown and without what a process does
// between them with no traffic (perftest measures its CPU's clock by
// spinning for a while after it connects).
func activeWindow(ss []sample) cpuWindow {
	if len(ss) < 2 {
		return cpuWindow{}
	}
	rate := func(i int) float64 { // packets per second over interval (i-1, i]
		d := ss[i].at.Sub(ss[i-1].at).Seconds()
		if d <= 0 || ss[i].pkts < ss[i-1].pkts {
			return 0
		}
		return float64(ss[i].pkts-ss[i-1].pkts) / d
	}
	// The typical rate is the median of the intervals with traffic, not
	// the fastest: two samples taken close together (a late tick, the last
	// one at stop) can make any interval's rate look many times the rest.
	var moving []float64
	for i := 1; i < len(ss); i++ {
		if r := rate(i); r > 0 {
			moving = append(moving, r)
		}
	}
	if len(moving) == 0 {
		return cpuWindow{}
	}
	slices.Sort(moving)
	typical := median(moving)
	first, last := -1, -1
	for i := 1; i < len(ss); i++ {
		if rate(i) >= typical/4 {
			if first < 0 {
				first = i - 1
			}
			last = i
		}
	}
	// The readings with CPU times that bound the largest span inside it.
	from, to := -1, -1
	for i := first; i <= last; i++ {
		if ss[i].cpu != nil {
			if from < 0 {
				from = i
			}
			to = i
		}
	}
	span := float64(ss[last].pkts - ss[first].pkts)
	if from < 0 || to <= from || span <= 0 {
		return cpuWindow{}
	}
	return cpuWindow{from: ss[from], to: ss[to], share: float64(ss[to].pkts-ss[from].pkts) / span, ok: true}
}

// perMessage is each CPU's time per message over the window; nil when the
// window is too short to say.
func (w cpuWindow) perMessage(messages int) []CPUUse {
	if !w.ok || w.to.at.Sub(w.from.at) < minCPUWindow || w.share <= 0 {
		return nil
	}
	return cpuPerMessage(w.from.cpu, w.to.cpu, float64(messages)*w.share, w.to.at.Sub(w.from.at))
}

// selfShare is the harness's own CPU time over the window's wall time.
func (w cpuWindow) selfShare() float64 {
	wall := w.to.at.Sub(w.from.at)
	if !w.ok || wall <= 0 || w.to.self < w.from.self {
		return 0
	}
	return float64(w.to.self-w.from.self) / float64(wall)
}

// medianCPU is the per-CPU median over samples (those that have the same
// CPUs as the first).
func medianCPU(samples []*Sample) []CPUUse {
	if len(samples) == 0 || len(samples[0].CPU) == 0 {
		return nil
	}
	n := len(samples[0].CPU)
	out := make([]CPUUse, n)
	for i := range out {
		var busy, kernel, share []float64
		for _, s := range samples {
			if len(s.CPU) == n {
				busy = append(busy, s.CPU[i].Busy)
				kernel = append(kernel, s.CPU[i].Kernel)
				share = append(share, s.CPU[i].Share)
			}
		}
		slices.Sort(busy)
		slices.Sort(kernel)
		slices.Sort(share)
		out[i] = CPUUse{CPU: i, Busy: median(busy), Kernel: median(kernel), Share: median(share)}
	}
	return out
}

// printCPU lists, per size, every column's CPU time per message by CPU:
// "busy/kernel" µs, then the CPU's busy share of the window.
func (r *report) printCPU(w io.Writer, mp metricPlan) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := false
	for _, size := range mp.Sizes {
		var cells []string
		for _, o := range mp.runners() {
			a := r.get(mp.Metric, size, o.Label)
			if a == nil || len(a.CPU) == 0 {
				continue
			}
			var per []string
			for _, c := range a.CPU {
				per = append(per, fmt.Sprintf("%.0f/%.0f %.0f%%", c.Busy, c.Kernel, 100*c.Share))
			}
			cells = append(cells, fmt.Sprintf("%s %s (harness %.0f%%)", o.Label, strings.Join(per, " "), 100*a.Harness))
		}
		if len(cells) == 0 {
			continue
		}
		if !header {
			fmt.Fprintf(w, "  CPU µs per message, busy/kernel, and busy share of the window, on each CPU (%s; the active window of each run; the harness's own share of a CPU, counted in them):\n", r.cpuRoles())
			header = true
		}
		fmt.Fprintf(tw, "  %s\t%s\n", sizeString(size), strings.Join(cells, "\t"))
	}
	tw.Flush()
}

// cpuRoles says which process ran on which CPU.
func (r *report) cpuRoles() string {
	if r.h.serverCPU < 0 {
		return "not pinned"
	}
	return fmt.Sprintf("server on CPU %d, client on CPU %d", r.h.serverCPU, r.h.clientCPU)
}
