//go:build linux

package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// CPU time per message, per CPU. On Soft-RoCE the device is the CPU: rxe
// builds, checksums and copies every packet in the kernel of the CPU that
// sends or receives it, so a stream is bound by its busiest CPU, and
// whatever a process spends per message beside rxe's work comes out of the
// rate. The harness reads /proc/stat around each run on one host and
// reports, per CPU, the busy time (user, nice, system, irq, softirq) per
// message and the kernel's share of it (system, irq, softirq: rxe and the
// system calls). With the processes pinned, CPU 0 is the server's and CPU 1
// the client's. The run's process start and set-up are included (a few
// tens of milliseconds over a run of 0.5-1 s; -bw-bytes makes runs longer),
// and so is anything else the guest ran meanwhile.

// cpuTime is one CPU's busy and kernel time, in clock ticks.
type cpuTime struct{ busy, kernel uint64 }

// clockTick is the unit of /proc/stat (USER_HZ, 100 on every Linux ABI Go
// supports).
const clockTick = 10e3 // µs

// cpuTimes reads /proc/stat's per-CPU lines, indexed by CPU number; nil when
// it cannot be read.
func cpuTimes() []cpuTime {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	return parseCPUTimes(string(b))
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
}

// cpuPerMessage is what each CPU spent per message between two readings.
func cpuPerMessage(before, after []cpuTime, messages int) []CPUUse {
	if messages <= 0 || len(before) == 0 || len(after) != len(before) {
		return nil
	}
	out := make([]CPUUse, len(after))
	for i := range after {
		if after[i].busy < before[i].busy || after[i].kernel < before[i].kernel {
			return nil
		}
		out[i] = CPUUse{CPU: i,
			Busy:   float64(after[i].busy-before[i].busy) * clockTick / float64(messages),
			Kernel: float64(after[i].kernel-before[i].kernel) * clockTick / float64(messages)}
	}
	return out
}

// measure runs f and sets its sample's device packets (RDMA runs only: TCP
// puts none on the device) and CPU time per message (per round trip for
// latency) of messages messages.
func measure(messages int, rdma bool, f func() (*Sample, error)) (*Sample, error) {
	cpu0 := cpuTimes()
	if rdma {
		return countPackets(messages, func() (*Sample, error) { return withCPU(cpu0, messages, f) })
	}
	return withCPU(cpu0, messages, f)
}

func withCPU(before []cpuTime, messages int, f func() (*Sample, error)) (*Sample, error) {
	s, err := f()
	if err == nil && s != nil {
		s.CPU = cpuPerMessage(before, cpuTimes(), messages)
	}
	return s, err
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
		var busy, kernel []float64
		for _, s := range samples {
			if len(s.CPU) == n {
				busy = append(busy, s.CPU[i].Busy)
				kernel = append(kernel, s.CPU[i].Kernel)
			}
		}
		slices.Sort(busy)
		slices.Sort(kernel)
		out[i] = CPUUse{CPU: i, Busy: median(busy), Kernel: median(kernel)}
	}
	return out
}

// printCPU lists, per size, every column's CPU time per message by CPU:
// "busy/kernel" µs.
func (r *report) printCPU(w io.Writer, mp metricPlan) {
	unit := map[bool]string{true: "round trip", false: "message"}[mp.Metric == Latency]
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
				per = append(per, fmt.Sprintf("%.0f/%.0f", c.Busy, c.Kernel))
			}
			cells = append(cells, fmt.Sprintf("%s %s", o.Label, strings.Join(per, " ")))
		}
		if len(cells) == 0 {
			continue
		}
		if !header {
			fmt.Fprintf(w, "  CPU µs per %s, busy/kernel on each CPU (%s; set-up included):\n", unit, r.cpuRoles())
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
