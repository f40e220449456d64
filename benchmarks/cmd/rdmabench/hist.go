//go:build linux

package main

import (
	"fmt"
	"math"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// hist is a latency histogram in nanoseconds: an HdrHistogram with
// histSigFigs significant digits (every value falls in a bucket within 0.1%
// of it) from 0 to histMax, beside the exact count, sum, min and max.
// A value above histMax is recorded as histMax and counted in over: a
// quantile that falls on it reads as the top of the range, the max is exact.
// A hist is not safe for concurrent use.
type hist struct {
	h        *hdrhistogram.Histogram
	n, over  uint64
	sum      float64
	min, max int64
}

const (
	histSigFigs = 3
	// histMax is the largest value the buckets track; a round trip or request
	// that takes longer is a hang, not a latency.
	histMax = int64(time.Hour)
	// histBinSigFigs is the resolution of histBins: adjacent buckets merge
	// into 1/128 of a power of two (within 0.8%), enough for the JSON and the
	// charts, which draw one step or bar per bin.
	histBinSigFigs = 2
)

func newHist() *hist {
	return &hist{h: hdrhistogram.New(1, histMax, histSigFigs), min: math.MaxInt64}
}

func (h *hist) record(d time.Duration) {
	v := max(int64(d), 0)
	h.n++
	h.sum += float64(v)
	h.min = min(h.min, v)
	h.max = max(h.max, v)
	if v > histMax {
		v = histMax
		h.over++
	}
	if err := h.h.RecordValue(v); err != nil {
		panic(err) // v is within 0..histMax, which New(1, histMax, ...) tracks
	}
}

func (h *hist) merge(o *hist) {
	h.h.Merge(o.h) // the same geometry: nothing is dropped
	h.n += o.n
	h.over += o.over
	h.sum += o.sum
	h.min = min(h.min, o.min)
	h.max = max(h.max, o.max)
}

// quantile is the value at quantile q (0..1), nearest rank: the upper end of
// the bucket holding rank ceil(q*n) (at least 1), within [min, max] exact;
// rank n is the exact max.
func (h *hist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	n := float64(h.n)
	rank := min(max(math.Ceil(q*n), 1), n)
	if rank == n {
		return time.Duration(h.max)
	}
	// HdrHistogram takes a percentile and looks up rank round(p/100*n)
	// (at least 1); a quarter below rank rounds to it exactly.
	v := h.h.ValueAtPercentile(100 * (rank - 0.25) / n)
	return time.Duration(min(max(v, h.min), h.max))
}

func (h *hist) mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// latencySummary is what the reports show of a histogram, in µs.
type latencySummary struct {
	Count uint64  `json:"count"`
	Mean  float64 `json:"mean_us"`
	P50   float64 `json:"p50_us"`
	P90   float64 `json:"p90_us"`
	P99   float64 `json:"p99_us"`
	P999  float64 `json:"p999_us"`
	Max   float64 `json:"max_us"`
	// Over counts the values above the histogram's range (one hour), counted
	// in its top bucket; Max is exact.
	Over uint64 `json:"over_range,omitempty"`
}

func (h *hist) summary() latencySummary {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	s := latencySummary{Count: h.n, Mean: us(h.mean()), P50: us(h.quantile(0.5)), P90: us(h.quantile(0.9)),
		P99: us(h.quantile(0.99)), P999: us(h.quantile(0.999)), Over: h.over}
	if h.n > 0 {
		s.Max = us(time.Duration(h.max))
	}
	return s
}

func (s latencySummary) String() string {
	str := fmt.Sprintf("p50 %.1f  p99 %.1f  p99.9 %.1f  max %.1f µs", s.P50, s.P99, s.P999, s.Max)
	if s.Over > 0 {
		str += fmt.Sprintf("  (%d above %v)", s.Over, time.Duration(histMax))
	}
	return str
}

// histBins are the histogram's non-empty bins as (upper bound µs, count),
// for the JSON and the charts: its buckets merged to histBinSigFigs.
func (h *hist) histBins() [][2]float64 {
	coarse := hdrhistogram.New(1, histMax, histBinSigFigs)
	coarse.Merge(h.h) // coarse buckets are unions of whole fine ones
	var out [][2]float64
	for _, b := range coarse.Distribution() {
		if b.Count > 0 {
			out = append(out, [2]float64{float64(b.To) / 1e3, float64(b.Count)})
		}
	}
	return out
}
