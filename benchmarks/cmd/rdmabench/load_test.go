//go:build linux

package main

import (
	"context"
	"encoding/xml"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestHistRange(t *testing.T) {
	// Small values are exact, every value up to the range's top is kept
	// within 0.1%, and a value above it is counted, not lost.
	h := newHist()
	vals := []time.Duration{0, 1, 2, 1000, 2047, 2048, 123457, time.Second + 1, time.Minute + 7, time.Duration(histMax)}
	for _, v := range vals {
		o := newHist()
		o.record(v)
		o.record(time.Duration(histMax)) // so that the median is v's bucket, not the exact max
		got := o.quantile(0.5)
		if got < v || float64(got-v) > float64(v)/1000 {
			t.Errorf("value %d: reported %d", v, got)
		}
		if v <= 2047 && got != v {
			t.Errorf("value %d not exact: %d", v, got)
		}
		if bins := o.histBins(); bins[0][0]*1e3 < float64(v) || bins[0][0]*1e3 > float64(v)*1.008+1 {
			t.Errorf("value %d: bins %v", v, bins)
		}
		h.merge(o)
	}
	h.record(-5)            // recorded as 0
	h.record(2 * time.Hour) // above the range
	n := uint64(2*len(vals) + 2)
	s := h.summary()
	if s.Count != n || s.Over != 1 || s.Max != float64(2*time.Hour/time.Microsecond) || h.quantile(1) != 2*time.Hour {
		t.Fatalf("summary %+v, quantile(1) %v", s, h.quantile(1))
	}
	if top := h.quantile(0.9); top < time.Duration(histMax) || float64(top-time.Duration(histMax)) > float64(histMax)/1000 {
		t.Fatalf("top of the range: %v", top)
	}
	if !strings.Contains(s.String(), "1 above 1h0m0s") {
		t.Fatalf("summary line %q", s)
	}
	sum := 0.0
	for _, b := range h.histBins() {
		sum += b[1]
	}
	if sum != float64(n) {
		t.Fatalf("bins count %v, want %d", sum, n)
	}
}

func TestHistQuantiles(t *testing.T) {
	h := newHist()
	for i := 1; i <= 10000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 5000 * time.Microsecond}, {0.99, 9900 * time.Microsecond}, {0.999, 9990 * time.Microsecond}, {1, 10000 * time.Microsecond}} {
		got := h.quantile(c.q)
		if got < c.want || float64(got-c.want) > float64(c.want)/1000 {
			t.Errorf("q %v: %v, want %v within 0.1%%", c.q, got, c.want)
		}
	}
	if h.quantile(1) != 10000*time.Microsecond || h.mean() != 5000500*time.Nanosecond {
		t.Errorf("max %v or mean %v not exact", h.quantile(1), h.mean())
	}
	o := newHist()
	o.record(time.Second)
	h.merge(o)
	if s := h.summary(); s.Count != 10001 || h.quantile(1) != time.Second || s.Max != 1e6 {
		t.Fatalf("merge: %+v, max %v", s, h.quantile(1))
	}
	if s := newHist().summary(); s != (latencySummary{}) || len(newHist().histBins()) != 0 {
		t.Fatalf("empty: %+v", s)
	}

	// Nearest rank: the reported value is the upper end of the bucket that
	// holds value number ceil(q*n) in sorted order, so it is at least that
	// value and within 0.1% of it.
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 2, 3, 7, 10, 99, 1000, 4321} {
		h := newHist()
		vals := make([]time.Duration, n)
		for i := range vals {
			vals[i] = time.Duration(r.ExpFloat64() * 20000)
			h.record(vals[i])
		}
		slices.Sort(vals)
		for _, q := range []float64{0, 0.1, 0.25, 0.5, 0.54, 0.55, 0.9, 0.99, 0.999, 1} {
			rank := min(max(int(math.Ceil(q*float64(n))), 1), n)
			want, got := vals[rank-1], h.quantile(q)
			if got < want || float64(got-want) > float64(want)/1000 {
				t.Errorf("n %d q %v: %v, nearest rank %d is %v", n, q, got, rank, want)
			}
		}
		if h.quantile(1) != vals[n-1] || h.quantile(0) < vals[0] {
			t.Errorf("n %d: max %v (exact %v), min %v (exact %v)", n, h.quantile(1), vals[n-1], h.quantile(0), vals[0])
		}
	}
}

func TestHistBins(t *testing.T) {
	// Bins are merged buckets: in order, counts adding up, and few enough to
	// draw (128 per power of two at most).
	h := newHist()
	r := rand.New(rand.NewPCG(5, 6))
	for range 100000 {
		h.record(time.Duration(5000 + r.ExpFloat64()*20000))
	}
	bins := h.histBins()
	n, prev := 0.0, 0.0
	for _, b := range bins {
		if b[0] <= prev {
			t.Fatalf("bins out of order: %v", bins)
		}
		prev = b[0]
		n += b[1]
	}
	octaves := math.Log2(float64(h.max) / float64(h.min))
	if n != 100000 || float64(len(bins)) > 128*(octaves+1) {
		t.Fatalf("%d bins over %.1f octaves, counts %v", len(bins), octaves, n)
	}
}

