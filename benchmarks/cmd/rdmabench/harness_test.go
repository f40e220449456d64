//go:build linux

package main

import (
	"encoding/json"
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Output of perftest 4.5 in the Soft-RoCE guest (tabs and spacing as printed).
const sendLatOut = `---------------------------------------------------------------------------------------
                    Send Latency Test
 Dual-port       : OFF		Device         : rxe0
 rdma_cm QPs	 : ON
 Data ex. method : rdma_cm
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 64      1000          13.58          89659.50      19.96    	       451.56      	1349.18		5865.76 		89659.50
---------------------------------------------------------------------------------------
`

const sendBWOut = `---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      1000             17.72              15.10  		   0.000242
---------------------------------------------------------------------------------------
`

func TestParsePerftestLatency(t *testing.T) {
	s, err := parsePerftest(sendLatOut, Latency, 64)
	if err != nil {
		t.Fatal(err)
	}
	want := Sample{Value: 19.96, Avg: 451.56, P99: 5865.76, P999: 89659.50}
	if !reflect.DeepEqual(*s, want) {
		t.Fatalf("got %+v, want %+v", *s, want)
	}
}

func TestParsePerftestBandwidth(t *testing.T) {
	s, err := parsePerftest(sendBWOut, Bandwidth, 65536)
	if err != nil {
		t.Fatal(err)
	}
	// 15.10 MiB/s = 15.10 * 1.048576 MB/s; MsgRate x size = 0.000242 * 65536.
	if math.Abs(s.Value-15.8335) > 0.001 || math.Abs(s.Check-15.8597) > 0.001 {
		t.Fatalf("got %+v", *s)
	}
	if v := checkVerdict(s, 65536); !strings.Contains(v, "agrees") {
		t.Fatalf("check: %s", v)
	}
	r, err := parsePerftest(sendBWOut, Rate, 65536)
	if err != nil || r.Value != 0.000242 {
		t.Fatalf("rate: %+v, %v", r, err)
	}
}

func TestParsePerftestFailures(t *testing.T) {
	zero := strings.Replace(sendBWOut, "15.10  		   0.000242", "0.00  		   0.000000", 1)
	for name, tc := range map[string]struct {
		out  string
		size int
	}{
		"zero":     {zero, 65536},
		"no table": {"Unexpected CM event bl blka 8\n Unable to perform rdma_client function\n", 65536},
		"no row":   {sendBWOut, 64},
	} {
		if s, err := parsePerftest(tc.out, Bandwidth, tc.size); err == nil {
			t.Errorf("%s: no error, got %+v", name, s)
		}
	}
}

func TestHeaderColumns(t *testing.T) {
	got := headerColumns(strings.Fields("#bytes #iterations    t_min[usec]  99% percentile[usec]   99.9% percentile[usec]"))
	want := []string{"#bytes", "#iterations", "t_min[usec]", "99% percentile[usec]", "99.9% percentile[usec]"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q", got)
	}
}

func TestStatistics(t *testing.T) {
	rtts := make([]time.Duration, 1000)
	for i := range rtts {
		rtts[i] = time.Duration(2*(i+1)) * time.Microsecond // one-way 1..1000 µs
	}
	s := latencySample(rtts)
	if s.Value != 500.5 || s.P99 != 990 || s.P999 != 999 || s.Avg != 500.5 {
		t.Fatalf("got %+v", *s)
	}
}

func TestPerftestArgs(t *testing.T) {
	got := strings.Join(perftestTool{Cmd: "ib_send_bw", Metric: Bandwidth}.args(4096, 100, 128, 0), " ")
	if got != "ib_send_bw -R -s 4096 -n 100 -t 128 -r 128" {
		t.Fatal(got)
	}
	got = strings.Join(perftestTool{Cmd: "ib_write_lat", Metric: Latency}.args(8, 1000, 128, 0), " ")
	if got != "ib_write_lat -R -s 8 -n 1000" {
		t.Fatal(got)
	}
	// UD runs without -R, addressing the peer by GID index.
	ud := perftestTool{Cmd: "ib_send_bw", Metric: Rate, Conn: "UD", MaxSize: udMaxSize}
	if got = strings.Join(ud.args(64, 100, 128, 3), " "); got != "ib_send_bw -x 3 -s 64 -n 100 -c UD -t 128 -r 128" {
		t.Fatal(got)
	}
	if ud.Label() != "ib_send_bw -c UD" || !(runner{Kind: "perftest", Tool: &ud}).runsAt(64) || (runner{Kind: "perftest", Tool: &ud}).runsAt(4096) {
		t.Fatalf("label %q, or runsAt wrong", ud.Label())
	}
}

// fakeReport is a report as a -long run (every size) with every cell filled would produce.
func fakeReport(t *testing.T) *report {
	h := &harness{addr: "169.254.77.1", depth: 128, rounds: 3, latRounds: 3, serverCPU: 0, clientCPU: 1, mode: modeLong, work: defaultWorkload(false), log: io.Discard}
	plan := h.plan(regexp.MustCompile(""), regexp.MustCompile(""))
	cells := map[cellKey]*cell{}
	for _, mp := range plan {
		for _, size := range mp.Sizes {
			for i, r := range mp.runners() {
				if !r.runsAt(size) {
					continue
				}
				v := float64(size) * float64(i+1)
				if mp.Metric == Rate {
					v = 0.01 * float64(i+1)
				}
				pkts := 0.0 // TCP counts none
				if r.Kind != "tcp" {
					pkts = float64(i) + 0.5
				}
				cpu := []CPUUse{{CPU: 0, Busy: 100 * float64(i+1), Kernel: 60, Share: 0.5}, {CPU: 1, Busy: 200, Kernel: 150, Share: 0.995}}
				cpu2 := []CPUUse{{CPU: 0, Busy: 300, Kernel: 80, Share: 0.9}, {CPU: 1, Busy: 200, Kernel: 150, Share: 1}}
				if mp.Metric == Latency { // not measured (cpu.go)
					cpu, cpu2 = nil, nil
				}
				cells[cellKey{mp.Metric, size, r.Label}] = &cell{Samples: []*Sample{
					{Value: v, P99: 2 * v, P999: 3 * v, Check: v, Packets: pkts, CPU: cpu},
					{Value: v * 1.1, Packets: pkts, CPU: cpu2},
					{Value: v * 1.2, Packets: pkts, CPU: cpu}}, Rounds: []int{1, 2, 3}}
			}
		}
	}
	// One baseline that always failed.
	cells[cellKey{Bandwidth, 1 << 20, "ib_write_bw -R"}] = &cell{Errs: []string{"ib_write_bw: perftest reported 0"}}
	return h.report(plan, cells, 3*time.Minute)
}

func TestReportJSON(t *testing.T) {
	r := fakeReport(t)
	path := filepath.Join(t.TempDir(), "out", "bench.json")
	if err := r.writeJSON(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Results []map[string]any `json:"results"`
		Goals   []map[string]any `json:"goals"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	got := doc.Results
	// One object per row (our cases and the Go floor), size and baseline
	// (conn-* alone: latency 3 sizes x 3 baselines, bandwidth 3 x 3, rate
	// 1 x 2 = 20).
	want, bwCases := 0, 0
	for _, mp := range r.plan {
		for _, o := range mp.rows() {
			for _, size := range mp.Sizes {
				for _, b := range mp.Baselns {
					if o.runsAt(size) && b.runsAt(size) && b.Label != o.Label {
						want++
					}
				}
			}
		}
		if mp.Metric == Bandwidth {
			bwCases = len(mp.Ours)
		}
	}
	if len(got) != want || want < 20 {
		t.Fatalf("%d objects, want %d (at least 20)", len(got), want)
	}
	failed := 0
	for _, o := range got {
		for _, k := range []string{"case", "metric", "size", "ours", "baseline", "baseline_value", "ratio"} {
			if _, ok := o[k]; !ok {
				t.Fatalf("object without %q: %v", k, o)
			}
		}
		if o["baseline_value"] == nil {
			failed++
			if o["ratio"] != nil || !strings.Contains(o["error"].(string), "reported 0") {
				t.Fatalf("failed baseline: %v", o)
			}
			continue
		}
		// Every round of the fake report has ours/baseline equal to the
		// medians' ratio (both scale by 1, 1.1, 1.2 in rounds 1-3).
		if want := o["ours"].(float64) / o["baseline_value"].(float64); math.Abs(o["ratio"].(float64)-want) > 1e-9 {
			t.Fatalf("ratio %v, want %v", o["ratio"], want)
		}
		if rr, ok := o["ratio_rounds"].([]any); !ok || len(rr) != 3 {
			t.Fatalf("ratio_rounds %v, want the 3 rounds' paired ratios", o["ratio_rounds"])
		}
	}
	if failed != bwCases {
		t.Fatalf("%d failed objects, want %d (the 1 MiB ib_write_bw baseline of each bandwidth case)", failed, bwCases)
	}
}

func TestReportSVGAndTable(t *testing.T) {
	r := fakeReport(t)
	svg := r.svg()
	d := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("chart is not well-formed XML: %v", err)
		}
	}
	for _, want := range []string{"log scale", "one-way latency (µs)", "bandwidth (MB/s, 10^6 B)", "message rate", "ib_send_lat -R", "tcp", "failed"} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
	var b strings.Builder
	r.printTable(&b)
	for _, want := range []string{"ours/ib_send_lat", "FAILED", "1.048576"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestReportPackets(t *testing.T) {
	r := fakeReport(t)
	var b strings.Builder
	r.printTable(&b)
	out := b.String()
	for _, want := range []string{"device packets per round trip", "device packets per message", "conn-pingpong 0.50", "ib_send_lat -R "} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "  64 B") && strings.Contains(l, "conn-pingpong 0.50") && strings.Contains(l, "tcp") {
			t.Errorf("a TCP column has packets: %q", l)
		}
	}
	for _, j := range r.results() {
		if j.Baseline == "tcp" && j.BaselinePackets != nil {
			t.Errorf("%s %d: TCP baseline with packets", j.Case, j.Size)
		}
		if j.Baseline == "perftest" && j.BaselineValue != nil && j.BaselinePackets == nil {
			t.Errorf("%s %d vs %s: no baseline packets", j.Case, j.Size, j.BaselineCmd)
		}
		if j.Ours != nil && j.OursPackets == nil {
			t.Errorf("%s %d: no packets of ours", j.Case, j.Size)
		}
	}
}

func TestCountPackets(t *testing.T) {
	before, ok := devicePackets()
	s, err := countPackets(10, func() (*Sample, error) { return &Sample{Value: 1}, nil })
	if err != nil || s == nil {
		t.Fatal(s, err)
	}
	if !ok && s.Packets != 0 {
		t.Fatalf("no device counter, yet %v packets per message", s.Packets)
	}
	if ok {
		after, _ := devicePackets()
		if after < before {
			t.Fatalf("sent_pkts went back: %d -> %d", before, after)
		}
	}
	if _, err := countPackets(10, func() (*Sample, error) { return nil, io.EOF }); err != io.EOF {
		t.Fatalf("error not passed on: %v", err)
	}
}

func TestParseCPUTimes(t *testing.T) {
	stat := `cpu  10 1 20 500 3 4 5 0 0 0
cpu0 1 0 2 100 0 0 1 0 0 0
cpu1 9 1 18 400 3 4 4 7 0 0
intr 12345 0 0
ctxt 999
`
	got := parseCPUTimes(stat)
	want := []cpuTime{{busy: 4, kernel: 3}, {busy: 36, kernel: 26}}
	if !slices.Equal(got, want) {
		t.Fatalf("parseCPUTimes = %v, want %v", got, want)
	}
	// 10 and 100 ticks (0.1 s and 1 s) over 100 messages in 2 s.
	per := cpuPerMessage(want, []cpuTime{{busy: 14, kernel: 3}, {busy: 136, kernel: 76}}, 100, 2*time.Second)
	wantPer := []CPUUse{{CPU: 0, Busy: 1000, Kernel: 0, Share: 0.05}, {CPU: 1, Busy: 10000, Kernel: 5000, Share: 0.5}}
	if !slices.Equal(per, wantPer) {
		t.Fatalf("cpuPerMessage = %v, want %v", per, wantPer)
	}
	// A counter that went back (a CPU taken offline and back) or a CPU that
	// appeared in between gives nothing rather than nonsense.
	if got := cpuPerMessage(want, []cpuTime{{busy: 3, kernel: 3}, {busy: 40, kernel: 30}}, 10, time.Second); got != nil {
		t.Fatalf("went back: %v", got)
	}
	if got := cpuPerMessage(want, append(want, cpuTime{}), 10, time.Second); got != nil {
		t.Fatalf("a CPU appeared: %v", got)
	}
	if got := cpuTimes(); len(got) == 0 {
		t.Fatal("no CPU in /proc/stat")
	}
}

func TestReportCPU(t *testing.T) {
	r := fakeReport(t)
	var b strings.Builder
	r.printTable(&b)
	out := b.String()
	// The median per CPU over the three repetitions: CPU 0 100, 300, 100
	// for each metric's first column; its share 0.5, 0.9, 0.5; CPU 1's
	// 0.995, 1, 0.995 (printed rounded: 100%).
	for _, want := range []string{"CPU µs per message, busy/kernel, and busy share of the window, on each CPU (server on CPU 0, client on CPU 1; the active window", "conn-stream 100/60 50% 200/150 100%", "conn-msgrate 100/60 50% 200/150 100%", "tcp "} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "CPU µs per round trip") || strings.Contains(out[:strings.Index(out, "Bandwidth")], "CPU µs") {
		t.Errorf("CPU lines for latency:\n%s", out)
	}
	for _, j := range r.results() {
		if j.Metric == Latency {
			if j.OursCPU != nil || j.BaselineCPU != nil {
				t.Errorf("%s %d: CPU for latency", j.Case, j.Size)
			}
			continue
		}
		if j.Ours != nil && len(j.OursCPU) != 2 || j.BaselineValue != nil && len(j.BaselineCPU) != 2 {
			t.Errorf("%s %d vs %s: CPU %v / %v", j.Case, j.Size, j.BaselineCmd, j.OursCPU, j.BaselineCPU)
		}
	}
}

func TestActiveWindow(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	cpu := func(busy uint64) []cpuTime { return []cpuTime{{busy: busy, kernel: busy / 2}} }
	// The harness itself: a quarter of a CPU all along.
	quarter := func(ms int) time.Duration { return time.Duration(ms) * time.Millisecond / 4 }
	// Set-up (CPU busy, a few packets), then 400 ms of traffic, then a
	// few packets more (teardown).
	ss := []sample{
		{at(0), 5, cpu(0), quarter(0)}, {at(100), 7, cpu(10), quarter(100)}, {at(200), 8, cpu(20), quarter(200)}, // set-up
		{at(300), 28, cpu(30), quarter(300)}, {at(500), 68, cpu(50), quarter(500)}, {at(600), 90, cpu(60), quarter(600)}, // traffic
		{at(700), 91, cpu(62), quarter(700)}, {at(800), 92, cpu(63), quarter(800)}, // teardown
	}
	// A sample 1 ms after the one before it, two packets later: a rate ten
	// times the traffic's, which must not raise the bar for the rest.
	ss = slices.Insert(ss, 4, sample{at(301), 30, cpu(30), quarter(301)})
	w := activeWindow(ss)
	if !w.ok || w.from.at != at(200) || w.to.at != at(600) {
		t.Fatalf("window %v..%v (ok %v), want 200..600 ms", w.from.at.Sub(t0), w.to.at.Sub(t0), w.ok)
	}
	got := w.perMessage(10)
	// 40 ticks (400 ms) in the 400 ms window: saturated.
	if want := []CPUUse{{CPU: 0, Busy: 40 * clockTick / 10, Kernel: 20 * clockTick / 10, Share: 1}}; !slices.Equal(got, want) {
		t.Fatalf("perMessage = %v, want %v", got, want)
	}
	if got := w.selfShare(); got != 0.25 {
		t.Fatalf("selfShare = %v, want 0.25", got)
	}
	// /proc/stat read at 100, 500 and 700 ms only: one reading inside the
	// active window (200..600 ms) bounds no span.
	sparse := slices.Clone(ss)
	for i := range sparse {
		if ms := sparse[i].at.Sub(t0); ms != 100*time.Millisecond && ms != 500*time.Millisecond && ms != 700*time.Millisecond {
			sparse[i].cpu = nil
		}
	}
	sw := activeWindow(sparse)
	if sw.ok {
		t.Fatalf("one reading with CPU times inside the active window gave window %v..%v", sw.from.at.Sub(t0), sw.to.at.Sub(t0))
	}
	// With readings at 300 and 600 ms too, the span is 300..600.
	for i := range sparse {
		if sparse[i].at == at(300) || sparse[i].at == at(600) {
			sparse[i].cpu = ss[i].cpu
		}
	}
	sw = activeWindow(sparse)
	if !sw.ok || sw.from.at != at(300) || sw.to.at != at(600) {
		t.Fatalf("sparse window %v..%v (ok %v), want 300..600 ms", sw.from.at.Sub(t0), sw.to.at.Sub(t0), sw.ok)
	}
	// 300..600 ms carried 90-28 = 62 of the active window's 90-8 = 82
	// packets: 10 messages x 62/82 are charged 30 ticks.
	msgs := 10 * 62.0 / 82
	if got, want := sw.perMessage(10), []CPUUse{{CPU: 0, Busy: 30 * clockTick / msgs, Kernel: 15 * clockTick / msgs, Share: 1}}; !slices.Equal(got, want) {
		t.Fatalf("sparse perMessage = %v, want %v", got, want)
	}
	// Too short to say, and nothing moved.
	if got := activeWindow(ss[2:5]).perMessage(10); got != nil {
		t.Fatalf("a 100 ms window gave %v", got)
	}
	if w := activeWindow([]sample{ss[0], {at(100), 5, cpu(10), quarter(100)}}); w.ok {
		t.Fatal("a window without traffic")
	}
}

func TestSampler(t *testing.T) {
	var mu sync.Mutex
	var n uint64
	sm := startSampler(func() (uint64, bool) { mu.Lock(); defer mu.Unlock(); return n, true })
	time.Sleep(50 * time.Millisecond)
	for i := 0; i < 40; i++ {
		mu.Lock()
		n++
		mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	w := sm.stop()
	if !w.ok {
		t.Fatal("no window")
	}
	// The counter moved over at least 39 sleeps of 10 ms.
	if d := w.to.at.Sub(w.from.at); d < 390*time.Millisecond {
		t.Fatalf("window %v, want at least 390 ms", d)
	}
	if len(w.from.cpu) == 0 {
		t.Fatal("no CPU readings")
	}
	// A counter that cannot be read gives no window.
	sm = startSampler(func() (uint64, bool) { return 0, false })
	if w := sm.stop(); w.ok {
		t.Fatal("a window without a counter")
	}
}
