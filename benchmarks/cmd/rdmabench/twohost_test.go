//go:build linux

package main

import (
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestCheckHello(t *testing.T) {
	h := &harness{addr: "10.0.0.1", depth: 128, procs: 2}
	mine := h.localHello()
	if err := checkHello(mine, mine, nil); err != nil {
		t.Fatalf("identical hellos: %v", err)
	}
	other := mine
	other.Proto++
	other.Build = "otherrev go1.0"
	other.Cases = append(append([]string{}, mine.Cases[1:]...), "latency/new-case")
	other.Depth = 64
	err := checkHello(other, mine, map[string]bool{"depth": true})
	if err == nil {
		t.Fatal("different hellos accepted")
	}
	for _, want := range []string{"control protocol: client 2, server 1", `build: client "otherrev go1.0"`,
		`only the client has ["latency/new-case"]`, `only the server has ["` + mine.Cases[0] + `"]`,
		"-depth: client 64, server 128", "same commit"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// A depth the server was not given is taken from the client.
	other = mine
	other.Depth = 64
	if err := checkHello(other, mine, map[string]bool{}); err != nil {
		t.Fatalf("depth not given on the server: %v", err)
	}
	other.Cases = append([]string{mine.Cases[1], mine.Cases[0]}, mine.Cases[2:]...)
	if err := checkHello(other, mine, nil); err == nil || !strings.Contains(err.Error(), "different order") {
		t.Fatalf("reordered cases: %v", err)
	}
}

// TestControlHandshake runs a server's control loop on loopback TCP: a
// client whose hello matches gets the server's RDMA address and its
// parameters are adopted; one that differs gets the server's clear error.
func TestControlHandshake(t *testing.T) {
	srv := &harness{addr: "10.0.0.2", depth: 128, procs: 2, log: io.Discard, timeout: time.Minute}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.serveControl(ctx, ln, map[string]bool{"gomaxprocs": true}) }()

	cli := &harness{addr: "10.0.0.1", depth: 16, procs: 2, log: io.Discard}
	r, err := cli.dialControl(ctx, ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatalf("matching hello: %v", err)
	}
	if r.peer != "10.0.0.2" {
		t.Fatalf("peer %q, want the server's RDMA address", r.peer)
	}
	// An unknown run kind is reported to the client; the session goes on.
	if _, err := r.start(ctlStart{Kind: "bogus"}); err == nil || !strings.Contains(err.Error(), `unknown run kind "bogus"`) {
		t.Fatalf("bogus start: %v", err)
	}
	if _, err := r.start(ctlStart{Kind: "perftest", Tool: "ib_nothing", Metric: Latency}); err == nil || !strings.Contains(err.Error(), "no perftest baseline") {
		t.Fatalf("unknown tool: %v", err)
	}
	r.ctl.c.Close()

	bad := &harness{addr: "10.0.0.1", depth: 16, procs: 4, log: io.Discard}
	_, err = bad.dialControl(ctx, ln.Addr().String(), 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "-gomaxprocs: client 4, server 2") {
		t.Fatalf("differing -gomaxprocs: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if srv.depth != 16 {
		t.Fatalf("server depth %d, want the client's 16", srv.depth)
	}
}

func TestDialControlNoServer(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	h := &harness{log: io.Discard}
	_, err := h.dialControl(context.Background(), addr, time.Second)
	if err == nil || !strings.Contains(err.Error(), "rdmabench -listen") {
		t.Fatalf("got %v", err)
	}
}

func TestListensOn(t *testing.T) {
	out := "link rxe0/- cm-idn 0 state LISTEN ps TCP pid 42 comm rdmabench src-addr 169.254.78.2:35945\n" +
		"link rxe0/- cm-idn 1 state LISTEN ps TCP pid 77 comm ib_send_lat src-addr 0.0.0.0:40000\n"
	if listensOn(out, 35945, 42) {
		t.Error("our own probe listener counted as perftest's")
	}
	if !listensOn(out, 35945, 1) || !listensOn(out, 40000, 42) {
		t.Error("perftest's listener not found")
	}
	if listensOn(out, 4000, 1) || listensOn("", 40000, 1) {
		t.Error("a port prefix or nothing counted")
	}
}

func TestReportSpread(t *testing.T) {
	r := fakeReport(t)
	var b strings.Builder
	r.printTable(&b)
	if strings.Contains(b.String(), "Repetitions (in run order)") {
		t.Fatal("spread printed on one host without -v")
	}
	r.h.remote = &remote{peer: "10.0.0.2"}
	b.Reset()
	r.printTable(&b)
	out := b.String()
	if !strings.Contains(out, "Repetitions (in run order) and spread = max/min") || !strings.Contains(out, "two hosts: clients on") {
		t.Fatalf("two-host table:\n%s", out)
	}
	// Every cell with repetitions has its line, with its values and spread.
	for k, a := range r.agg {
		if len(a.Reps) < 2 {
			continue
		}
		lo, hi := a.Reps[0], a.Reps[0]
		for _, v := range a.Reps {
			lo, hi = min(lo, v), max(hi, v)
		}
		if want := fmtVal(k.Metric, a.Reps[0]); !strings.Contains(out, want) {
			t.Errorf("%v: repetition %s missing", k, want)
		}
		if want := fmt.Sprintf("%.2fx", hi/lo); !strings.Contains(out, want) {
			t.Errorf("%v: spread %s missing", k, want)
		}
	}
}

func TestLatencyPanel(t *testing.T) {
	r := fakeReport(t)
	if strings.Contains(r.svg(), "over one run") {
		t.Fatal("latency panel without series")
	}
	rtts := make([]time.Duration, 1000)
	for i := range rtts {
		rtts[i] = time.Duration(20+i%7) * time.Microsecond
	}
	rtts[500] = 10 * time.Millisecond
	s := latencySample(rtts)
	if len(s.Series) != 200 || s.Series[100][1] != 5000 || s.Series[100][0] > 13 {
		t.Fatalf("series %v", s.Series[98:102])
	}
	withSeries := 0
	for k, c := range r.cells {
		if k.Metric == Latency && !strings.HasPrefix(k.Label, "ib_") && len(c.Samples) > 0 {
			c.Samples[len(c.Samples)-1] = s
			withSeries++
		}
	}
	svg := r.svg()
	var doc struct {
		Polylines []struct{} `xml:"polyline"`
	}
	if err := xml.Unmarshal([]byte(svg), &doc); err != nil {
		t.Fatalf("not XML: %v", err)
	}
	size, runs, _ := r.latencyDetail()
	if !strings.Contains(svg, "Latency at "+sizeString(size)+" over one run") || len(runs) == 0 {
		t.Fatalf("no latency panel (%d runs)", len(runs))
	}
	// A series and a histogram line per runner with a series at that size.
	if len(doc.Polylines) != 2*len(runs) {
		t.Fatalf("%d lines for %d runners", len(doc.Polylines), len(runs))
	}
}
