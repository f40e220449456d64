//go:build linux

package main

import (
	"fmt"
	"math"
	"math/bits"
	"time"
)

// hist is an HDR-style latency histogram: values (nanoseconds) fall into
// log-linear buckets, 2^(histSubBits-1) linear buckets per power of two, so
// any value is reported within 1/2^(histSubBits-1) (0.8%) of itself, over
// the whole range, in a fixed amount of memory. Min, max, count and sum are
// exact.
type hist struct {
	counts   []uint64
	n        uint64
	sum      float64
	min, max uint64
}

const histSubBits = 8

const histHalf = 1 << (histSubBits - 1)

func newHist() *hist {
	return &hist{counts: make([]uint64, (64-histSubBits+2)*histHalf), min: math.MaxUint64}
}

// histBucket is v's bucket: values below 2^histSubBits are exact; above,
// the top histSubBits bits of v select the bucket within its power of two.
func histBucket(v uint64) int {
	l := bits.Len64(v)
	if l <= histSubBits {
		return int(v)
	}
	shift := l - histSubBits
	return shift*histHalf + int(v>>shift)
}

// histUpper is the largest value in bucket i.
func histUpper(i int) uint64 {
	if i < 2*histHalf {
		return uint64(i)
	}
	shift := i/histHalf - 1
	top := uint64(i - shift*histHalf)
	return (top+1)<<shift - 1
}

func (h *hist) record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[histBucket(v)]++
	h.n++
	h.sum += float64(v)
	h.min = min(h.min, v)
	h.max = max(h.max, v)
}

func (h *hist) merge(o *hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.min = min(h.min, o.min)
	h.max = max(h.max, o.max)
}

// quantile is the value at quantile q (0..1), nearest rank: the upper end of
// the bucket holding that rank, capped at the exact maximum.
func (h *hist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return time.Duration(min(max(histUpper(i), h.min), h.max))
		}
	}
	return time.Duration(h.max)
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
}

func (h *hist) summary() latencySummary {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	s := latencySummary{Count: h.n, Mean: us(h.mean()), P50: us(h.quantile(0.5)), P90: us(h.quantile(0.9)),
		P99: us(h.quantile(0.99)), P999: us(h.quantile(0.999))}
	if h.n > 0 {
		s.Max = us(time.Duration(h.max))
	}
	return s
}

func (s latencySummary) String() string {
	return fmt.Sprintf("p50 %.1f  p99 %.1f  p99.9 %.1f  max %.1f µs", s.P50, s.P99, s.P999, s.Max)
}

// histBins are the histogram's non-empty buckets as (upper bound µs, count),
// for the JSON and the chart.
func (h *hist) histBins() [][2]float64 {
	var out [][2]float64
	for i, c := range h.counts {
		if c > 0 {
			out = append(out, [2]float64{float64(histUpper(i)) / 1e3, float64(c)})
		}
	}
	return out
}
