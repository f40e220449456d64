//go:build linux

package main

import (
	"encoding/json"
	"math"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The interval of a median from n rounds: the order statistics whose
// binomial coverage is at least 95% (n=6: min and max, 96.9%; n=10: the
// 2nd and 9th, 97.9%; n=15: the 4th and 12th, 96.5%); infinite below 6.
func TestMedianInterval(t *testing.T) {
	seq := func(n int) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[n-1-i] = float64(i + 1) // descending: the interval must not depend on order
		}
		return v
	}
	for _, c := range []struct {
		n          int
		lo, hi     float64
		confidence float64
	}{
		{5, math.Inf(-1), math.Inf(1), 0},
		{6, 1, 6, 0.96875},
		{10, 2, 9, 0.97852},
		{15, 4, 12, 0.96484},
	} {
		iv := medianInterval(seq(c.n))
		if want := float64(c.n+1) / 2; iv.Center != want || iv.N != c.n {
			t.Errorf("n=%d: median %v (n %d), want %v", c.n, iv.Center, iv.N, want)
		}
		if iv.Lo != c.lo || iv.Hi != c.hi {
			t.Errorf("n=%d: interval [%v %v], want [%v %v]", c.n, iv.Lo, iv.Hi, c.lo, c.hi)
		}
		if c.confidence > 0 && (math.Abs(iv.Confidence-c.confidence) > 1e-4 || iv.Confidence < confidence) {
			t.Errorf("n=%d: confidence %v, want %v", c.n, iv.Confidence, c.confidence)
		}
		if iv.finite() != (c.n >= minRoundsForInterval) {
			t.Errorf("n=%d: finite %v", c.n, iv.finite())
		}
	}
	if iv := medianInterval(nil); iv.N != 0 || iv.finite() {
		t.Errorf("no rounds: %+v", iv)
	}
}

// A paired ratio divides values of the same round only; a round where one
// side failed gives no ratio.
func TestPairedRatios(t *testing.T) {
	ours := []roundValue{{1, 10}, {2, 20}, {4, 40}}
	base := []roundValue{{1, 5}, {3, 7}, {4, 20}}
	got := pairedRatios(ours, base)
	if len(got) != 2 || got[0] != 2 || got[1] != 2 {
		t.Fatalf("paired ratios %v, want [2 2] (rounds 1 and 4)", got)
	}
	// A drift that doubles every value in later rounds cancels out of the
	// paired ratio but not out of the ratio of medians.
	ours = []roundValue{{1, 11}, {2, 22}, {3, 44}}
	base = []roundValue{{1, 10}, {2, 20}, {3, 40}}
	if r := medianInterval(pairedRatios(ours, base)); math.Abs(r.Center-1.1) > 1e-12 {
		t.Fatalf("paired median %v, want 1.1", r.Center)
	}
}

