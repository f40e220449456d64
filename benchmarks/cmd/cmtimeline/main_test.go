package main

import (
	"strings"
	"testing"
)

// Two connections (dialer ports 1001 and 1002 to the listener's 7000), in
// the formats perf script prints for rdma_cma's tracepoints; noise lines
// and an incomplete third connection are ignored.
const sample = `
 kworker/u4:1  25/25  1.000000: rdma_cma:cm_event_handler: cm.id=1 src=10.0.0.1:1001 dst=10.0.0.1:7000 tos=0 ADDR_RESOLVED (0/0)
 kworker/u4:1  25/25  1.000010: rdma_cma:cm_event_handler: cm.id=2 src=10.0.0.1:1002 dst=10.0.0.1:7000 tos=0 ADDR_RESOLVED (0/0)
 kworker/u4:1  25/25  1.000100: rdma_cma:cm_event_handler: cm.id=1 src=10.0.0.1:1001 dst=10.0.0.1:7000 tos=0 ROUTE_RESOLVED (2/0)
 kworker/u4:1  25/25  1.000300: rdma_cma:cm_event_handler: cm.id=2 src=10.0.0.1:1002 dst=10.0.0.1:7000 tos=0 ROUTE_RESOLVED (2/0)
 kworker/u4:1  25/25  1.000300: rdma_cma:cm_event_done: cm.id=2 src=10.0.0.1:1002 dst=10.0.0.1:7000 tos=0 ROUTE_RESOLVED consumer returns 0
 prog  9/9  1.000200: rdma_cma:cm_send_req: cm.id=1 src=10.0.0.1:1001 dst=10.0.0.1:7000 tos=0 qp_num=17
 prog  9/9  1.000500: rdma_cma:cm_send_req: cm.id=2 src=10.0.0.1:1002 dst=10.0.0.1:7000 tos=0 qp_num=18
 kworker/0:2  54/54  1.000300: rdma_cma:cm_req_handler: cm.id=0 src=10.0.0.1:7000 dst=0.0.0.0:0 tos=0 REQ_RECEIVED (1)
 kworker/0:2  54/54  1.000400: rdma_cma:cm_event_handler: cm.id=3 src=10.0.0.1:7000 dst=10.0.0.1:1001 tos=0 CONNECT_REQUEST (4/0)
 kworker/0:2  54/54  1.000600: rdma_cma:cm_event_handler: cm.id=4 src=10.0.0.1:7000 dst=10.0.0.1:1002 tos=0 CONNECT_REQUEST (4/0)
 srv  8/8  1.001400: rdma_cma:cm_send_rep: cm.id=3 src=10.0.0.1:7000 dst=10.0.0.1:1001 tos=0 qp_num=19
 srv  8/8  1.003600: rdma_cma:cm_send_rep: cm.id=4 src=10.0.0.1:7000 dst=10.0.0.1:1002 tos=0 qp_num=20
 kworker/1:0  22/22  1.001500: rdma_cma:cm_event_handler: cm.id=1 src=10.0.0.1:1001 dst=10.0.0.1:7000 tos=0 CONNECT_RESPONSE (5/0)
 kworker/1:0  22/22  1.003700: rdma_cma:cm_event_handler: cm.id=2 src=10.0.0.1:1002 dst=10.0.0.1:7000 tos=0 CONNECT_RESPONSE (5/0)
 prog  9/9  1.001600: rdma_cma:cm_send_rtu: cm.id=1 src=10.0.0.1:1001 dst=10.0.0.1:7000 tos=0
 prog  9/9  1.003800: rdma_cma:cm_send_rtu: cm.id=2 src=10.0.0.1:1002 dst=10.0.0.1:7000 tos=0
 kworker/0:2  54/54  1.001700: rdma_cma:cm_event_handler: cm.id=3 src=10.0.0.1:7000 dst=10.0.0.1:1001 tos=0 ESTABLISHED (9/0)
 kworker/0:2  54/54  1.003900: rdma_cma:cm_event_handler: cm.id=4 src=10.0.0.1:7000 dst=10.0.0.1:1002 tos=0 ESTABLISHED (9/0)
 kworker/u4:1  25/25  1.000020: rdma_cma:cm_event_handler: cm.id=5 src=10.0.0.1:1003 dst=10.0.0.1:7000 tos=0 ADDR_RESOLVED (0/0)
 not a trace line
 x  1/1  1.000001: rdma_cma:cm_event_handler: without a type
`

