// Command cmtimeline reads `perf script` output of rdma_cm's kernel
// tracepoints (perf record -e 'rdma_cma:*' over a burst of connections,
// from this library or from rdma-core's cmtime) and prints, per step of a
// connection's set-up, the median, mean and maximum time across
// connections, in the kernel's own clock:
//
//	ADDR_RESOLVED -> ROUTE_RESOLVED      the kernel resolving the route
//	ROUTE_RESOLVED -> cm_send_req        the dialer: event to rdma_connect
//	cm_send_req -> CONNECT_REQUEST       the REQ through rxe and ib_cm
//	CONNECT_REQUEST -> cm_send_rep       the listener: event to rdma_accept
//	cm_send_rep -> CONNECT_RESPONSE      the REP through rxe and ib_cm
//	CONNECT_RESPONSE -> cm_send_rtu      the dialer: event to rdma_establish
//	cm_send_rtu -> ESTABLISHED           the RTU through rxe and ib_cm
//
// so that what the kernel's CM path takes and what the processes at either
// end take can be told apart. A connection is keyed by the dialer's port.
// Usage: perf script -F comm,pid,tid,time,event,trace -i perf.data | cmtimeline
// (scripts/setupbench runs it with TIMELINE=1). With -events FILE (the reads
// TestSetupProfile records with RDMA_SETUP_EVENTS, perf recording in
// CLOCK_MONOTONIC as the test's RDMA_SETUP_PERF_EVENTS does) it also reports
// how long each kind of event waited in its channel before the process
// read it.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

var (
	lineRE = regexp.MustCompile(`\s([0-9]+\.[0-9]+):\s+rdma_cma:(\w+): (.*)`)
	addrRE = regexp.MustCompile(`src=[0-9a-fA-F.:\[\]]*:([0-9]+) dst=[0-9a-fA-F.:\[\]]*:([0-9]+)`)
)

// steps in a connection's order; the first of each pair starts the step.
var steps = []string{"ADDR_RESOLVED", "ROUTE_RESOLVED", "cm_send_req", "CONNECT_REQUEST", "cm_send_rep", "CONNECT_RESPONSE", "cm_send_rtu", "ESTABLISHED"}

// dialerSide names the marks whose src is the dialer (the others have it as dst).
var dialerSide = map[string]bool{"ADDR_RESOLVED": true, "ROUTE_RESOLVED": true, "cm_send_req": true, "CONNECT_RESPONSE": true, "cm_send_rtu": true}

func main() {
	eventsFile := flag.String("events", "", "a file of `RDMA_SETUP_EVENTS` reads of the same round (perf recorded with -k CLOCK_MONOTONIC): also report each event's wait in its channel")
	flag.Parse()
	var events io.Reader
	if *eventsFile != "" {
		f, err := os.Open(*eventsFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "cmtimeline:", err)
			os.Exit(1)
		}
		defer f.Close()
		events = f
	}
	if err := report(os.Stdin, os.Stdout, events); err != nil {
		fmt.Fprintln(os.Stderr, "cmtimeline:", err)
		os.Exit(1)
	}
}

// summary is "median %8.0f  mean %8.0f  max %8.0f us" of d (sorted here).
func summary(d []float64) string {
	slices.Sort(d)
	sum := 0.0
	for _, x := range d {
		sum += x
	}
	med := d[len(d)/2]
	if len(d)%2 == 0 {
		med = (d[len(d)/2-1] + d[len(d)/2]) / 2
	}
	return fmt.Sprintf("median %8.0f  mean %8.0f  max %8.0f us", med, sum/float64(len(d)), d[len(d)-1])
}

