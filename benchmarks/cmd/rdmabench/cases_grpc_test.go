//go:build linux

package main

import (
	"context"
	"regexp"
	"slices"
	"testing"

	"github.com/verbline/rdma"
)

// TestGRPCCases runs every gRPC case's two sides over a connection of the
// TCP fallback (an rdma.Conn, so grpcrdma's cases run too): each ends, and
// the measuring side reports a positive value. Inside Soft-RoCE make
// bench-grpc runs them over RDMA.
func TestGRPCCases(t *testing.T) {
	for _, c := range registry {
		if !slices.Contains(grpcMetrics, c.Metric) {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			lc := rdma.ListenConfig{Fallback: &rdma.Fallback{}}
			ln, err := lc.Listen(context.Background(), "rdma", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			size := c.Metric.Sizes(modeQuick)[0]
			iters := 20
			type result struct {
				s   *Sample
				err error
			}
			served := make(chan result, 1)
			go func() {
				conn, err := ln.Accept()
				if err != nil {
					served <- result{nil, err}
					return
				}
				defer conn.Close()
				s, err := c.Run(&Side{Server: true, Conn: conn, Size: size, Iters: iters})
				served <- result{s, err}
			}()
			d := rdma.Dialer{Fallback: &rdma.Fallback{}}
			conn, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			cs, cerr := c.Run(&Side{Conn: conn, Size: size, Iters: iters, Warmup: 2})
			conn.Close()
			sr := <-served
			if cerr != nil || sr.err != nil {
				t.Fatalf("client: %v; server: %v", cerr, sr.err)
			}
			s := cs
			if s == nil {
				s = sr.s
			}
			if s == nil || s.Value <= 0 {
				t.Fatalf("no positive value from either side: client %+v, server %+v", cs, sr.s)
			}
			t.Logf("%s: %s", c.Name, describeSample(c.Metric, s, size))
		})
	}
}

// TestGRPCPlan: -grpc plans the three gRPC metrics with grpc-go over RDMA
// and the ceiling as peer columns and grpc-go over TCP as the tcp column,
// and its default goals parse and name cells of that plan.
func TestGRPCPlan(t *testing.T) {
	h := &harness{metrics: grpcMetrics, work: defaultWorkload(false)}
	all := regexp.MustCompile("")
	plan := h.plan(all, all)
	if len(plan) != len(grpcMetrics) {
		t.Fatalf("%d metrics planned, want %d", len(plan), len(grpcMetrics))
	}
	labels := map[Metric][]string{}
	for _, mp := range plan {
		for _, r := range mp.runners() {
			labels[mp.Metric] = append(labels[mp.Metric], r.Kind+":"+r.Label)
		}
	}
	for m, want := range map[Metric][]string{
		GRPCUnary:  {"ours:grpcrdma-unary", "peer:grpc-go-unary", "tcp:tcp"},
		GRPCStream: {"ours:grpcrdma-stream", "peer:grpc-go-stream", "peer:msg-stream-ceiling", "tcp:tcp"},
	} {
		if !slices.Equal(labels[m], want) {
			t.Errorf("%s runs %v, want %v", m.Short(), labels[m], want)
		}
	}
	for _, spec := range defaultGRPCGoals {
		g, err := parseGoal(spec)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(labels[g.Metric], "ours:"+g.Case) && !slices.Contains(labels[g.Metric], "peer:"+g.Case) {
			t.Errorf("goal %s: no row %s in %v", spec, g.Case, labels[g.Metric])
		}
		if !slices.ContainsFunc(labels[g.Metric], func(l string) bool { return l == "tcp:"+g.Baseline || l == "peer:"+g.Baseline }) {
			t.Errorf("goal %s: no column %s in %v", spec, g.Baseline, labels[g.Metric])
		}
	}
}
