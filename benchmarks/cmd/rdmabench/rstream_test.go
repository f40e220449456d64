//go:build linux

package main

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestParseRStream reads rstream's report lines as rdma-core's rstream
// prints them in custom mode, and refuses output without one.
func TestParseRStream(t *testing.T) {
	out := "name      bytes   xfers   iters   total       time     Gb/sec    usec/xfer\n" +
		"custom    64      1       10k     1.2m       0.53s      2.41      21.21\n"
	s, err := parseRStream(out, RStreamLatency, 64)
	if err != nil || s.Value != 21.21 {
		t.Fatalf("latency: %+v, %v; want 21.21 µs", s, err)
	}
	out = "name      bytes   xfers   iters   total       time     Gb/sec    usec/xfer\n" +
		"custom    64k     256     1       32m        0.80s      0.33   1562.50\n"
	s, err = parseRStream(out, RStreamBandwidth, 64<<10)
	if err != nil || math.Abs(s.Value-65536/1562.5) > 1e-9 {
		t.Fatalf("bandwidth: %+v, %v; want %.3f MB/s", s, err, 65536/1562.5)
	}
	for _, bad := range []string{"", "rconnect: Connection refused\n", "custom 64 1 10k 1.2m 0.53s 2.41 nan-ish\n"} {
		if s, err := parseRStream(bad, RStreamLatency, 64); err == nil {
			t.Errorf("parseRStream(%q) = %+v, want an error", bad, s)
		}
	}
}

// TestRStreamShape: the latency test is one transfer each way per
// iteration, the bandwidth test one iteration of them all, on rstream's
// command line and in conn-rstream's value alike (a time per transfer over
// both directions' transfers, as rstream's usec/xfer).
func TestRStreamShape(t *testing.T) {
	if got := rstreamArgs(RStreamLatency, 64, 1000); !slices.Equal(got, strings.Fields("rstream -S 64 -C 1 -I 1000")) {
		t.Errorf("latency args %q", got)
	}
	if got := rstreamArgs(RStreamBandwidth, 65536, 256); !slices.Equal(got, strings.Fields("rstream -S 65536 -C 256 -I 1")) {
		t.Errorf("bandwidth args %q", got)
	}
	// 1000 round trips in 40 ms: 2000 transfers, 20 µs each.
	if s := rstreamSample(RStreamLatency, 64, 1000, 40*time.Millisecond); math.Abs(s.Value-20) > 1e-9 {
		t.Errorf("latency sample %v µs, want 20", s.Value)
	}
	// 256 transfers of 64 KiB each way in 1 s: 512 x 65536 bytes.
	if s := rstreamSample(RStreamBandwidth, 65536, 256, time.Second); math.Abs(s.Value-512*65536/1e6) > 1e-9 {
		t.Errorf("bandwidth sample %v MB/s, want %v", s.Value, 512*65536/1e6)
	}
}
