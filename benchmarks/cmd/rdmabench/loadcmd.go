//go:build linux

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/verbline/rdma"
)

// The -load mode: one request/response workload (load.go) instead of the
// comparison plan, over our Conn (-load-net rdma) or TCP (-load-net tcp). On
// one host the server runs in the same process on the same address; with
// -connect it runs on the server host (twohost.go, run kind "load").

type loadFlags struct {
	net, view            *string
	conns, inflight      *int
	req, resp            *string
	duration             *time.Duration
	count                *int
	rate                 *float64
	seed                 *uint64
	enabled, progressOff *bool
}

func addLoadFlags() *loadFlags {
	return &loadFlags{
		enabled:     flag.Bool("load", false, "run one request/response workload (the -load-* flags) instead of the comparison"),
		net:         flag.String("load-net", "rdma", "-load: rdma (our Conn) or tcp"),
		view:        flag.String("load-view", "conn", "-load over rdma: conn (Write/Read), msg (the message view: Alloc/Send, Recv/Release) or write (one-sided writes with immediate into exported slots)"),
		conns:       flag.Int("load-conns", 1, "-load: connections"),
		inflight:    flag.Int("load-inflight", 1, "-load: requests in flight per connection (closed loop)"),
		req:         flag.String("load-req", "64", "-load: request sizes: N, uniform:MIN-MAX, list:A,B,..., file:PATH (lines \"size weight\")"),
		resp:        flag.String("load-resp", "64", "-load: response sizes, as -load-req"),
		duration:    flag.Duration("load-duration", 10*time.Second, "-load: how long to issue requests (unless -load-count)"),
		count:       flag.Int("load-count", 0, "-load: total requests (0: run for -load-duration)"),
		rate:        flag.Float64("load-rate", 0, "-load: open loop at this many requests/s over all connections, latency from each request's scheduled time (0: closed loop)"),
		seed:        flag.Uint64("load-seed", 1, "-load: seed of the size draws"),
		progressOff: flag.Bool("load-quiet", false, "-load: no per-second progress on stderr"),
	}
}

func (f *loadFlags) spec(log io.Writer) (loadSpec, error) {
	req, err := parseSizeDist(*f.req)
	if err != nil {
		return loadSpec{}, fmt.Errorf("-load-req: %w", err)
	}
	resp, err := parseSizeDist(*f.resp)
	if err != nil {
		return loadSpec{}, fmt.Errorf("-load-resp: %w", err)
	}
	s := loadSpec{Conns: *f.conns, InFlight: *f.inflight, Req: req, Resp: resp, Count: *f.count, Rate: *f.rate, Seed: *f.seed, View: *f.view}
	if s.Count == 0 {
		s.Duration = *f.duration
	}
	if !*f.progressOff {
		s.Progress = func(p progressPoint) {
			fmt.Fprintf(log, "  %5.0fs  %8.0f req/s  %s\n", p.T, p.Rate, p.latencySummary)
		}
	}
	if *f.net != "rdma" && *f.net != "tcp" {
		return s, fmt.Errorf("-load-net %q: rdma or tcp", *f.net)
	}
	if *f.net == "tcp" && s.View != "conn" {
		return s, fmt.Errorf("-load-view %s needs -load-net rdma", s.View)
	}
	return s, s.check()
}

// listenLoad listens for load connections on addr over network.
func listenLoad(network, addr string, cfg rdma.Config) (net.Listener, error) {
	if network == "tcp" {
		return net.Listen("tcp", net.JoinHostPort(addr, "0"))
	}
	return (&rdma.ListenConfig{Config: cfg}).Listen(context.Background(), "rdma", net.JoinHostPort(addr, "0"))
}

func loadDialer(network, addr string, cfg rdma.Config) func(context.Context) (net.Conn, error) {
	if network == "tcp" {
		return func(ctx context.Context) (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, "tcp", addr) }
	}
	d := rdma.Dialer{Config: cfg}
	return func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "rdma", addr) }
}

// loadMain runs -load and returns the exit status.
func (h *harness) loadMain(f *loadFlags, jsonPath, svgPath string) int {
	s, err := f.spec(h.log)
	if err != nil {
		fatalf("%v", err)
	}
	cfg := rdmaConfig(h.depth, h.spin)
	var target string
	if h.remote != nil {
		target, err = h.remote.start(ctlStart{Kind: "load", Network: *f.net, Case: s.View})
		if err != nil {
			fatalf("%v", err)
		}
	} else {
		ln, err := listenLoad(*f.net, h.addr, cfg)
		if err != nil {
			fatalf("load server: %v", err)
		}
		defer ln.Close()
		go serveLoadListener(ln, s.View, h.logf)
		target = ln.Addr().String()
	}
	h.logf("rdmabench -load: %s (%s view) to %s, %d conns, %s, requests %s, responses %s", *f.net, *f.view, target, s.Conns,
		map[bool]string{true: fmt.Sprintf("open loop at %.0f req/s", s.Rate), false: fmt.Sprintf("closed loop, %d in flight each", s.InFlight)}[s.Rate > 0],
		s.Req, s.Resp)
	res, err := runLoad(context.Background(), loadDialer(*f.net, target, cfg), s)
	if h.remote != nil {
		if d, ferr := h.remote.finish(err != nil); ferr == nil && d.Err != "" {
			h.logf("load server: %s", d.Err)
		}
	}
	if err != nil {
		h.logf("rdmabench -load: %v", err)
		return 1
	}
	fmt.Printf("%s %s view, %s loop: %d requests in %.2f s: %.0f req/s, %.2f MB/s; latency (request to response) %s, mean %.1f µs\n",
		*f.net, *f.view, res.Mode, res.Requests, res.Elapsed, res.Throughput, res.MBps, res.Latency, res.Latency.Mean)
	if jsonPath != "" {
		b, _ := json.MarshalIndent(struct {
			Network string `json:"network"`
			View    string `json:"view"`
			*loadResult
		}{*f.net, *f.view, res}, "", "  ")
		if err := os.WriteFile(jsonPath, append(b, '\n'), 0o644); err != nil {
			h.logf("rdmabench: %v", err)
			return 2
		}
		h.logf("wrote %s", jsonPath)
	}
	if svgPath != "" {
		title := fmt.Sprintf("%s %s view, %s loop, %d conns, requests %s, responses %s", *f.net, *f.view, res.Mode, res.Conns, res.Req, res.Resp)
		if err := writeLoadSVG(svgPath, res, title); err != nil {
			h.logf("rdmabench: %v", err)
			return 2
		}
		h.logf("wrote %s", svgPath)
	}
	return 0
}
