//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// report holds the aggregated results: per metric, size and runner, the
// median over the rounds, and the paired ratios.
type report struct {
	h     *harness
	plan  []metricPlan
	cells map[cellKey]*cell
	agg   map[cellKey]*aggregate
	wall  time.Duration
	when  time.Time
}

// aggregate is the median over the rounds of each statistic.
type aggregate struct {
	Value, P99, P999, Avg, Check float64
	Interval                     interval           // Value with its interval
	Rounds                       []roundValue       // each round's value
	Packets                      float64            // device packets per message (packets.go)
	CPU                          []CPUUse           // CPU time per message by CPU (cpu.go)
	Harness                      float64            // the harness's own CPU share over the window
	Reps                         []float64          // each repetition's value
	Counters                     map[string]float64 // median per key over the repetitions
	Errs                         []string
}

func (h *harness) report(plan []metricPlan, cells map[cellKey]*cell, wall time.Duration) *report {
	r := &report{h: h, plan: plan, cells: cells, agg: map[cellKey]*aggregate{}, wall: wall, when: time.Now()}
	for k, c := range cells {
		a := &aggregate{Errs: c.Errs}
		if len(c.Samples) > 0 {
			field := func(f func(*Sample) float64) float64 {
				v := make([]float64, len(c.Samples))
				for i, s := range c.Samples {
					v[i] = f(s)
				}
				slices.Sort(v)
				return median(v)
			}
			a.Value = field(func(s *Sample) float64 { return s.Value })
			a.P99 = field(func(s *Sample) float64 { return s.P99 })
			a.P999 = field(func(s *Sample) float64 { return s.P999 })
			a.Avg = field(func(s *Sample) float64 { return s.Avg })
			a.Check = field(func(s *Sample) float64 { return s.Check })
			a.Packets = field(func(s *Sample) float64 { return s.Packets })
			a.CPU = medianCPU(c.Samples)
			a.Harness = field(func(s *Sample) float64 { return s.Harness })
			for i, s := range c.Samples {
				a.Reps = append(a.Reps, s.Value)
				round := i + 1
				if i < len(c.Rounds) {
					round = c.Rounds[i]
				}
				a.Rounds = append(a.Rounds, roundValue{Round: round, Value: s.Value})
			}
			a.Interval = medianInterval(a.Reps)
			if c.Samples[0].Counters != nil {
				a.Counters = map[string]float64{}
				for key := range c.Samples[0].Counters {
					a.Counters[key] = field(func(s *Sample) float64 { return s.Counters[key] })
				}
			}
		}
		r.agg[k] = a
	}
	return r
}

// get is the aggregate of a runner at a size, nil if it never succeeded.
func (r *report) get(m Metric, size int, label string) *aggregate {
	a := r.agg[cellKey{m, size, label}]
	if a == nil || len(a.Reps) == 0 {
		return nil
	}
	return a
}

// ratio is ours/baseline at a size: the median of the per-round paired
// ratios with its interval; N is 0 when no round has both.
func (r *report) ratio(m Metric, size int, ours, base string) interval {
	oa, ba := r.get(m, size, ours), r.get(m, size, base)
	if oa == nil || ba == nil {
		return interval{}
	}
	v := pairedRatios(oa.Rounds, ba.Rounds)
	if len(v) == 0 {
		return interval{}
	}
	return medianInterval(v)
}

// goalResult is a goal with its verdict, for the table and the JSON.
type goalResult struct {
	goal
	Ratio   interval `json:"ratio"`
	Verdict string   `json:"verdict"` // met, missed or undecided
}

func (r *report) goalResults() []goalResult {
	var out []goalResult
	for _, g := range r.h.goals {
		gr := goalResult{goal: g, Verdict: goalUndecided}
		base := g.Baseline
		for _, mp := range r.plan {
			for _, b := range mp.Baselns {
				if mp.Metric == g.Metric && strings.TrimSuffix(b.Label, " -R") == g.Baseline {
					base = b.Label
				}
			}
		}
		gr.Ratio = r.ratio(g.Metric, g.Size, g.Case, base)
		gr.Verdict = g.verdict(gr.Ratio)
		out = append(out, gr)
	}
	return out
}

func (r *report) failures() int {
	n := 0
	for _, c := range r.cells {
		n += len(c.Errs)
	}
	return n
}