// report reads perf script lines from r and writes the per-step table to w;
// with events (a file of TestSetupProfile's RDMA_SETUP_EVENTS), also how
// long each kind of event waited in its channel.
func report(r io.Reader, w io.Writer, events io.Reader) error {
	conns := map[string]map[string]float64{} // dialer port -> mark -> us
	queued := map[string]float64{}           // "TYPE src dst" -> us the kernel queued the event
	// With an events file, only the round it covers counts: the trace may
	// span the whole process (perf with the test as its workload), whose
	// priming dials came at least 3 s before the round and may have used
	// the same ports. So connections are kept only if their ports are in
	// the file, and trace lines only from 1 s before its first read.
	var reads [][]string
	ports := map[string]bool{}
	from := math.Inf(-1)
	if events != nil {
		first := math.Inf(1)
		es := bufio.NewScanner(events)
		for es.Scan() {
			f := strings.Fields(es.Text())
			if len(f) != 4 {
				continue
			}
			read, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				continue
			}
			reads = append(reads, f)
			ports[f[2]], ports[f[3]] = true, true
			first = min(first, read/1e3)
		}
		if err := es.Err(); err != nil {
			return err
		}
		from = first - 1e6
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := lineRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		sec, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			continue
		}
		t := sec * 1e6 // us
		if t < from {
			continue
		}
		mark, rest := m[2], m[3]
		event := mark == "cm_event_handler"
		if event { // "... tos=0 ROUTE_RESOLVED (2/0)"
			i := strings.Index(rest, "tos=")
			if i < 0 {
				continue
			}
			f := strings.Fields(rest[i:])
			if len(f) < 2 {
				continue
			}
			mark = f[1]
		}
		a := addrRE.FindStringSubmatch(rest)
		if a == nil {
			continue
		}
		if k := "RDMA_CM_EVENT_" + mark + " " + a[1] + " " + a[2]; event {
			if _, seen := queued[k]; !seen {
				queued[k] = t
			}
		}
		if !slices.Contains(steps, mark) {
			continue
		}
		key := a[2]
		if dialerSide[mark] {
			key = a[1]
		}
		if events != nil && !ports[key] {
			continue // a connection of another round
		}
		c := conns[key]
		if c == nil {
			c = map[string]float64{}
			conns[key] = c
		}
		if _, seen := c[mark]; !seen {
			c[mark] = t
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	var full []map[string]float64
	for _, c := range conns {
		if len(c) == len(steps) {
			full = append(full, c)
		}
	}
	if len(full) == 0 {
		return fmt.Errorf("no connection with every step (%s) in the input", strings.Join(steps, ", "))
	}
	first, last := full[0]["ADDR_RESOLVED"], full[0]["ESTABLISHED"]
	for _, c := range full {
		first, last = min(first, c["ADDR_RESOLVED"]), max(last, c["ESTABLISHED"])
	}
	fmt.Fprintf(w, "%d connections, first address resolved to last established %.0f us\n", len(full), last-first)
	for i := 0; i+1 < len(steps); i++ {
		var d []float64
		for _, c := range full {
			d = append(d, c[steps[i+1]]-c[steps[i]])
		}
		fmt.Fprintf(w, "  %-17s -> %-17s %s\n", steps[i], steps[i+1], summary(d))
	}
	if events == nil {
		return nil
	}
	// Each line: CLOCK_MONOTONIC ns of the read, type, local port, peer port.
	waits := map[string][]float64{}
	for _, f := range reads {
		read, _ := strconv.ParseFloat(f[0], 64) // parsed above
		q, ok := queued[f[1]+" "+f[2]+" "+f[3]]
		if !ok {
			continue
		}
		waits[f[1]] = append(waits[f[1]], read/1e3-q)
	}
	if len(waits) == 0 {
		return fmt.Errorf("no event of the events file is in the trace (was perf run with -k CLOCK_MONOTONIC over the same round?)")
	}
	fmt.Fprintln(w, "wait in the event channel, from the kernel queueing an event to this process reading it:")
	for _, typ := range slices.Sorted(maps.Keys(waits)) {
		fmt.Fprintf(w, "  %-32s n=%3d %s\n", typ, len(waits[typ]), summary(waits[typ]))
	}
	return nil
}
