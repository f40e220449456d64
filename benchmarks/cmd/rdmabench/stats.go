//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/perf/benchmath"
)

// confidence is the level of every interval the harness reports.
const confidence = 0.95

// interval is the median of a cell's per-round values (or of its per-round
// paired ratios) with a distribution-free confidence interval for it: the
// order-statistic interval benchstat reports (golang.org/x/perf/benchmath,
// AssumeNothing), whose coverage is exact for any distribution of rounds.
// A percentile bootstrap of a median from a dozen rounds covers less than
// it claims; this interval never does. With fewer than 6 rounds no pair of
// order statistics reaches 95%: Lo and Hi are then infinite.
type interval struct {
	Center     float64 `json:"median"`
	Lo         float64 `json:"lo"`
	Hi         float64 `json:"hi"`
	Confidence float64 `json:"confidence"` // the interval's actual level, at least 0.95
	N          int     `json:"rounds"`
}

// minRoundsForInterval is the fewest rounds that give a finite 95%
// interval for a median.
const minRoundsForInterval = 6

func medianInterval(values []float64) interval {
	if len(values) == 0 {
		return interval{Lo: math.Inf(-1), Hi: math.Inf(1)}
	}
	s := benchmath.AssumeNothing.Summary(benchmath.NewSample(slices.Clone(values), &benchmath.DefaultThresholds), confidence)
	iv := interval{Center: s.Center, Lo: s.Lo, Hi: s.Hi, Confidence: s.Confidence, N: len(values)}
	if len(values) < minRoundsForInterval {
		// benchmath may give one end; half an interval decides nothing.
		iv.Lo, iv.Hi, iv.Confidence = math.Inf(-1), math.Inf(1), 0
	}
	return iv
}

// MarshalJSON writes an infinite end (too few rounds) as null: JSON has
// no infinities.
func (iv interval) MarshalJSON() ([]byte, error) {
	end := func(v float64) *float64 {
		if math.IsInf(v, 0) || math.IsNaN(v) {
			return nil
		}
		return &v
	}
	return json.Marshal(struct {
		Center     float64  `json:"median"`
		Lo         *float64 `json:"lo"`
		Hi         *float64 `json:"hi"`
		Confidence float64  `json:"confidence"`
		N          int      `json:"rounds"`
	}{iv.Center, end(iv.Lo), end(iv.Hi), iv.Confidence, iv.N})
}