// BenchmarkHistRecord is the cost of record, which runs between round trips.
func BenchmarkHistRecord(b *testing.B) {
	h := newHist()
	r := rand.New(rand.NewPCG(7, 8))
	vals := make([]time.Duration, 4096)
	for i := range vals {
		vals[i] = time.Duration(10000 + r.ExpFloat64()*5000)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		h.record(vals[i&4095])
	}
}

func TestSizeDist(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "sizes")
	os.WriteFile(file, []byte("# size weight\n64 3\n4096 1 # big\n\n"), 0o644)
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		spec    string
		allowed map[int]float64 // size -> expected share (0: any share)
		lo, hi  int
	}{
		{spec: "64", allowed: map[int]float64{64: 1}},
		{spec: "fixed:100", allowed: map[int]float64{100: 1}},
		{spec: "list:1,2,3", allowed: map[int]float64{1: 1.0 / 3, 2: 1.0 / 3, 3: 1.0 / 3}},
		{spec: "file:" + file, allowed: map[int]float64{64: 0.75, 4096: 0.25}},
		{spec: "uniform:10-19", lo: 10, hi: 19},
	} {
		d, err := parseSizeDist(c.spec)
		if err != nil {
			t.Fatalf("%s: %v", c.spec, err)
		}
		counts := map[int]int{}
		const n = 20000
		for range n {
			counts[d.next(r)]++
		}
		if c.allowed == nil {
			if len(counts) != c.hi-c.lo+1 {
				t.Errorf("%s: drew %d distinct sizes, want %d", c.spec, len(counts), c.hi-c.lo+1)
			}
			for s := range counts {
				if s < c.lo || s > c.hi {
					t.Errorf("%s: drew %d", c.spec, s)
				}
			}
			if d.maxSize() != c.hi {
				t.Errorf("%s: maxSize %d", c.spec, d.maxSize())
			}
			continue
		}
		for s, k := range counts {
			share, ok := c.allowed[s]
			if !ok {
				t.Fatalf("%s: drew %d", c.spec, s)
			}
			if math.Abs(float64(k)/n-share) > 0.02 {
				t.Errorf("%s: size %d drawn %.3f of the time, want %.3f", c.spec, s, float64(k)/n, share)
			}
		}
	}
	for _, bad := range []string{"", "x", "uniform:5", "uniform:9-3", "list:1,a", "file:/nonexistent", "gauss:1", "-4"} {
		if _, err := parseSizeDist(bad); err == nil || !strings.Contains(err.Error(), "forms:") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// loopbackLoad serves the load protocol on TCP loopback; stall, if set, is
// called before each response.
func loopbackLoad(t *testing.T, stall func()) func(context.Context) (net.Conn, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if stall == nil {
					serveLoad(c)
					return
				}
				serveLoad(stallConn{c, stall})
			}()
		}
	}()
	return func(ctx context.Context) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", ln.Addr().String())
	}
}

// stallConn calls stall before every write.
type stallConn struct {
	net.Conn
	stall func()
}

func (c stallConn) Write(b []byte) (int, error) { c.stall(); return c.Conn.Write(b) }