// context is one line on how the figures were taken.
func (r *report) context() string {
	pin := "not pinned"
	if r.h.serverCPU >= 0 {
		pin = fmt.Sprintf("servers pinned to CPU %d, clients to CPU %d", r.h.serverCPU, r.h.clientCPU)
	}
	spin := "library default PollSpin"
	if r.h.spin != 0 {
		spin = "PollSpin " + r.h.spin.String()
	}
	procs := "GOMAXPROCS Go's default"
	if r.h.procs > 0 {
		procs = fmt.Sprintf("GOMAXPROCS %d", r.h.procs)
	}
	where := r.h.addr
	if r.h.remote != nil {
		where = fmt.Sprintf("two hosts: clients on %s, servers on %s", r.h.addr, r.h.remote.peer)
	}
	return fmt.Sprintf("%s on %s, %d CPUs, %s; medians of %s; depth %d; ours: %s, %s",
		deviceName(), where, runtime.NumCPU(), pin, r.h.roundsText(), r.h.depth, spin, procs)
}

func fmtVal(m Metric, v float64) string {
	switch {
	case m == Rate || m == AtomicRate:
		return fmt.Sprintf("%.4f", v)
	case v >= 1000:
		return fmt.Sprintf("%.0f", v)
	case v >= 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func fmtRatio(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0fx", v)
	}
	if v >= 10 {
		return fmt.Sprintf("%.1fx", v)
	}
	return fmt.Sprintf("%.2fx", v)
}

// cellText is a table cell: the median, for latency with [p99 p99.9].
func cellText(m Metric, a *aggregate) string {
	if a == nil {
		return "FAILED"
	}
	s := fmtVal(m, a.Value)
	if a.unstable() {
		s += "!"
	}
	if m.latencyLike() {
		s += fmt.Sprintf(" (%s) [%s %s]", fmtVal(m, a.Avg), fmtVal(m, a.P99), fmtVal(m, a.P999))
	}
	if len(a.Errs) > 0 {
		s += fmt.Sprintf(" (%d failed)", len(a.Errs))
	}
	return s
}

func (r *report) printTable(w io.Writer) {
	fmt.Fprintf(w, "\nrdmabench: %s\n", r.context())
	for _, mp := range r.plan {
		m := mp.Metric
		fmt.Fprintf(w, "\n%s, %s", m.Title(), m.Unit())
		if m.latencyLike() {
			fmt.Fprintf(w, ": median (mean) [p99 p99.9]")
		}
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		hdr := []string{"size", "case", "ours"}
		for _, b := range mp.Baselns {
			hdr = append(hdr, b.Label)
		}
		for _, b := range mp.Baselns {
			hdr = append(hdr, "ours/"+strings.TrimSuffix(b.Label, " -R"))
		}
		fmt.Fprintln(tw, strings.Join(hdr, "\t"))
		for _, size := range mp.Sizes {
			for _, o := range mp.rows() {
				if !o.runsAt(size) {
					continue
				}
				oa := r.get(m, size, o.Label)
				row := []string{sizeString(size), o.Label, cellText(m, oa)}
				if o.Kind == "floor" {
					row[2] = "(" + row[2] + ")" // its own column has it
				}
				for _, b := range mp.Baselns {
					if !b.runsAt(size) {
						row = append(row, "-")
						continue
					}
					row = append(row, cellText(m, r.get(m, size, b.Label)))
				}
				for _, b := range mp.Baselns {
					if b.Label == o.Label || !b.runsAt(size) {
						row = append(row, "-")
						continue
					}
					row = append(row, r.ratio(m, size, o.Label, b.Label).ratioText())
				}
				fmt.Fprintln(tw, strings.Join(row, "\t"))
			}
		}
		tw.Flush()
		r.printCounters(w, mp)
		r.printPackets(w, mp)
		r.printCPU(w, mp)
		r.printStages(w, mp)
	}
	if r.h.remote != nil || r.h.verbose {
		r.printSpread(w)
	}
	r.printGoals(w)
	for _, n := range r.warnings() {
		fmt.Fprintf(w, "\nWARNING: %s\n", n)
	}
	if r.h.metrics != nil && !slices.Contains(r.h.metrics, Latency) {
		fmt.Fprintf(w, "\n%s\n", grpcLegend)
	} else {
		fmt.Fprintf(w, "\n%s\n", legend)
	}
	fmt.Fprintf(w, "wall time %s\n", r.wall.Round(time.Second))
}

// printGoals lists each goal with its paired ratio, interval and verdict.
func (r *report) printGoals(w io.Writer) {
	gs := r.goalResults()
	if len(gs) == 0 {
		return
	}
	fmt.Fprintf(w, "\nGoals (paired ratio, median of the rounds [%.0f%% interval]; met or missed only when the whole interval is on one side):\n", 100*confidence)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, g := range gs {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", g.goal, g.Ratio.ratioText(), strings.ToUpper(g.Verdict))
	}
	tw.Flush()
}

// counterKeys are the per-message counters the table shows (the JSON has all).
var counterKeys = []string{"send_doorbells", "recv_doorbells", "signaled", "cgo_work", "cgo_empty", "poller_wakeups", "parks", "ctx_switches_involuntary", "ctx_switches_voluntary"}

// printCounters shows, for our cases, the work per message (per round trip
// for latency) of the client and the server: medians over the repetitions.
func (r *report) printCounters(w io.Writer, mp metricPlan) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := false
	for _, size := range mp.Sizes {
		for _, o := range mp.rows() { // ours, and peers over an rdma.Conn (grpc-go)
			a := r.get(mp.Metric, size, o.Label)
			if a == nil || a.Counters == nil {
				continue
			}
			if !header {
				fmt.Fprintf(w, "  per %s, client | server:\n", map[bool]string{true: "round trip", false: "message"}[mp.Metric == Latency])
				fmt.Fprintln(tw, "  size\tcase\t"+strings.Join(counterKeys, "\t"))
				header = true
			}
			row := []string{"  " + sizeString(size), o.Label}
			for _, k := range counterKeys {
				row = append(row, fmt.Sprintf("%.2f | %.2f", a.Counters["client."+k], a.Counters["server."+k]))
			}
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
	}
	tw.Flush()
	// UD cases: a sender's rate, and what arrived (ud.go).
	for _, size := range mp.Sizes {
		for _, o := range mp.Ours {
			if a := r.get(mp.Metric, size, o.Label); a != nil && a.Counters != nil {
				if d, ok := a.Counters["client.delivered_Mmps"]; ok {
					fmt.Fprintf(w, "  %s %s: the sender's rate; %s Mmsg/s arrived (measured by the receiver), %.1f%% lost\n",
						o.Label, sizeString(size), fmtVal(Rate, d), 100*a.Counters["client.lost"])
				}
			}
		}
	}
}

// unstableSpread is the ratio of the largest to the smallest repetition above
// which a cell is marked unstable: above the spread of a quiet machine's
// repetitions (docs/performance.md); a busy host (other guests) makes some
// runs wait for scheduler ticks and breaks it.
const unstableSpread = 1.5

func (a *aggregate) unstable() bool {
	if len(a.Reps) < 2 {
		return false
	}
	lo, hi := slices.Min(a.Reps), slices.Max(a.Reps)
	return lo > 0 && hi/lo > unstableSpread
}

// warnings flag figures that say more about the machine than about RDMA.
func (r *report) warnings() []string {
	var out []string
	n := 0
	for _, a := range r.agg {
		if a.unstable() {
			n++
		}
	}
	if n > 0 {
		out = append(out, fmt.Sprintf("%d cells marked ! have rounds more than %.1fx apart (max/min): "+
			"the machine was busy during some of them, so their medians move between runs; the paired ratios' intervals "+
			"include it. -long (more rounds), or a quieter machine, narrows them.", n, unstableSpread))
	}
	for k, a := range r.agg {
		if r.h.remote != nil {
			// Between two hosts the path, not the machine, sets perftest's
			// latency; the one-host threshold below is no reference.
			break
		}
		if k.Metric == Latency && strings.HasPrefix(k.Label, "ib_") && len(a.Reps) > 0 && a.Value > 1000 {
			out = append(out, fmt.Sprintf("%s's median latency at %s is %.0f µs (it is ~20 µs on a quiet machine): "+
				"the host was busy (other guests?) and wake-ups waited for scheduler ticks (4 ms); "+
				"these figures do not compare implementations. Rerun on a quiet machine.", k.Label, sizeString(k.Size), a.Value))
			break
		}
	}
	return out
}

const legend = `Legend: latency is one-way (round trip / 2) in µs, as perftest reports it; t_typical is perftest's median.
Bandwidth is MB/s with MB = 10^6 bytes: perftest's "BW average[MB/sec]" counts 2^20 bytes per MB and is
multiplied by 1.048576 (checked against MsgRate x size); ours and TCP are measured on the receiver.
Message rate is 10^6 messages/s (perftest: MsgRate[Mpps]; ours and TCP: 64 B writes counted on the receiver;
ud-msgrate: datagrams posted per second by the sender, as perftest -c UD counts, with what arrived below).
ours/X is the median over the rounds of ours/X within each round, with its 95% interval in brackets
([n=N]: fewer than 6 rounds, no interval); go-floor is the same verbs calls with no library logic.
ours/X > 1 means ours is slower for latency and faster for bandwidth and rate. ! = unstable rounds.
Soft-RoCE emulated in a TCG guest: only ratios within one run mean anything.`

const grpcLegend = `Legend: one generated service three ways: ours = grpcrdma (the message view, no HTTP/2), grpc-go-* = grpc-go
over the rdma.Conn as a net.Conn, tcp = the same grpc-go case over TCP on 127.0.0.1; msg-stream-ceiling = the message
view's own stream of the same messages. A unary call's time is its whole round trip. MB = 10^6 bytes.
X/Y is the median over the rounds of X/Y within each round, with its 95% interval in brackets ([n=N]: fewer than
6 rounds, no interval); > 1 means slower for the unary call, faster for calls/s and MB/s. ! = unstable rounds.
Soft-RoCE emulated in a TCG guest: only ratios within one run mean anything.`

// jsonReport is the JSON output: how the run went, one result per row,
// size and baseline, and the goals' verdicts.
type jsonReport struct {
	Context   string       `json:"context"`
	Date      string       `json:"date"`
	Rounds    int          `json:"rounds"`     // bandwidth and rate
	LatRounds int          `json:"lat_rounds"` // latency
	Results   []jsonResult `json:"results"`
	Goals     []goalResult `json:"goals"`
}

// jsonResult is one result of the JSON output: one of our cases (or the Go
// floor) against one baseline at one size. Values are medians over the
// rounds; null means every round failed (see error).
type jsonResult struct {
	Case          string   `json:"case"` // our case, or "go-floor"
	Metric        Metric   `json:"metric"`
	Size          int      `json:"size"`
	Ours          *float64 `json:"ours"`
	Baseline      string   `json:"baseline"` // "perftest", "rstream", "tcp" or "floor"
	BaselineLabel string   `json:"baseline_label"`
	BaselineCmd   string   `json:"baseline_cmd"`
	BaselineValue *float64 `json:"baseline_value"`
	// Ratio: the median of the per-round paired ratios ours/baseline, with
	// its interval (RatioCI) and the ratios themselves in round order.
	Ratio       *float64  `json:"ratio"`
	RatioCI     *interval `json:"ratio_ci,omitempty"`
	RatioRounds []float64 `json:"ratio_rounds,omitempty"`
	// Each round's value, with its round.
	OursRounds     []roundValue `json:"ours_rounds,omitempty"`
	BaselineRounds []roundValue `json:"baseline_rounds,omitempty"`
	OursP99        *float64     `json:"ours_p99,omitempty"`
	OursP999       *float64     `json:"ours_p999,omitempty"`
	BaselineP99    *float64     `json:"baseline_p99,omitempty"`
	BaselineP999   *float64     `json:"baseline_p999,omitempty"`
	OursAvg        *float64     `json:"ours_avg,omitempty"`
	// OursCounters: work per message (round trip) of both processes,
	// "client.X" / "server.X" (medians over the repetitions); the
	// completion and polling keys are diagnostics, as in Sample.Counters.
	OursCounters map[string]float64 `json:"ours_counters,omitempty"`
	// Device packets per message (round trip), both directions (packets.go).
	OursPackets     *float64 `json:"ours_packets,omitempty"`
	BaselinePackets *float64 `json:"baseline_packets,omitempty"`
	// CPU time per message (round trip) by CPU, µs (cpu.go).
	OursCPU       []CPUUse  `json:"ours_cpu,omitempty"`
	BaselineCPU   []CPUUse  `json:"baseline_cpu,omitempty"`
	BaselineAvg   *float64  `json:"baseline_avg,omitempty"`
	BaselineCheck *float64  `json:"baseline_check_MBps,omitempty"` // perftest MsgRate x size
	OursReps      []float64 `json:"ours_reps"`
	BaselineReps  []float64 `json:"baseline_reps"`
	// Repetitions more than unstableSpread apart (the table's "!").
	OursUnstable     bool   `json:"ours_unstable,omitempty"`
	BaselineUnstable bool   `json:"baseline_unstable,omitempty"`
	Iterations       int    `json:"iterations"`
	Depth            int    `json:"depth,omitempty"`
	Pinned           bool   `json:"pinned"`
	Error            string `json:"error,omitempty"`
}

func (r *report) results() []jsonResult {
	var out []jsonResult
	for _, mp := range r.plan {
		m := mp.Metric
		for _, o := range mp.rows() {
			for _, size := range mp.Sizes {
				for _, b := range mp.Baselns {
					if !o.runsAt(size) || !b.runsAt(size) || b.Label == o.Label {
						continue
					}
					oa, ba := r.get(m, size, o.Label), r.get(m, size, b.Label)
					j := jsonResult{Case: o.Label, Metric: m, Size: size, Baseline: b.Kind, BaselineLabel: b.Label, BaselineCmd: b.Cmd(r.h, size),
						Iterations: r.h.work.Iters(m, size), Pinned: r.h.serverCPU >= 0, OursReps: []float64{}, BaselineReps: []float64{}}
					if m != Latency {
						j.Depth = r.h.depth
					}
					var errs []string
					if oa != nil {
						j.Ours, j.OursReps, j.OursUnstable = ptr(oa.Value), oa.Reps, oa.unstable()
						j.OursCounters = oa.Counters
						if oa.Packets > 0 {
							j.OursPackets = ptr(oa.Packets)
						}
						j.OursCPU = oa.CPU
						if m.latencyLike() {
							j.OursP99, j.OursP999, j.OursAvg = ptr(oa.P99), ptr(oa.P999), ptr(oa.Avg)
						}
					} else {
						errs = append(errs, "ours failed: "+strings.Join(r.errs(m, size, o.Label), "; "))
					}
					if ba != nil {
						j.BaselineValue, j.BaselineReps, j.BaselineUnstable = ptr(ba.Value), ba.Reps, ba.unstable()
						if m.latencyLike() {
							j.BaselineP99, j.BaselineP999, j.BaselineAvg = ptr(ba.P99), ptr(ba.P999), ptr(ba.Avg)
						}
						if ba.Check > 0 {
							j.BaselineCheck = ptr(ba.Check)
						}
						if ba.Packets > 0 {
							j.BaselinePackets = ptr(ba.Packets)
						}
						j.BaselineCPU = ba.CPU
					} else {
						errs = append(errs, b.Label+" failed: "+strings.Join(r.errs(m, size, b.Label), "; "))
					}
					if oa != nil {
						j.OursRounds = oa.Rounds
					}
					if ba != nil {
						j.BaselineRounds = ba.Rounds
					}
					if oa != nil && ba != nil {
						if rr := pairedRatios(oa.Rounds, ba.Rounds); len(rr) > 0 {
							iv := medianInterval(rr)
							j.Ratio, j.RatioCI, j.RatioRounds = ptr(iv.Center), &iv, rr
						}
					}
					j.Error = strings.Join(errs, "; ")
					out = append(out, j)
				}
			}
		}
	}
	return out
}

func (r *report) errs(m Metric, size int, label string) []string {
	if c := r.cells[cellKey{m, size, label}]; c != nil && len(c.Errs) > 0 {
		return c.Errs
	}
	return []string{"no successful run"}
}

// ptr returns a pointer to v, for JSON fields that are null when missing.
func ptr(v float64) *float64 {
	return &v
}

func (r *report) writeJSON(path string) error {
	out := jsonReport{Context: r.context(), Date: r.when.UTC().Format(time.DateOnly), Rounds: r.h.rounds,
		LatRounds: r.h.latRounds, Results: r.results(), Goals: r.goalResults()}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// printStages shows, with -stages, each case's CPU samples by stage at each
// size, summed over its rounds (stages.go).
func (r *report) printStages(w io.Writer, mp metricPlan) {
	for _, size := range mp.Sizes {
		var rows []string
		counts := map[string]map[string]float64{}
		for _, o := range mp.rows() {
			c := r.cells[cellKey{mp.Metric, size, o.Label}]
			if c == nil {
				continue
			}
			for _, s := range c.Samples {
				if s.Stages == nil {
					continue
				}
				if counts[o.Label] == nil {
					counts[o.Label] = map[string]float64{}
					rows = append(rows, o.Label)
				}
				for k, v := range s.Stages {
					counts[o.Label][k] += v
				}
			}
		}
		if len(rows) > 0 {
			fmt.Fprintf(w, "  %s:\n", sizeString(size))
			writeStages(w, rows, counts)
		}
	}
}
