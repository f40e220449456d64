//go:build linux

package main

import (
	"fmt"
	"math"
)

// latencyDetail picks, for the chart's latency-over-time and histogram
// panel, the latency runners with a series (ours and TCP; perftest prints
// none) at the first latency size, each with its last repetition's sample.
func (r *report) latencyDetail() (size int, runs []runner, samples []*Sample) {
	for _, mp := range r.plan {
		if mp.Metric != Latency || len(mp.Sizes) == 0 {
			continue
		}
		size = mp.Sizes[0]
		for _, run := range mp.runners() {
			c := r.cells[cellKey{Latency, size, run.Label}]
			if c == nil || len(c.Samples) == 0 {
				continue
			}
			s := c.Samples[len(c.Samples)-1]
			if len(s.Series) == 0 || len(s.Hist) == 0 {
				continue
			}
			runs = append(runs, run)
			samples = append(samples, s)
		}
	}
	return size, runs, samples
}

// latencyPanel draws, beside the bars, the one-way latency over a run (the
// median of each chunk of round trips, in run order) and the latency
// histograms (share of round trips per bucket, as a step line), one colour
// per runner.
func (r *report) latencyPanel(b *svgBuf, top int) {
	size, runs, samples := r.latencyDetail()
	if len(runs) == 0 {
		return
	}
	y0, y1 := float64(top+panelH-padBottom), float64(top+padTop)
	b.f(`<text x="%d" y="%d" font-size="14" font-weight="bold">Latency at %s over one run (last repetition; median per chunk of round trips) and its histogram</text>`,
		padLeft, top+22, sizeString(size))
	var all []float64
	var lo, hi = math.Inf(1), 0.0
	for _, s := range samples {
		for _, p := range s.Series {
			all = append(all, p[0])
		}
		for _, h := range s.Hist {
			lo, hi = math.Min(lo, h[0]), math.Max(hi, h[0])
		}
	}
	ys := newScale(all, y0, y1)
	x0, x1 := float64(padLeft), float64(svgWidth/2-20)
	axisY(b, ys, x0, x1)
	b.f(`<text x="%.0f" y="%.0f" font-size="11" text-anchor="middle">round trips, in order (one-way µs)</text>`, (x0+x1)/2, y0+30)
	hx0, hx1 := float64(svgWidth/2+padLeft-40), float64(svgWidth-padRight)
	xs := scale{log: true, lo: logBound(math.Max(lo, 0.001), false), hi: logBound(hi*1.05, true), y0: hx0, y1: hx1}
	if xs.hi <= xs.lo {
		xs.hi = xs.lo * 10
	}
	hs := scale{lo: 0, hi: 1, y0: y0, y1: y1}
	var maxShare float64
	for _, s := range samples {
		n := 0.0
		for _, h := range s.Hist {
			n += h[1]
		}
		for _, h := range s.Hist {
			maxShare = math.Max(maxShare, h[1]/n)
		}
	}
	hs.hi = niceStep(maxShare*1.1/5) * 5
	axisY(b, hs, hx0, hx1)
	for _, t := range xs.ticks() {
		b.f(`<text x="%.1f" y="%.0f" font-size="10" text-anchor="middle">%s</text>`, xs.y(t), y0+14, tickLabel(t))
	}
	b.f(`<text x="%.0f" y="%.0f" font-size="11" text-anchor="middle">one-way latency, µs (log); share of round trips per bucket</text>`, (hx0+hx1)/2, y0+30)
	oursIdx := 0
	for i, run := range runs {
		color := seriesColor(run, oursIdx)
		if run.Kind == "ours" {
			oursIdx++
		}
		s := samples[i]
		pts := ""
		for j, p := range s.Series {
			x := x0 + (x1-x0)*float64(j)/math.Max(float64(len(s.Series)-1), 1)
			pts += fmt.Sprintf("%.1f,%.1f ", x, ys.y(p[0]))
		}
		b.f(`<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5"/>`, pts, color)
		n := 0.0
		for _, h := range s.Hist {
			n += h[1]
		}
		pts = ""
		prev := xs.lo
		for _, h := range s.Hist {
			y := hs.y(h[1] / n)
			pts += fmt.Sprintf("%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f ", xs.y(prev), y0, xs.y(prev), y, xs.y(h[0]), y, xs.y(h[0]), y0)
			prev = h[0]
		}
		b.f(`<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5"/>`, pts, color)
		b.f(`<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d" font-size="11">%s</text>`,
			padLeft+i*150, top+36, color, padLeft+i*150+14, top+45, esc(run.Label))
	}
}