func mustDist(t *testing.T, spec string) *sizeDist {
	d, err := parseSizeDist(spec)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestLoadClosedLoopCount(t *testing.T) {
	dial := loopbackLoad(t, nil)
	res, err := runLoad(context.Background(), dial, loadSpec{Conns: 3, InFlight: 4, Count: 1000,
		Req: mustDist(t, "uniform:0-2000"), Resp: mustDist(t, "list:1,100,70000"), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 1000 || res.Latency.Count != 1000 || res.Mode != "closed" {
		t.Fatalf("result %+v", res)
	}
	n := 0.0
	for _, b := range res.Bins {
		n += b[1]
	}
	if n != 1000 || !(res.Latency.P50 > 0 && res.Latency.P50 <= res.Latency.P99 && res.Latency.P99 <= res.Latency.Max) {
		t.Fatalf("histogram %v counts %v; latency %+v", res.Bins, n, res.Latency)
	}
	if res.MBps <= 0 || res.Throughput <= 0 {
		t.Fatalf("throughput %+v", res)
	}
}

func TestLoadDurationAndProgress(t *testing.T) {
	dial := loopbackLoad(t, nil)
	var points atomic.Int32
	res, err := runLoad(context.Background(), dial, loadSpec{Conns: 2, InFlight: 1, Duration: 2200 * time.Millisecond,
		Req: mustDist(t, "64"), Resp: mustDist(t, "64"), Progress: func(progressPoint) { points.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Elapsed < 2.2 || res.Elapsed > 5 || res.Requests == 0 {
		t.Fatalf("elapsed %.2f s, %d requests", res.Elapsed, res.Requests)
	}
	if points.Load() < 2 || len(res.Progress) < 2 || res.Progress[0].Requests == 0 {
		t.Fatalf("%d progress calls, points %+v", points.Load(), res.Progress)
	}
}

// TestLoadOpenLoopCountsStalls: the client's 50th Write stalls for 500 ms
// (as a send blocked on credits would). In open loop at 200 requests/s the
// requests scheduled during the stall are sent late, and their latency,
// measured from the schedule, shows it: about 100 requests (500 ms x 200/s)
// are late by up to 500 ms, 80 of them (27%) by more than 100 ms, so p90 is
// above 100 ms. Measured from the send (closed loop, one in flight) the same
// stall is one slow request and p90 stays small: coordinated omission.
func TestLoadOpenLoopCountsStalls(t *testing.T) {
	stallingDial := func() func(context.Context) (net.Conn, error) {
		dial := loopbackLoad(t, nil)
		var n atomic.Int32
		stall := func() {
			if n.Add(1) == 50 {
				time.Sleep(500 * time.Millisecond)
			}
		}
		return func(ctx context.Context) (net.Conn, error) {
			c, err := dial(ctx)
			if err != nil {
				return nil, err
			}
			return stallConn{c, stall}, nil
		}
	}
	open, err := runLoad(context.Background(), stallingDial(), loadSpec{Conns: 1, Rate: 200, Count: 300,
		Req: mustDist(t, "64"), Resp: mustDist(t, "64")})
	if err != nil {
		t.Fatal(err)
	}
	if open.Mode != "open" || open.Requests != 300 {
		t.Fatalf("open: %+v", open)
	}
	if open.Latency.Max < 480e3 || open.Latency.P90 < 100e3 {
		t.Fatalf("open loop hides the stall: %+v", open.Latency)
	}
	// Its rate follows the schedule: 300 requests at 200/s take ~1.5 s.
	if open.Elapsed < 1.45 || open.Elapsed > 3 {
		t.Fatalf("open loop took %.2f s for 300 requests at 200/s", open.Elapsed)
	}
	closed, err := runLoad(context.Background(), stallingDial(), loadSpec{Conns: 1, InFlight: 1, Count: 300,
		Req: mustDist(t, "64"), Resp: mustDist(t, "64")})
	if err != nil {
		t.Fatal(err)
	}
	if closed.Latency.Max < 480e3 || closed.Latency.P90 > 50e3 {
		t.Fatalf("closed loop: %+v", closed.Latency)
	}
}

func TestLoadServerGone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close() // answers nothing
		}
	}()
	dial := func(ctx context.Context) (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) }
	_, err = runLoad(context.Background(), dial, loadSpec{Conns: 1, InFlight: 2, Count: 100, Req: mustDist(t, "64"), Resp: mustDist(t, "64")})
	if err == nil || !strings.Contains(err.Error(), "connection 1") {
		t.Fatalf("got %v", err)
	}
	if _, err := runLoad(context.Background(), dial, loadSpec{Conns: 1, Req: mustDist(t, "64"), Resp: mustDist(t, "64")}); err == nil {
		t.Fatal("no count, duration or in-flight accepted")
	}
}

func TestLoadSVG(t *testing.T) {
	res, err := runLoad(context.Background(), loopbackLoad(t, nil), loadSpec{Conns: 1, InFlight: 2, Duration: 2100 * time.Millisecond,
		Req: mustDist(t, "64"), Resp: mustDist(t, "uniform:1-5000")})
	if err != nil {
		t.Fatal(err)
	}
	s := loadSVG(res, "test <&>")
	var doc struct {
		Polylines []struct {
			Points string `xml:"points,attr"`
		} `xml:"polyline"`
		Rects []struct{} `xml:"rect"`
	}
	if err := xml.Unmarshal([]byte(s), &doc); err != nil {
		t.Fatalf("not XML: %v", err)
	}
	if len(doc.Polylines) != 3 {
		t.Fatalf("%d lines, want p50, p99, max", len(doc.Polylines))
	}
	for _, p := range doc.Polylines {
		if n := len(strings.Fields(p.Points)); n != len(res.Progress) {
			t.Fatalf("line with %d points for %d seconds", n, len(res.Progress))
		}
	}
	// Background, 3 legend squares, one bar per non-empty bucket.
	if want := 1 + 3 + len(res.Bins); len(doc.Rects) != want {
		t.Fatalf("%d rects, want %d", len(doc.Rects), want)
	}
}
