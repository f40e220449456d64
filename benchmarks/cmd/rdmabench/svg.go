//go:build linux

package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The chart: one panel per metric, grouped bars per message size (ours,
// perftest, TCP), a logarithmic value axis when the values span a decade or
// more, and for latency a whisker up to the p99. Standard library only.

const (
	svgWidth   = 980
	panelH     = 330
	padLeft    = 86
	padRight   = 24
	padTop     = 76 // panel title and up to two legend rows
	padBottom  = 56 // size labels and axis title
	headerH    = 70
	footerH    = 80
	fontFamily = "DejaVu Sans, Helvetica, Arial, sans-serif"
)

// seriesColor: our cases in blues, perftest send in orange, write in red,
// TCP in grey, peers (grpc-go over RDMA) in cyan.
func seriesColor(r runner, oursIndex int) string {
	switch r.Kind {
	case "ours":
		return []string{"#1f5fa8", "#4aa3df", "#7b52ab", "#2ca02c"}[oursIndex%4]
	case "tcp":
		return "#8c8c8c"
	case "peer":
		return "#17becf"
	}
	if strings.Contains(r.Label, "write") {
		return "#c0392b"
	}
	return "#f39c12"
}

type svgBuf struct{ strings.Builder }

func (b *svgBuf) f(format string, a ...any) { fmt.Fprintf(b, format, a...); b.WriteByte('\n') }

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}

func (r *report) svg() string {
	var b svgBuf
	panels := len(r.plan)
	if _, runs, _ := r.latencyDetail(); len(runs) > 0 {
		panels++
	}
	height := headerH + panels*panelH + footerH
	b.f(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s">`,
		svgWidth, height, svgWidth, height, fontFamily)
	b.f(`<rect width="100%%" height="100%%" fill="white"/>`)
	b.f(`<text x="%d" y="28" font-size="18" font-weight="bold">rdmabench: this library vs perftest vs TCP</text>`, padLeft)
	b.f(`<text x="%d" y="50" font-size="11" fill="#444">%s</text>`, padLeft, esc(r.context()))
	for i, mp := range r.plan {
		r.panel(&b, mp, headerH+i*panelH)
	}
	if panels > len(r.plan) {
		r.latencyPanel(&b, headerH+len(r.plan)*panelH)
	}
	y := headerH + panels*panelH + 18
	for _, l := range []string{
		"Latency one-way = round trip / 2 (perftest: t_typical = median); whisker: p99. Bandwidth MB = 10^6 bytes (perftest's MiB/s x 1.048576).",
		"Ours and TCP bandwidth and message rate are counted on the receiver. ! = repetitions more than 1.5x apart (a busy machine).",
		"Emulated Soft-RoCE: only ratios within one run mean anything.",
		fmt.Sprintf("Generated %s; wall time %s.", r.when.Format("2006-01-02 15:04 MST"), r.wall.Round(1e9)),
	} {
		b.f(`<text x="%d" y="%d" font-size="11" fill="#444">%s</text>`, padLeft, y, esc(l))
		y += 16
	}
	b.f(`</svg>`)
	return b.String()
}

// scale maps values to the plot's vertical pixels.
type scale struct {
	log    bool
	lo, hi float64
	y0, y1 float64 // pixels of lo (bottom) and hi (top)
}

func (s scale) y(v float64) float64 {
	var t float64
	if s.log {
		v = math.Max(v, s.lo)
		t = (math.Log10(v) - math.Log10(s.lo)) / (math.Log10(s.hi) - math.Log10(s.lo))
	} else {
		t = (v - s.lo) / (s.hi - s.lo)
	}
	return s.y0 + (s.y1-s.y0)*math.Min(math.Max(t, 0), 1.05)
}

// ticks are the axis values to label: on a log axis the powers of ten, and
// 2 and 5 times them when the axis spans three decades or fewer.
func (s scale) ticks() []float64 {
	var out []float64
	if s.log {
		e0, e1 := int(math.Floor(math.Log10(s.lo)+1e-9)), int(math.Ceil(math.Log10(s.hi)-1e-9))
		for e := e0; e <= e1; e++ {
			for _, k := range []float64{1, 2, 5} {
				d := k * math.Pow(10, float64(e))
				if (k == 1 || e1-e0 <= 3) && d >= s.lo*0.9999 && d <= s.hi*1.0001 {
					out = append(out, d)
				}
			}
		}
		return out
	}
	step := niceStep(s.hi / 5)
	for i := 0; float64(i)*step <= s.hi*1.0001; i++ {
		out = append(out, float64(i)*step)
	}
	return out
}

// logBound rounds v down (or up) to 1, 2 or 5 times a power of ten.
func logBound(v float64, up bool) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	ks := []float64{1, 2, 5, 10}
	if up {
		for _, k := range ks {
			if k*p >= v*0.9999 {
				return k * p
			}
		}
	}
	for i := len(ks) - 1; i >= 0; i-- {
		if ks[i]*p <= v*1.0001 {
			return ks[i] * p
		}
	}
	return p
}

// niceStep rounds x up to 1, 2 or 5 times a power of ten.
func niceStep(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, k := range []float64{1, 2, 5, 10} {
		if k*p >= x {
			return k * p
		}
	}
	return 10 * p
}

