//go:build linux

package main

import (
	"fmt"
	"slices"
)

// Metric names a measured quantity and its unit; the strings are the JSON
// "metric" values.
type Metric string

const (
	Latency   Metric = "latency_us"     // one-way (half the round trip), µs
	Bandwidth Metric = "bandwidth_MBps" // MB/s, MB = 10^6 bytes
	Rate      Metric = "rate_Mmps"      // millions of messages per second

	// The RDMA atomics (cases_atomic.go): one operation's time, the whole
	// round trip as ib_atomic_lat reports it (not halved), and millions of
	// fetch-and-adds per second with the READ/atomic depth outstanding.
	AtomicLatency Metric = "atomic_us"
	AtomicRate    Metric = "atomic_Mops"

	// rstream's pattern (rstream.go): the mean one-way time of a transfer,
	// one each way per iteration; and many transfers one way, then as many
	// back, in MB/s with both directions' transfers counted.
	RStreamLatency   Metric = "rstream_lat_us"
	RStreamBandwidth Metric = "rstream_bw_MBps"

	// The gRPC metrics (-grpc, cases_grpc.go).
	GRPCUnary   Metric = "grpc_unary_us"    // one unary call's round trip, µs
	GRPCCallers Metric = "grpc_callers_cps" // unary calls per second, 16 callers on one connection
	GRPCStream  Metric = "grpc_stream_MBps" // a bidirectional stream's request bytes, MB/s
)

// metrics lists the data path's metrics in the order they run and are
// reported; grpcMetrics are -grpc's.
var (
	metrics     = []Metric{Latency, Bandwidth, Rate, RStreamLatency, RStreamBandwidth, AtomicLatency, AtomicRate}
	grpcMetrics = []Metric{GRPCUnary, GRPCCallers, GRPCStream}
	allMetrics  = append(slices.Clone(metrics), grpcMetrics...)
)

// Short is the metric's name for -cases ("latency", "bandwidth", "rate").
func (m Metric) Short() string {
	switch m {
	case Latency:
		return "latency"
	case Bandwidth:
		return "bandwidth"
	case GRPCUnary:
		return "grpc-unary"
	case GRPCCallers:
		return "grpc-callers"
	case GRPCStream:
		return "grpc-stream"
	case AtomicLatency:
		return "atomic-lat"
	case AtomicRate:
		return "atomic-rate"
	case RStreamLatency:
		return "rstream-lat"
	case RStreamBandwidth:
		return "rstream-bw"
	}
	return "rate"
}

// Unit is the unit for tables and axes.
func (m Metric) Unit() string {
	switch m {
	case Latency, GRPCUnary, AtomicLatency, RStreamLatency:
		return "µs"
	case Bandwidth, GRPCStream, RStreamBandwidth:
		return "MB/s"
	case GRPCCallers:
		return "calls/s"
	case AtomicRate:
		return "Mops/s"
	}
	return "Mmsg/s"
}

// Title describes the metric in the table and the chart.
func (m Metric) Title() string {
	switch m {
	case Latency:
		return "Latency, one-way (round trip / 2), ping-pong"
	case Bandwidth:
		return "Bandwidth, one direction, MB = 10^6 bytes"
	case GRPCUnary:
		return "gRPC unary call, one caller, round trip"
	case GRPCCallers:
		return fmt.Sprintf("gRPC unary calls, %d callers on one connection", grpcCallersN)
	case GRPCStream:
		return "gRPC bidirectional stream, request bytes (each answered by an empty reply), MB = 10^6 bytes"
	case AtomicLatency:
		return "RDMA atomics, one operation's round trip (not halved), one outstanding"
	case AtomicRate:
		return fmt.Sprintf("RDMA fetch-and-add rate, %d outstanding, 10^6 operations/s", atomicDepth)
	case RStreamLatency:
		return "rstream's latency test: one transfer each way per iteration, mean one-way time per transfer"
	case RStreamBandwidth:
		return "rstream's bandwidth test: the transfers one way, then as many back, MB/s of both directions, MB = 10^6 bytes"
	}
	return "Message rate, 64 B messages, one direction"
}