func TestParseGoal(t *testing.T) {
	g, err := parseGoal("latency/64B/conn-pingpong/go-floor<=1.10")
	if err != nil || g.Metric != Latency || g.Size != 64 || g.Case != "conn-pingpong" || g.Baseline != "go-floor" || !g.AtMost || g.Target != 1.1 {
		t.Fatalf("%+v, %v", g, err)
	}
	g, err = parseGoal("bandwidth/64 KiB/msg-stream/ib_read_bw -R>=0.8")
	if err != nil || g.Metric != Bandwidth || g.Size != 64<<10 || g.Baseline != "ib_read_bw" || g.AtMost || g.Target != 0.8 {
		t.Fatalf("%+v, %v", g, err)
	}
	for _, bad := range []string{"latency/64B/conn-pingpong/go-floor", "latency/64B/conn-pingpong<=1.1",
		"speed/64B/a/b<=1", "latency/sixty/a/b<=1", "latency/64B/a/b<=-1", "latency/64B/a/b<=x"} {
		if _, err := parseGoal(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	for _, spec := range defaultGoals {
		if _, err := parseGoal(spec); err != nil {
			t.Errorf("default goal: %v", err)
		}
	}
}

// A goal is met or missed only when the whole interval is on one side of
// its bound; an interval across it, or none, leaves it undecided.
func TestGoalVerdict(t *testing.T) {
	atMost := goal{AtMost: true, Target: 1.10}
	atLeast := goal{Target: 0.8}
	iv := func(lo, c, hi float64) interval { return interval{Center: c, Lo: lo, Hi: hi, N: 10} }
	for _, c := range []struct {
		g    goal
		iv   interval
		want string
	}{
		{atMost, iv(1.00, 1.05, 1.09), goalMet},
		{atMost, iv(1.00, 1.05, 1.10), goalMet},
		{atMost, iv(1.05, 1.08, 1.12), goalUndecided},
		{atMost, iv(1.11, 1.2, 1.3), goalMissed},
		{atMost, interval{Center: 1.0, Lo: math.Inf(-1), Hi: math.Inf(1), N: 3}, goalUndecided},
		{atLeast, iv(0.85, 0.9, 1.0), goalMet},
		{atLeast, iv(0.75, 0.82, 0.9), goalUndecided},
		{atLeast, iv(0.6, 0.7, 0.79), goalMissed},
		{atLeast, interval{}, goalUndecided},
	} {
		if got := c.g.verdict(c.iv); got != c.want {
			t.Errorf("%+v against [%v %v]: %s, want %s", c.g, c.iv.Lo, c.iv.Hi, got, c.want)
		}
	}
}

// In round k the runners start at the k-th (mod their number): over as many
// rounds as runners, each runs once in every position.
func TestRoundOrder(t *testing.T) {
	rs := []runner{{Label: "a"}, {Label: "b"}, {Label: "c"}}
	pos := map[string]map[int]bool{}
	for round := 1; round <= 3; round++ {
		for i, r := range roundOrder(rs, round) {
			if pos[r.Label] == nil {
				pos[r.Label] = map[int]bool{}
			}
			pos[r.Label][i] = true
		}
	}
	for _, r := range rs {
		if len(pos[r.Label]) != 3 {
			t.Errorf("%s ran in positions %v over 3 rounds, want all 3", r.Label, pos[r.Label])
		}
	}
	if got := roundOrder(rs, 2); got[0].Label != "b" || got[2].Label != "a" || rs[0].Label != "a" {
		t.Errorf("round 2: %v (input changed: %v)", got, rs)
	}
}

// The report pairs by round, prints each ratio with its interval and the
// Go floor's row, and judges the goals.
func TestReportGoals(t *testing.T) {
	h := &harness{addr: "169.254.77.1", depth: 128, rounds: 7, latRounds: 7, serverCPU: 0, clientCPU: 1,
		work: defaultWorkload(false), log: discard{}}
	for _, spec := range []string{"latency/64B/conn-pingpong/go-floor<=1.10", "latency/64B/conn-pingpong/ib_send_lat<=1.10",
		"latency/64B/msg-pingpong/go-floor<=1.30"} {
		g, err := parseGoal(spec)
		if err != nil {
			t.Fatal(err)
		}
		h.goals = append(h.goals, g)
	}
	plan := h.plan(regexp.MustCompile("latency/(conn|msg)-pingpong"), regexp.MustCompile("ib_send_lat -R|go-floor"))
	cells := map[cellKey]*cell{}
	// Per round r, the machine's speed d(r) drifts by 2x; conn is 1.05x
	// the floor, msg 1.2x, the floor 2x perftest in every round.
	for _, size := range plan[0].Sizes {
		for round := 1; round <= 7; round++ {
			d := 1 + float64(round%4)/3
			for label, v := range map[string]float64{"conn-pingpong": 21 * d, "msg-pingpong": 24 * d, "go-floor": 20 * d, "ib_send_lat -R": 10 * d} {
				k := cellKey{Latency, size, label}
				if cells[k] == nil {
					cells[k] = &cell{}
				}
				cells[k].Samples = append(cells[k].Samples, &Sample{Value: v})
				cells[k].Rounds = append(cells[k].Rounds, round)
			}
		}
	}
	r := h.report(plan, cells, time.Minute)
	gs := r.goalResults()
	want := []string{goalMet, goalMissed, goalMet}
	for i, g := range gs {
		if g.Verdict != want[i] || !g.Ratio.finite() {
			t.Errorf("%s: ratio %+v, verdict %s, want %s", g.goal, g.Ratio, g.Verdict, want[i])
		}
	}
	var b strings.Builder
	r.printTable(&b)
	out := b.String()
	for _, want := range []string{"ours/go-floor", "1.05x [1.05 1.05]", "2.00x [2.00 2.00]", "MET", "MISSED"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	floorRow := false
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "64 B") && strings.Contains(l, "go-floor") && strings.Contains(l, "2.00x") {
			floorRow = true
		}
	}
	if !floorRow {
		t.Errorf("no go-floor row with its ratio to ib_send_lat:\n%s", out)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// Two runs agree on a cell when its intervals overlap; -compare counts the
// cells where they do not.
func TestCompareRuns(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, lo, hi float64) string {
		path := dir + "/" + name
		iv := interval{Center: (lo + hi) / 2, Lo: lo, Hi: hi, N: 7, Confidence: 0.98}
		ivb := interval{Center: 2, Lo: 1.9, Hi: 2.1, N: 7, Confidence: 0.98}
		out := jsonReport{Date: "2026-12-04", Results: []jsonResult{
			{Case: "conn-pingpong", Metric: Latency, Size: 64, BaselineLabel: "go-floor", RatioCI: &iv},
			{Case: "conn-pingpong", Metric: Latency, Size: 64, BaselineLabel: "ib_send_lat -R", RatioCI: &ivb},
			{Case: "conn-pingpong", Metric: Latency, Size: 8, BaselineLabel: "go-floor", RatioCI: &ivb},
		}}
		b, err := json.Marshal(out)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	a, b, c := write("a.json", 1.0, 1.2), write("b.json", 1.1, 1.3), write("c.json", 1.25, 1.4)
	var out strings.Builder
	if n, err := compareRuns(&out, a, b, Latency, 64); err != nil || n != 0 {
		t.Fatalf("overlapping: %d disagree, %v\n%s", n, err, out.String())
	}
	out.Reset()
	if n, err := compareRuns(&out, a, c, Latency, 64); err != nil || n != 1 || !strings.Contains(out.String(), "DISAGREE") ||
		!strings.Contains(out.String(), "2 cells compared") {
		t.Fatalf("disjoint: %d disagree, %v\n%s", n, err, out.String())
	}
	if _, err := compareRuns(&out, a, c, Bandwidth, 0); err == nil {
		t.Fatal("no shared cell: no error")
	}
}

// An interval without enough rounds is written to JSON with null ends and
// read back as infinite, so a JSON report always encodes and -compare
// treats such a cell as having no interval.
func TestIntervalJSON(t *testing.T) {
	for _, iv := range []interval{medianInterval([]float64{1, 2, 3}), medianInterval([]float64{1, 2, 3, 4, 5, 6, 7})} {
		b, err := json.Marshal(iv)
		if err != nil {
			t.Fatalf("%+v: %v", iv, err)
		}
		var back interval
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if back != iv {
			t.Errorf("%s read back as %+v, want %+v", b, back, iv)
		}
		if !iv.finite() && !strings.Contains(string(b), `"lo":null,"hi":null`) {
			t.Errorf("interval from %d rounds written as %s, want null ends", iv.N, b)
		}
	}
}
