//go:build linux

package main

import (
	"fmt"
	"math"
	"os"
)

// loadSVG charts a -load run: latency over time (p50, p99 and max of each
// one-second window) and the latency histogram (requests per bucket of the
// HDR-style histogram, on a logarithmic latency axis).
func loadSVG(res *loadResult, title string) string {
	var b svgBuf
	const w, h = svgWidth, 440
	const top, bottom = 90, 380
	b.f(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s">`, w, h, w, h, fontFamily)
	b.f(`<rect width="100%%" height="100%%" fill="white"/>`)
	b.f(`<text x="%d" y="28" font-size="18" font-weight="bold">rdmabench -load: %s</text>`, padLeft, esc(title))
	b.f(`<text x="%d" y="50" font-size="11" fill="#444">%s</text>`, padLeft, esc(fmt.Sprintf(
		"%d requests in %.1f s, %.0f req/s, %.2f MB/s; latency request to response: %s",
		res.Requests, res.Elapsed, res.Throughput, res.MBps, res.Latency)))

	// Left: latency over time.
	x0, x1 := float64(padLeft), float64(w/2-30)
	var vals []float64
	for _, p := range res.Progress {
		vals = append(vals, p.P50, p.P99, p.Max)
	}
	ys := newScale(vals, bottom, top)
	b.f(`<text x="%.0f" y="%d" font-size="13" font-weight="bold">Latency over time, µs (each second)</text>`, x0, top-14)
	axisY(&b, ys, x0, x1)
	tmax := 1.0
	if n := len(res.Progress); n > 0 {
		tmax = math.Max(res.Progress[n-1].T, 1)
	}
	xt := func(t float64) float64 { return x0 + (x1-x0)*t/tmax }
	for _, t := range (scale{lo: 0, hi: tmax}).ticks() {
		b.f(`<text x="%.1f" y="%d" font-size="10" text-anchor="middle">%s</text>`, xt(t), bottom+14, tickLabel(t))
	}
	b.f(`<text x="%.0f" y="%d" font-size="11" text-anchor="middle">seconds</text>`, (x0+x1)/2, bottom+30)
	for i, s := range []struct {
		name, color string
		get         func(progressPoint) float64
	}{
		{"p50", "#1f5fa8", func(p progressPoint) float64 { return p.P50 }},
		{"p99", "#f39c12", func(p progressPoint) float64 { return p.P99 }},
		{"max", "#c0392b", func(p progressPoint) float64 { return p.Max }},
	} {
		pts := ""
		for _, p := range res.Progress {
			if p.Count > 0 {
				pts += fmt.Sprintf("%.1f,%.1f ", xt(p.T), ys.y(s.get(p)))
			}
		}
		b.f(`<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`, pts, s.color)
		b.f(`<rect x="%.0f" y="%d" width="10" height="10" fill="%s"/><text x="%.0f" y="%d" font-size="11">%s</text>`,
			x0+float64(i)*60, top-6, s.color, x0+float64(i)*60+14, top+3, s.name)
	}

	// Right: the histogram, latency on a log axis.
	hx0, hx1 := float64(w/2+padLeft-20), float64(w-padRight)
	var lat, counts []float64
	for _, bin := range res.Bins {
		lat = append(lat, bin[0])
		counts = append(counts, bin[1])
	}
	b.f(`<text x="%.0f" y="%d" font-size="13" font-weight="bold">Latency histogram (requests per bucket)</text>`, hx0, top-14)
	cs := newScale(counts, bottom, top)
	axisY(&b, cs, hx0, hx1)
	if len(lat) > 0 {
		lo, hi := logBound(math.Max(lat[0], 0.001), false), logBound(lat[len(lat)-1]*1.05, true)
		if hi <= lo {
			hi = lo * 10
		}
		xs := scale{log: true, lo: lo, hi: hi, y0: hx0, y1: hx1}
		for _, t := range xs.ticks() {
			b.f(`<text x="%.1f" y="%d" font-size="10" text-anchor="middle">%s</text>`, xs.y(t), bottom+14, tickLabel(t))
		}
		prev := lo
		for i, l := range lat {
			xa, xb := xs.y(math.Max(prev, lo)), xs.y(l)
			if xb-xa < 1 {
				xa = xb - 1
			}
			b.f(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#1f5fa8"/>`, xa, cs.y(counts[i]), xb-xa, float64(bottom)-cs.y(counts[i]))
			prev = l
		}
		for _, m := range []struct {
			name string
			v    float64
		}{{"p50", res.Latency.P50}, {"p99", res.Latency.P99}, {"p99.9", res.Latency.P999}} {
			x := xs.y(m.v)
			b.f(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#c0392b" stroke-dasharray="3,3"/><text x="%.1f" y="%d" font-size="10" fill="#c0392b">%s</text>`,
				x, top, x, bottom, x+2, top+10, m.name)
		}
	}
	b.f(`<text x="%.0f" y="%d" font-size="11" text-anchor="middle">latency, µs (log)</text>`, (hx0+hx1)/2, bottom+30)
	b.f(`</svg>`)
	return b.String()
}

// axisY draws a value axis with grid lines from x0 to x1.
func axisY(b *svgBuf, s scale, x0, x1 float64) {
	for _, t := range s.ticks() {
		y := s.y(t)
		b.f(`<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/><text x="%.0f" y="%.1f" font-size="10" text-anchor="end">%s</text>`,
			x0, y, x1, y, x0-4, y+3, tickLabel(t))
	}
	b.f(`<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#444"/>`, x0, s.y0, x1, s.y0)
}

func writeLoadSVG(path string, res *loadResult, title string) error {
	return os.WriteFile(path, []byte(loadSVG(res, title)), 0o644)
}