func newScale(vals []float64, y0, y1 float64) scale {
	lo, hi := math.Inf(1), 0.0
	for _, v := range vals {
		if v > 0 {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	if hi == 0 {
		return scale{lo: 0, hi: 1, y0: y0, y1: y1}
	}
	if hi/lo >= 10 {
		return scale{log: true, lo: logBound(lo, false), hi: logBound(hi*1.25, true), y0: y0, y1: y1}
	}
	step := niceStep(hi * 1.15 / 5)
	return scale{lo: 0, hi: step * math.Ceil(hi*1.15/step), y0: y0, y1: y1}
}

func tickLabel(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%gk", v/1e3)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

func (r *report) panel(b *svgBuf, mp metricPlan, top int) {
	m := mp.Metric
	runners := mp.runners()
	plotL, plotR := float64(padLeft), float64(svgWidth-padRight)
	plotT, plotB := float64(top+padTop), float64(top+panelH-padBottom)

	var vals []float64
	for _, size := range mp.Sizes {
		for _, rn := range runners {
			if a := r.get(m, size, rn.Label); a != nil {
				vals = append(vals, a.Value)
				if m.latencyLike() {
					vals = append(vals, a.P99)
				}
			}
		}
	}
	sc := newScale(vals, plotB, plotT)

	// Title and legend.
	b.f(`<text x="%d" y="%d" font-size="14" font-weight="bold">%s</text>`, padLeft, top+20, esc(m.Title()))
	lx, ly := float64(padLeft), top+28
	oursIdx := 0
	colors := make([]string, len(runners))
	for i, rn := range runners {
		colors[i] = seriesColor(rn, oursIdx)
		if rn.Kind == "ours" {
			oursIdx++
		}
		label := rn.Label
		if rn.Kind == "ours" {
			label += " (ours)"
		}
		w := 16 + 7.2*float64(len([]rune(label))) + 22
		if lx+w > svgWidth-padRight && lx > padLeft {
			lx = padLeft // wrap: two legend rows fit above the plot
			ly += 16
		}
		b.f(`<rect x="%.0f" y="%d" width="12" height="12" fill="%s"/>`, lx, ly, colors[i])
		b.f(`<text x="%.0f" y="%d" font-size="12">%s</text>`, lx+16, ly+11, esc(label))
		lx += w
	}

	// Axes, grid and tick labels.
	for _, t := range sc.ticks() {
		y := sc.y(t)
		b.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e3e3e3"/>`, plotL, y, plotR, y)
		b.f(`<text x="%.1f" y="%.1f" font-size="11" text-anchor="end" fill="#333">%s</text>`, plotL-6, y+4, tickLabel(t))
	}
	b.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`, plotL, plotT, plotL, plotB)
	b.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`, plotL, plotB, plotR, plotB)
	axis := map[Metric]string{Latency: "one-way latency (µs)", Bandwidth: "bandwidth (MB/s, 10^6 B)", Rate: "message rate (10^6 msg/s)",
		GRPCUnary: "call round trip (µs)", GRPCCallers: "calls/s", GRPCStream: "MB/s (10^6 B)",
		AtomicLatency: "atomic round trip (µs)", AtomicRate: "atomics (10^6 ops/s)"}[m]
	if sc.log {
		axis += ", log scale"
	}
	cy := (plotT + plotB) / 2
	b.f(`<text x="%d" y="%.1f" font-size="12" text-anchor="middle" transform="rotate(-90 %d %.1f)">%s</text>`, 18, cy, 18, cy, esc(axis))
	b.f(`<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle">message size</text>`, (plotL+plotR)/2, plotB+42)

	// Bars.
	groupW := (plotR - plotL) / float64(len(mp.Sizes))
	barW := math.Min(groupW*0.8/float64(len(runners)), 70)
	for gi, size := range mp.Sizes {
		gx := plotL + groupW*float64(gi) + (groupW-barW*float64(len(runners)))/2
		b.f(`<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle">%s</text>`, plotL+groupW*(float64(gi)+0.5), plotB+20, sizeString(size))
		for i, rn := range runners {
			x := gx + barW*float64(i)
			a := r.get(m, size, rn.Label)
			if a == nil && !rn.runsAt(size) {
				continue // not run at this size
			}
			if a == nil {
				b.f(`<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle" fill="#c00" transform="rotate(-90 %.1f %.1f)">failed</text>`,
					x+barW/2, plotB-8, x+barW/2, plotB-8)
				continue
			}
			y := sc.y(a.Value)
			b.f(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %s %s</title></rect>`,
				x+1, y, barW-2, plotB-y, colors[i], esc(rn.Label), sizeString(size), fmtVal(m, a.Value), esc(m.Unit()))
			labelY := y - 4
			if m.latencyLike() && a.P99 > a.Value {
				py := sc.y(a.P99)
				cx := x + barW/2
				b.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#222"/>`, cx, y, cx, py)
				b.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#222"/>`, cx-barW/6, py, cx+barW/6, py)
				labelY = math.Min(labelY, py-4)
			}
			label := fmtVal(m, a.Value)
			if a.unstable() {
				label += "!"
			}
			fs := math.Min(10, 1.7*barW/float64(len(label))) // narrow bars get smaller digits
			b.f(`<text x="%.1f" y="%.1f" font-size="%.1f" text-anchor="middle">%s</text>`, x+barW/2, labelY, fs, label)
		}
	}
}

func (r *report) writeSVG(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(r.svg()), 0o644)
}