// LowerIsBetter is true for latencies.
func (m Metric) LowerIsBetter() bool {
	return m == Latency || m == GRPCUnary || m == AtomicLatency || m == RStreamLatency
}

// latencyLike metrics have a mean and percentiles besides their median.
func (m Metric) latencyLike() bool { return m == Latency || m == GRPCUnary || m == AtomicLatency }

// A runMode is how much a run measures: -quick (make demo), the default
// (make bench) or -long (a decision).
type runMode int

const (
	modeDefault runMode = iota
	modeQuick
	modeLong
)

// Sizes are the message sizes a metric runs with. The default keeps make
// bench within about a quarter of an hour in the emulated guest: 64 B (the
// goals' size) and 4 KiB round trips, and 64 KiB streams (where messages
// turn into RDMA READs). -long adds 8 B (one inline packet, as 64 B), and
// 4 KiB and 1 MiB streams.
func (m Metric) Sizes(mode runMode) []int {
	switch {
	case m == Latency && mode == modeQuick:
		return []int{64}
	case m == Latency && mode == modeLong:
		return []int{8, 64, 4 << 10}
	case m == Latency:
		return []int{64, 4 << 10}
	case m == Bandwidth && mode == modeQuick:
		return []int{64 << 10}
	case m == Bandwidth && mode == modeLong:
		return []int{4 << 10, 64 << 10, 1 << 20}
	case m == Bandwidth:
		return []int{64 << 10}
	case m == GRPCStream:
		return []int{256 << 10}
	case m == AtomicLatency || m == AtomicRate:
		return []int{8} // an atomic's word
	case m == RStreamBandwidth:
		return []int{64 << 10}
	}
	return []int{64}
}

// Workload sizes the runs. Every implementation (ours, perftest, TCP) of a
// metric and size gets the same iterations (perftest's -n).
type Workload struct {
	LatIters int   // round trips per latency run
	BWBytes  int64 // bytes per bandwidth run (iterations = BWBytes / size)
	RateMsgs int   // messages per message-rate run
	// GRPCCalls is the unary calls of a gRPC unary run (four times as many
	// with 16 callers); the gRPC stream moves BWBytes / 2.
	GRPCCalls int
}

func defaultWorkload(quick bool) Workload {
	if quick {
		return Workload{LatIters: 300, BWBytes: 8 << 20, RateMsgs: 10000, GRPCCalls: 100}
	}
	return Workload{LatIters: 1000, BWBytes: 32 << 20, RateMsgs: 50000, GRPCCalls: 500}
}

// Iters is the number of messages (round trips for latency) for one run.
func (w Workload) Iters(m Metric, size int) int {
	switch m {
	case Latency, AtomicLatency:
		return w.LatIters
	case Bandwidth:
		return max(int(w.BWBytes/int64(size)), 8) // perftest needs at least 5
	case GRPCUnary:
		return w.GRPCCalls
	case GRPCCallers:
		return 4 * w.GRPCCalls
	case GRPCStream:
		return max(int(w.BWBytes/2/int64(size)), 8)
	case RStreamLatency:
		// Transfers each way: a mean needs no percentile, and rstream's own
		// runs are longer; capped so that the TCP column (a 64 B round trip
		// of about 0.3 ms in the guest) stays well within -timeout.
		return min(10*w.LatIters, 50000)
	case RStreamBandwidth:
		return max(int(w.BWBytes/2/int64(size)), 8) // each way: BWBytes in all
	}
	return w.RateMsgs
}

// Warmup is the untimed round trips before a latency run of ours and TCP
// (perftest does its own).
func (w Workload) Warmup(m Metric) int {
	switch m {
	case Latency, AtomicLatency:
		return max(w.LatIters/10, 10)
	case GRPCUnary:
		return max(w.GRPCCalls/10, 10)
	}
	return 0
}

func sizeString(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
