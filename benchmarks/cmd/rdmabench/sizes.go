//go:build linux

package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
)

// sizeDist draws request or response sizes. Its text form (-load-req,
// -load-resp):
//
//	64                  every message 64 bytes (also "fixed:64")
//	uniform:64-4096     uniform between the two, inclusive
//	list:64,512,4096    one of them, equally likely
//	file:PATH           a histogram: lines "size weight" ("#" starts a comment)
type sizeDist struct {
	spec    string
	sizes   []int
	cum     []float64 // cumulative weights, for list and file
	lo, hi  int       // uniform
	uniform bool
}

func parseSizeDist(spec string) (*sizeDist, error) {
	d := &sizeDist{spec: spec}
	kind, arg, ok := strings.Cut(spec, ":")
	if !ok {
		kind, arg = "fixed", spec
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("size distribution %q: %s (forms: 64, uniform:64-4096, list:64,512, file:PATH)", spec, fmt.Sprintf(format, a...))
	}
	atoi := func(s string) (int, error) {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			return 0, bad("%q is not a size in bytes", s)
		}
		return n, nil
	}
	switch kind {
	case "fixed":
		n, err := atoi(arg)
		if err != nil {
			return nil, err
		}
		d.sizes, d.cum = []int{n}, []float64{1}
	case "uniform":
		a, b, ok := strings.Cut(arg, "-")
		if !ok {
			return nil, bad("want uniform:MIN-MAX")
		}
		var err error
		if d.lo, err = atoi(a); err != nil {
			return nil, err
		}
		if d.hi, err = atoi(b); err != nil {
			return nil, err
		}
		if d.hi < d.lo {
			return nil, bad("max below min")
		}
		d.uniform = true
	case "list":
		for _, f := range strings.Split(arg, ",") {
			n, err := atoi(f)
			if err != nil {
				return nil, err
			}
			d.sizes = append(d.sizes, n)
			d.cum = append(d.cum, float64(len(d.sizes)))
		}
	case "file":
		b, err := os.ReadFile(arg)
		if err != nil {
			return nil, bad("%v", err)
		}
		total := 0.0
		for i, l := range strings.Split(string(b), "\n") {
			if j := strings.IndexByte(l, '#'); j >= 0 {
				l = l[:j]
			}
			f := strings.Fields(l)
			if len(f) == 0 {
				continue
			}
			if len(f) != 2 {
				return nil, bad("line %d: want \"size weight\"", i+1)
			}
			n, err := atoi(f[0])
			if err != nil {
				return nil, err
			}
			w, err := strconv.ParseFloat(f[1], 64)
			if err != nil || w < 0 {
				return nil, bad("line %d: weight %q", i+1, f[1])
			}
			total += w
			d.sizes = append(d.sizes, n)
			d.cum = append(d.cum, total)
		}
		if total <= 0 {
			return nil, bad("no sizes with a positive weight")
		}
	default:
		return nil, bad("unknown kind %q", kind)
	}
	return d, nil
}

// next draws a size.
func (d *sizeDist) next(r *rand.Rand) int {
	if d.uniform {
		return d.lo + r.IntN(d.hi-d.lo+1)
	}
	if len(d.sizes) == 1 {
		return d.sizes[0]
	}
	x := r.Float64() * d.cum[len(d.cum)-1]
	for i, c := range d.cum {
		if x < c {
			return d.sizes[i]
		}
	}
	return d.sizes[len(d.sizes)-1]
}

// maxSize is the largest size the distribution draws.
func (d *sizeDist) maxSize() int {
	if d.uniform {
		return d.hi
	}
	m := 0
	for _, s := range d.sizes {
		m = max(m, s)
	}
	return m
}

func (d *sizeDist) String() string { return d.spec }