func TestReport(t *testing.T) {
	var out strings.Builder
	if err := report(strings.NewReader(sample), &out, nil); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"2 connections, first address resolved to last established 3900 us",
		// the listener's step: 1000 us for port 1001, 3000 for 1002
		"CONNECT_REQUEST   -> cm_send_rep       median     2000  mean     2000  max     3000 us",
		"ROUTE_RESOLVED    -> cm_send_req       median      150  mean      150  max      200 us",
		"cm_send_rtu       -> ESTABLISHED       median      100  mean      100  max      100 us",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
}

func TestReportEmpty(t *testing.T) {
	var out strings.Builder
	if err := report(strings.NewReader("nothing here\n"), &out, nil); err == nil {
		t.Fatalf("no error for an input without connections; output:\n%s", out.String())
	}
}

// The events file's reads are joined with the kernel's queueing of the
// same events: ROUTE_RESOLVED of port 1001 queued at 1.000100 s, read at
// 1.000150 s; of 1002 queued at 1.000300 s, read at 1.000450 s.
func TestReportEvents(t *testing.T) {
	events := "1000150000 RDMA_CM_EVENT_ROUTE_RESOLVED 1001 7000\n" +
		"1000450000 RDMA_CM_EVENT_ROUTE_RESOLVED 1002 7000\n" +
		"1001450000 RDMA_CM_EVENT_CONNECT_REQUEST 7000 1001\n" +
		"1009999999 RDMA_CM_EVENT_ESTABLISHED 7000 9999\n" // not in the trace
	var out strings.Builder
	if err := report(strings.NewReader(sample), &out, strings.NewReader(events)); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"RDMA_CM_EVENT_ROUTE_RESOLVED     n=  2 median      100  mean      100  max      150 us",
		"RDMA_CM_EVENT_CONNECT_REQUEST    n=  1 median     1050  mean     1050  max     1050 us",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, "RDMA_CM_EVENT_ESTABLISHED") {
		t.Errorf("an event missing from the trace was reported:\n%s", got)
	}
	out.Reset()
	if err := report(strings.NewReader(sample), &out, strings.NewReader("5 RDMA_CM_EVENT_X 1 2\n")); err == nil {
		t.Error("no error when no event of the file is in the trace")
	}
}

// With an events file, a connection of an earlier round (the priming dials,
// recorded when perf ran over the whole test process) is left out, even on
// a port the round reused, and so are ports the file does not name.
func TestReportEventsRound(t *testing.T) {
	events := "1000150000 RDMA_CM_EVENT_ROUTE_RESOLVED 1001 7000\n" +
		"1000450000 RDMA_CM_EVENT_ROUTE_RESOLVED 1002 7000\n"
	earlier := " kworker/u4:1  25/25  0.000050: rdma_cma:cm_event_handler: cm.id=9 src=10.0.0.1:1001 dst=10.0.0.1:7000 tos=0 ADDR_RESOLVED (0/0)\n"
	other := strings.ReplaceAll(sample, ":1002 ", ":1004 ") // the same connection on a port the file does not name
	var out strings.Builder
	if err := report(strings.NewReader(earlier+sample+other), &out, strings.NewReader(events)); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "2 connections, first address resolved to last established 3900 us"; !strings.Contains(got, want) {
		t.Errorf("missing %q in:\n%s", want, got)
	}
}