// UnmarshalJSON reads what MarshalJSON writes (null ends as infinite), so
// -compare reads the intervals of an earlier run.
func (iv *interval) UnmarshalJSON(b []byte) error {
	var v struct {
		Center     float64  `json:"median"`
		Lo         *float64 `json:"lo"`
		Hi         *float64 `json:"hi"`
		Confidence float64  `json:"confidence"`
		N          int      `json:"rounds"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*iv = interval{Center: v.Center, Lo: math.Inf(-1), Hi: math.Inf(1), Confidence: v.Confidence, N: v.N}
	if v.Lo != nil {
		iv.Lo = *v.Lo
	}
	if v.Hi != nil {
		iv.Hi = *v.Hi
	}
	return nil
}

// finite reports whether the interval has both ends.
func (iv interval) finite() bool { return !math.IsInf(iv.Lo, 0) && !math.IsInf(iv.Hi, 0) }

// overlaps reports whether two intervals share a value: two runs whose
// intervals for a cell overlap agree on it.
func (iv interval) overlaps(o interval) bool { return iv.Lo <= o.Hi && o.Lo <= iv.Hi }

// ratioText is a paired ratio for the table: "1.23x [1.10 1.35]"; without
// enough rounds for an interval, "1.23x [n=3]".
func (iv interval) ratioText() string {
	if iv.N == 0 {
		return "-"
	}
	if !iv.finite() {
		return fmt.Sprintf("%s [n=%d]", fmtRatio(iv.Center), iv.N)
	}
	return fmt.Sprintf("%s [%s %s]", fmtRatio(iv.Center), strings.TrimSuffix(fmtRatio(iv.Lo), "x"), strings.TrimSuffix(fmtRatio(iv.Hi), "x"))
}

// pairedRatios divides ours by the baseline round by round: the two ran in
// the same round, minutes apart at most, so the machine's drift between
// rounds cancels out of each ratio. Rounds where either failed are left out.
func pairedRatios(ours, base []roundValue) []float64 {
	var out []float64
	for _, o := range ours {
		for _, b := range base {
			if b.Round == o.Round && b.Value > 0 {
				out = append(out, o.Value/b.Value)
			}
		}
	}
	return out
}

// roundValue is one run's value and the round it ran in.
type roundValue struct {
	Round int     `json:"round"`
	Value float64 `json:"value"`
}

// A goal is a bound on a paired ratio of one table cell, e.g.
// "latency/64 B/conn-pingpong/go-floor<=1.10": ours/floor at most 1.10.
// Its verdict is "met" when the whole interval is within the bound,
// "missed" when the whole interval is beyond it, and "undecided" when the
// interval straddles it (or there are too few rounds for an interval).
type goal struct {
	Spec     string  `json:"goal"`
	Metric   Metric  `json:"metric"`
	Size     int     `json:"size"`
	Case     string  `json:"case"`
	Baseline string  `json:"baseline"`
	AtMost   bool    `json:"at_most"` // "<=": the ratio at most Target; ">=": at least
	Target   float64 `json:"target"`
}

// defaultGoals are the library's goals: the 64 B ping-pongs within 1.10x of
// the Go floor (the same verbs calls with no library logic); on rstream's
// pattern a mean latency at or below rsocket's and a bandwidth at or above
// (where the floor's own mean is below rsocket's: docs/performance.md); and
// the atomics within 1.3x of ib_atomic_lat's time and at least 0.8x of
// ib_atomic_bw's rate.
var defaultGoals = []string{
	"latency/64B/conn-pingpong/go-floor<=1.10",
	"latency/64B/msg-pingpong/go-floor<=1.10",
	"latency/64B/write-pingpong/go-floor<=1.10",
	"rstream-lat/64B/conn-rstream-lat/rstream<=1.00",
	"rstream-bw/64KiB/conn-rstream-bw/rstream>=1.00",
	"atomic-lat/8B/cas-lat/ib_atomic_lat -A CMP_AND_SWAP<=1.3",
	"atomic-lat/8B/faa-lat/ib_atomic_lat -A FETCH_AND_ADD<=1.3",
	"atomic-rate/8B/faa-rate/ib_atomic_bw -A FETCH_AND_ADD>=0.8",
}

// defaultGRPCGoals are -grpc's: grpcrdma's unary call at least 8x faster
// than grpc-go over TCP and 5x than grpc-go over rdma.Conn, 16 callers at
// least 5x grpc-go over TCP's calls/s, the stream at least 0.8x the
// message view's own stream of the same messages; and grpc-go over
// rdma.Conn at least 1.2x grpc-go over TCP on unary calls and 16 callers.
var defaultGRPCGoals = []string{
	"grpc-unary/64B/grpcrdma-unary/tcp<=0.125",
	"grpc-unary/64B/grpcrdma-unary/grpc-go-unary<=0.2",
	"grpc-callers/64B/grpcrdma-callers/tcp>=5",
	"grpc-stream/256KiB/grpcrdma-stream/msg-stream-ceiling>=0.8",
	"grpc-unary/64B/grpc-go-unary/tcp<=0.833",
	"grpc-callers/64B/grpc-go-callers/tcp>=1.2",
}

// parseGoal parses "METRIC/SIZE/CASE/BASELINE<=X" or ">=X". METRIC is a
// metric's short name (latency, bandwidth, rate), SIZE as the table prints
// it with or without the space ("64B", "64 KiB"), BASELINE a column label
// ("go-floor", "ib_send_lat", "tcp"; perftest's " -R" may be left out).
func parseGoal(spec string) (goal, error) {
	g := goal{Spec: spec}
	op := "<="
	i := strings.Index(spec, op)
	if i < 0 {
		op = ">="
		i = strings.Index(spec, op)
	}
	if i < 0 {
		return g, fmt.Errorf("goal %q: no <= or >= bound (e.g. latency/64B/conn-pingpong/go-floor<=1.10)", spec)
	}
	g.AtMost = op == "<="
	t, err := strconv.ParseFloat(strings.TrimSpace(spec[i+2:]), 64)
	if err != nil || t <= 0 {
		return g, fmt.Errorf("goal %q: bound %q is not a positive number", spec, spec[i+2:])
	}
	g.Target = t
	parts := strings.Split(spec[:i], "/")
	if len(parts) != 4 {
		return g, fmt.Errorf("goal %q: want METRIC/SIZE/CASE/BASELINE before the bound", spec)
	}
	for _, m := range allMetrics {
		if m.Short() == parts[0] {
			g.Metric = m
		}
	}
	if g.Metric == "" {
		return g, fmt.Errorf("goal %q: unknown metric %q (latency, bandwidth, rate, rstream-lat, rstream-bw, atomic-lat, atomic-rate, grpc-unary, grpc-callers, grpc-stream)", spec, parts[0])
	}
	if g.Size, err = parseSize(parts[1]); err != nil {
		return g, fmt.Errorf("goal %q: %w", spec, err)
	}
	g.Case, g.Baseline = parts[2], strings.TrimSuffix(parts[3], " -R")
	if g.Case == "" || g.Baseline == "" {
		return g, fmt.Errorf("goal %q: empty case or baseline", spec)
	}
	return g, nil
}

// parseSize reads "64B", "64 B", "4KiB", "1 MiB".
func parseSize(s string) (int, error) {
	s = strings.ReplaceAll(s, " ", "")
	mult := 1
	switch {
	case strings.HasSuffix(s, "MiB"):
		mult, s = 1<<20, strings.TrimSuffix(s, "MiB")
	case strings.HasSuffix(s, "KiB"):
		mult, s = 1<<10, strings.TrimSuffix(s, "KiB")
	case strings.HasSuffix(s, "B"):
		s = strings.TrimSuffix(s, "B")
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("size %q: want e.g. 64B, 4KiB, 1MiB", s)
	}
	return n * mult, nil
}

func (g goal) String() string {
	op := ">="
	if g.AtMost {
		op = "<="
	}
	return fmt.Sprintf("%s %s %s/%s %s %.2f", g.Metric.Short(), sizeString(g.Size), g.Case, g.Baseline, op, g.Target)
}

// Verdicts of a goal.
const (
	goalMet       = "met"
	goalMissed    = "missed"
	goalUndecided = "undecided"
)

// verdict judges the goal by the interval of its paired ratio.
func (g goal) verdict(iv interval) string {
	if iv.N == 0 || !iv.finite() {
		return goalUndecided
	}
	lo, hi := iv.Lo, iv.Hi
	if g.AtMost {
		lo, hi = -hi, -lo // "at most T" is "-ratio at least -T"
	}
	t := g.Target
	if g.AtMost {
		t = -t
	}
	switch {
	case lo >= t:
		return goalMet
	case hi < t:
		return goalMissed
	}
	return goalUndecided
}
