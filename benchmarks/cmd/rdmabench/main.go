//go:build linux

// Command rdmabench measures this library side by side with perftest and with
// TCP on loopback, in one run, on one RDMA device and address:
//
//   - latency (ping-pong, 8 B, 64 B, 4 KiB): our Conn, message view and
//     one-sided writes with immediate, ib_send_lat -R, ib_write_lat -R and
//     TCP; one-way (half the round trip), median, p99, p99.9 µs;
//   - bandwidth (4 KiB, 64 KiB, 1 MiB messages): our Conn.Write streams,
//     messages and one-sided writes, ib_send_bw -R, ib_write_bw -R,
//     ib_read_bw -R and TCP; MB/s with MB = 10^6 bytes;
//   - message rate (64 B): our Conn.Write and messages, ib_send_bw -R's
//     MsgRate and TCP;
//   - datagrams (ud.go): our PacketConn's 8 B and 64 B ping-pong beside
//     ib_send_lat -c UD, and its 64 B message rate beside ib_send_bw -c UD.
//
// Every case runs in rounds: in each round ours, perftest, TCP and the Go
// floor (go-floor: the same verbs calls with no library logic) run once
// each, in an order that rotates from round to round. Each cell is the
// median over the rounds, and each ratio the median of the per-round
// paired ratios (ours and the baseline of the same round) with a 95%
// interval; -goal bounds on ratios are judged met, missed or undecided by
// their intervals. Server and client are separate processes (this program
// re-executes itself for ours, the floor and TCP), pinned with taskset the
// same way for every implementation: the server to CPU 0, the client to
// CPU 1.
//
//	rdmabench [-quick | -long] [-rounds 6] [-lat-rounds 10] [-cases REGEXP] [-goal SPEC] [-json PATH] [-svg PATH] [-addr IP]
//
// Progress goes to stderr, the table to stdout; -json writes one object per
// case, size and baseline, and -svg (default: beside the JSON) a chart.
// See benchmarks/README.md for what the numbers mean.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
)

// hidden flags are those of the child processes; the usage omits them.
var hidden = map[string]bool{"serve": true, "client": true, "case": true, "net": true, "size": true, "iters": true, "warmup": true, "tcp-host": true}

func main() {
	var (
		addr      = flag.String("addr", os.Getenv("RDMA_TEST_ADDR"), "IPv4 `address` of the RDMA netdev (default $RDMA_TEST_ADDR)")
		quick     = flag.Bool("quick", false, "one size per metric, fewer iterations and 2 rounds (for make demo)")
		long      = flag.Bool("long", false, "for decisions: every size, -rounds 15 and -lat-rounds 31 unless given (about 4x the default run's time)")
		jsonPath  = flag.String("json", "", "write the results as JSON to `path`")
		svgPath   = flag.String("svg", "", "write the chart to `path` (default: the JSON path with .svg)")
		casesRe   = flag.String("cases", "", "run only our cases whose \"metric/name\" matches `regexp` (e.g. latency, conn-stream)")
		baseRe    = flag.String("baselines", "", "run only the baselines whose name matches `regexp` (ib_send_lat, ib_write_bw, tcp, ...)")
		rounds    = flag.Int("rounds", defaultRounds, "rounds of the bandwidth, rate and atomics cases: each runs every case and baseline once (-quick: 2 unless given)")
		latRounds = flag.Int("lat-rounds", defaultLatRounds, "rounds of the latency cases (-quick: 2 unless given)")
		pin       = flag.Bool("pin", runtime.NumCPU() >= 2, "pin servers to CPU 0 and clients to CPU 1 with taskset (needs 2 CPUs)")
		depth     = flag.Int("depth", 128, "queue depth: perftest -t (and -r for ib_send_bw); our Config.SendBuffers and RecvBuffers")
		spin      = flag.Duration("spin", 0, "our Config.PollSpin (0: the library default; negative: event mode)")
		procs     = flag.Int("gomaxprocs", 0, "GOMAXPROCS of our Go processes (and the TCP baseline's); 0: Go's default "+
			"(the CPUs the process may use: 1 when pinned, as a user's pinned process gets). See benchmarks/README.md")
		timeout   = flag.Duration("timeout", 2*time.Minute, "kill any server or client process running longer than this")
		latIters  = flag.Int("lat-iters", 0, "round trips per latency run (0: 1000, quick 300)")
		bwBytes   = flag.Int64("bw-bytes", 0, "bytes per bandwidth run (0: 32 MiB, quick 8 MiB)")
		rateMsgs  = flag.Int("rate-msgs", 0, "messages per message-rate run (0: 50000, quick 10000)")
		grpcCalls = flag.Int("grpc-calls", 0, "-grpc: unary calls per run (0: 500, quick 100; 16 callers make four times as many)")
		serve     = flag.Bool("serve", false, "child: serve one connection of -case")
		client    = flag.String("client", "", "child: connect to this address and run -case")
		caseName  = flag.String("case", "", "child: the case")
		network   = flag.String("net", "rdma", "child: rdma or tcp")
		size      = flag.Int("size", 64, "child: message size")
		iters     = flag.Int("iters", 1000, "child: iterations")
		warmup    = flag.Int("warmup", 0, "child: warm-up round trips")
		tcpHost   = flag.String("tcp-host", "127.0.0.1", "child: the TCP baseline server's address")
		listen    = flag.String("listen", "", "two-host mode, server: wait for -connect clients on this TCP `host:port` (control)")
		connect   = flag.String("connect", "", "two-host mode, client: run the plan against the -listen server at `host:port`")
		listCases = flag.Bool("list", false, "list our cases and the baselines, then exit")
		compare   = flag.String("compare", "", "compare two runs' JSON outputs `A.json,B.json`: do their paired ratios' intervals overlap? (exit 1 if any does not)")
		cmpCells  = flag.String("compare-cells", "", "with -compare: only the cells of `METRIC[/SIZE]`, e.g. latency/64B")
		grpcMode  = flag.Bool("grpc", false, "run the gRPC cases (grpcrdma, grpc-go over rdma.Conn and over TCP, the message view's stream as the ceiling) instead of the data path's")
		verbose   = flag.Bool("v", false, "log the phases of every run (server ready, client done, ...)")
		stagesOn  = flag.Bool("stages", false, "profile the CPU of our cases and the Go floor, and print each one's samples by stage of the message's path (dispatch, credits, waiter, copy, post, clock, locks, ...); RDMABENCH_CPUPROFILE_HZ sets the rate (default 1000 here)")
	)
	flag.IntVar(rounds, "reps", defaultRounds, "the same as -rounds (and sets -lat-rounds unless given)")
	var goalSpecs []string
	flag.Func("goal", "a bound on a paired ratio, judged by its interval: `METRIC/SIZE/CASE/BASELINE<=X` or >=X "+
		"(repeatable; replaces the default goals; \"none\" for none; default "+strings.Join(defaultGoals, ", ")+")",
		func(v string) error { goalSpecs = append(goalSpecs, v); return nil })
	lf := addLoadFlags()
	flag.Usage = usage
	flag.Parse()
	if flag.NArg() > 0 {
		usage()
		os.Exit(2)
	}

	if *serve || *client != "" {
		a := childArgs{caseName: *caseName, network: *network, size: *size, iters: *iters, warmup: *warmup, tcpHost: *tcpHost}
		if *procs > 0 {
			runtime.GOMAXPROCS(*procs)
		}
		if err := runChild(*serve, *client, a, *addr, *depth, *spin); err != nil {
			fatalChild(err)
		}
		return
	}
	// The harness is one goroutine of work at a time (the plan, the
	// sampler, the children's output), and every CPU it takes is one it
	// measures: with one P its runtime does not wake other threads to look
	// for work, which cost a quarter to a third of its CPU in the guest.
	runtime.GOMAXPROCS(1)
	if *compare != "" {
		os.Exit(compareMain(*compare, *cmpCells))
	}
	if *listCases {
		for _, c := range registry {
			fmt.Printf("%s/%s\n", c.Metric.Short(), c.Name)
		}
		for _, t := range perftestTools {
			fmt.Printf("baseline %s/%s\n", t.Metric.Short(), t.Label())
		}
		fmt.Println("baseline */tcp")
		return
	}

	if *addr == "" {
		fatalf("no RDMA address: give -addr, or run inside scripts/softroce run (it sets RDMA_TEST_ADDR)")
	}
	if *listen != "" && *connect != "" {
		fatalf("-listen (the server host) and -connect (the client host) exclude each other")
	}
	if flagGiven("reps") && !flagGiven("lat-rounds") {
		*latRounds = *rounds
	}
	if *long && !flagGiven("rounds") && !flagGiven("reps") {
		*rounds = 15
	}
	if *long && !flagGiven("lat-rounds") && !flagGiven("reps") {
		*latRounds = 31
	}
	if *quick && !flagGiven("rounds") && !flagGiven("reps") {
		*rounds = 2 // keeps -quick under 2 minutes in the guest as cases are added
	}
	if *quick && !flagGiven("lat-rounds") && !flagGiven("reps") {
		*latRounds = 2
	}
	if *rounds < 1 || *latRounds < 1 || *depth < 1 {
		fatalf("-rounds, -lat-rounds and -depth must be at least 1")
	}
	if goalSpecs == nil {
		goalSpecs = defaultGoals
		if *grpcMode {
			goalSpecs = defaultGRPCGoals
		}
	}
	var goals []goal
	for _, spec := range goalSpecs {
		if spec == "none" {
			continue
		}
		g, err := parseGoal(spec)
		if err != nil {
			fatalf("-goal: %v", err)
		}
		goals = append(goals, g)
	}
	cre, err := regexp.Compile(*casesRe)
	if err != nil {
		fatalf("-cases: %v", err)
	}
	bre, err := regexp.Compile(*baseRe)
	if err != nil {
		fatalf("-baselines: %v", err)
	}
	mode := modeDefault
	switch {
	case *quick && *long:
		fatalf("-quick and -long exclude each other")
	case *quick:
		mode = modeQuick
	case *long:
		mode = modeLong
	}
	w := defaultWorkload(*quick)
	if *latIters > 0 {
		w.LatIters = *latIters
	}
	if *bwBytes > 0 {
		w.BWBytes = *bwBytes
	}
	if *rateMsgs > 0 {
		w.RateMsgs = *rateMsgs
	}
	if *grpcCalls > 0 {
		w.GRPCCalls = *grpcCalls
	}
	if *svgPath == "" && *jsonPath != "" {
		*svgPath = strings.TrimSuffix(*jsonPath, ".json") + ".svg"
	}

	h := &harness{addr: *addr, depth: *depth, spin: *spin, procs: *procs, timeout: *timeout,
		readyTimeout: 90 * time.Second, serverCPU: -1, clientCPU: -1, stdbuf: lookStdbuf(),
		nextPort: 20000 + os.Getpid()%1000*10, log: os.Stderr, verbose: *verbose, quick: *quick, mode: mode,
		rounds: *rounds, latRounds: *latRounds, goals: goals, work: w}
	if *grpcMode {
		h.metrics = grpcMetrics
	}
	if *stagesOn {
		// The children inherit both: they profile and print their stages.
		os.Setenv(stagesEnv, "1")
		if os.Getenv("RDMABENCH_CPUPROFILE_HZ") == "" {
			os.Setenv("RDMABENCH_CPUPROFILE_HZ", "1000")
		}
	}
	if *pin {
		if _, err := exec.LookPath("taskset"); err != nil || runtime.NumCPU() < 2 {
			h.logf("not pinning: needs taskset and 2 CPUs (have %d)", runtime.NumCPU())
		} else {
			h.serverCPU, h.clientCPU = 0, 1
		}
	}
	for _, tool := range []string{"ib_send_lat", "ib_write_lat", "ib_send_bw", "ib_write_bw", "ib_read_bw"} {
		if _, err := exec.LookPath(tool); err != nil {
			h.logf("warning: %s not found (install perftest); its baseline will fail", tool)
		}
	}
	if _, err := exec.LookPath("rstream"); err != nil {
		h.logf("warning: rstream not found (install rdmacm-utils); its baseline will fail")
	}

	if *listen != "" {
		os.Exit(h.serverMain(*listen))
	}
	if *connect != "" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		r, err := h.dialControl(ctx, *connect, 2*time.Minute)
		stop()
		if err != nil {
			fatalf("%v", err)
		}
		h.remote = r
		h.logf("rdmabench: two hosts: clients here (%s, %s), servers on %s (control %s)", h.addr, hostname(), r.peer, *connect)
	}
	if *lf.enabled {
		os.Exit(h.loadMain(lf, *jsonPath, *svgPath))
	}
	if h.remote == nil {
		// What the device lacks is left out of the plan, not failed in
		// every round. Two hosts: the servers' device is not probed here.
		if name, lacks, err := probeDevice(h.addr); err != nil {
			h.logf("warning: the device's capabilities are unknown (%v): every case runs", err)
		} else {
			h.device, h.lacks = name, lacks
		}
	}
	plan := h.plan(cre, bre)
	if len(plan) == 0 {
		fatalf("-cases %q selects no case (see -list)", *casesRe)
	}
	self, cleanup, err := privateCopy()
	if err != nil {
		fatalf("%v", err)
	}
	h.self = self
	code := h.main(plan, *jsonPath, *svgPath)
	cleanup()
	os.Exit(code)
}

// main runs the plan and writes the outputs; it returns the exit status.
func (h *harness) main(plan []metricPlan, jsonPath, svgPath string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	res := h.run(ctx, plan)
	wall := time.Since(start)
	if ctx.Err() != nil {
		h.logf("rdmabench: interrupted")
		return 2
	}
	rep := h.report(plan, res, wall)
	rep.printTable(os.Stdout)
	code := 0
	if jsonPath != "" {
		if err := rep.writeJSON(jsonPath); err != nil {
			h.logf("rdmabench: %v", err)
			code = 2
		} else {
			h.logf("wrote %s", jsonPath)
		}
	}
	if svgPath != "" {
		if err := rep.writeSVG(svgPath); err != nil {
			h.logf("rdmabench: %v", err)
			code = 2
		} else {
			h.logf("wrote %s", svgPath)
		}
	}
	if n := rep.failures(); n > 0 {
		h.logf("%d runs failed (see above); their cells are marked FAILED", n)
		code = max(code, 1)
	}
	return code
}

// compareMain runs -compare; it returns the exit status.
func compareMain(paths, cells string) int {
	a, b, ok := strings.Cut(paths, ",")
	if !ok {
		fatalf("-compare: want two JSON paths separated by a comma")
	}
	var metric Metric
	size := 0
	if cells != "" {
		m, sz, _ := strings.Cut(cells, "/")
		for _, x := range metrics {
			if x.Short() == m {
				metric = x
			}
		}
		if metric == "" {
			fatalf("-compare-cells %q: unknown metric %q (latency, bandwidth, rate)", cells, m)
		}
		if sz != "" {
			var err error
			if size, err = parseSize(sz); err != nil {
				fatalf("-compare-cells: %v", err)
			}
		}
	}
	n, err := compareRuns(os.Stdout, a, b, metric, size)
	if err != nil {
		fatalf("-compare: %v", err)
	}
	return min(n, 1)
}

func flagGiven(name string) bool {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// privateCopy copies this executable into a temporary folder, for the child
// processes: rebuilding .build/bin/rdmabench while a run is going (make demo
// and make bench both build it) would otherwise make every later child fail
// to start.
func privateCopy() (path string, cleanup func(), err error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "rdmabench-")
	if err != nil {
		return self, func() {}, nil // no writable temp: run the original
	}
	cleanup = func() { os.RemoveAll(dir) }
	src, err := os.Open(self)
	if err != nil {
		cleanup()
		return "", nil, err
	}
	defer src.Close()
	path = filepath.Join(dir, "rdmabench")
	dst, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err == nil {
		_, err = io.Copy(dst, src)
		if cerr := dst.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("copying %s: %w", self, err)
	}
	return path, cleanup, nil
}

func usage() {
	out := flag.CommandLine.Output()
	fmt.Fprintf(out, "usage: rdmabench [flags]\n\n"+
		"Measures this library's Conn against perftest (ib_send_lat/ib_write_lat/ib_send_bw/ib_write_bw/ib_read_bw -R)\n"+
		"and TCP on 127.0.0.1: latency, bandwidth and message rate; its PacketConn against ib_send_lat/ib_send_bw -c UD.\n"+
		"Run it where an RDMA device exists,\n"+
		"e.g. scripts/softroce run -- .build/bin/rdmabench -quick. Flags:\n\n")
	flag.VisitAll(func(f *flag.Flag) {
		if hidden[f.Name] {
			return
		}
		name, u := flag.UnquoteUsage(f)
		fmt.Fprintf(out, "  -%s\n    \t%s", strings.TrimSpace(f.Name+" "+name), u)
		if f.Name != "addr" && f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			fmt.Fprintf(out, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(out)
	})
}

func fatalf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "rdmabench: "+format+"\n", a...)
	os.Exit(2)
}

// harness runs the plan: every child process and perftest goes through it.
type harness struct {
	addr                  string
	device                string            // the RDMA device at addr, once probed
	lacks                 func(need) string // what it lacks of a need (nil: not probed)
	self                  string            // a private copy of this executable, re-executed for ours and TCP
	depth                 int
	spin                  time.Duration
	procs                 int // GOMAXPROCS of our children (0: Go's default)
	timeout, readyTimeout time.Duration
	serverCPU, clientCPU  int    // -1: not pinned
	stdbuf                string // path of stdbuf, or ""
	nextPort              int    // fallback port counter for perftest
	usedPorts             map[int]bool
	log                   io.Writer
	verbose               bool
	quick                 bool
	mode                  runMode // the sizes: quick, default or long
	rounds, latRounds     int     // rounds of the bandwidth and rate cases, and of the latency cases
	goals                 []goal  // bounds on paired ratios, judged in the report
	work                  Workload
	remote                *remote  // two-host mode (-connect): the server host; nil on one host
	metrics               []Metric // what runs: -grpc's metrics; nil for the data path's
}

func (h *harness) logf(format string, a ...any) {
	fmt.Fprintf(h.log, format+"\n", a...)
}

// vlogf logs with -v: the phases of a run, with the time since it started.
func (h *harness) vlogf(t0 time.Time, format string, a ...any) {
	if h.verbose {
		fmt.Fprintf(h.log, "    %6.2fs "+format+"\n", append([]any{time.Since(t0).Seconds()}, a...)...)
	}
}

// Default rounds: latency rounds are short (a few hundred milliseconds of
// round trips), so more of them fit; 6 rounds is the fewest whose median
// has a 95% interval.
const (
	defaultRounds    = 6
	defaultLatRounds = 10
)

// roundsOf is the number of rounds of a metric's cases.
// roundsText says how many rounds run: "10 latency rounds, 6 rounds of the
// others", or for -grpc "6 rounds".
func (h *harness) roundsText() string {
	if h.metrics != nil && !slices.Contains(h.metrics, Latency) {
		return fmt.Sprintf("%d rounds", h.rounds)
	}
	return fmt.Sprintf("%d latency rounds, %d rounds of the others", h.latRounds, h.rounds)
}

func (h *harness) roundsOf(m Metric) int {
	if m == Latency {
		return h.latRounds
	}
	return h.rounds
}

// A runner is one column of a metric: one of our cases, a perftest tool,
// TCP, or the Go floor.
type runner struct {
	Label  string // column name
	Kind   string // "ours", "peer", "perftest", "rstream", "tcp" or "floor"
	Metric Metric
	Case   *Case         // ours, tcp and floor: the case run
	Tool   *perftestTool // perftest
}

// runsAt reports whether the runner runs at size (UD ones only up to a
// datagram's limit); where it does not, its cells read "-".
func (r runner) runsAt(size int) bool {
	max := 0
	switch {
	case r.Kind == "perftest":
		max = r.Tool.MaxSize
	case r.Case != nil:
		max = r.Case.MaxSize
	}
	return max == 0 || size <= max
}

// Cmd describes what ran, for the JSON.
func (r runner) Cmd(h *harness, size int) string {
	iters := h.work.Iters(r.Metric, size)
	switch r.Kind {
	case "perftest":
		gid := -1 // the GID index is found at run time
		if !r.Tool.rdmaCM() {
			gid, _ = udGIDIndex(h.addr)
		}
		if h.remote != nil {
			return strings.Join(append(r.Tool.args(size, iters, h.depth, gid), h.remote.peer), " ")
		}
		return strings.Join(r.Tool.args(size, iters, h.depth, gid), " ")
	case "tcp":
		if h.remote != nil {
			return fmt.Sprintf("%s over TCP to %s, size %d, iterations %d", r.Case.Name, h.remote.peer, size, iters)
		}
		return fmt.Sprintf("%s over TCP 127.0.0.1, size %d, iterations %d", r.Case.Name, size, iters)
	case "rstream":
		return strings.Join(rstreamArgs(r.Metric, size, iters), " ")
	case "floor":
		return fmt.Sprintf("%s: send/receive ping-pong over raw verbs (rdma_cm connection, busy-polled CQ, no library logic), size %d, iterations %d", r.Case.Name, size, iters)
	}
	return fmt.Sprintf("%s over RDMA, size %d, iterations %d, depth %d", r.Case.Name, size, iters, h.depth)
}

// metricPlan is what runs for one metric.
type metricPlan struct {
	Metric  Metric
	Sizes   []int
	Ours    []runner
	Baselns []runner
}

func (p metricPlan) runners() []runner { return append(slices.Clone(p.Ours), p.Baselns...) }

// rows are the table's rows: our cases, then the peers and the Go floor
// (beside the baselines, so that floor/perftest shows how far Go alone is
// from C, and grpc-go/tcp what grpc-go gains from RDMA).
func (p metricPlan) rows() []runner {
	rows := slices.Clone(p.Ours)
	for _, b := range p.Baselns {
		if b.Kind == "floor" || b.Kind == "peer" {
			rows = append(rows, b)
		}
	}
	return rows
}

func (h *harness) plan(cases, baselines *regexp.Regexp) []metricPlan {
	var out []metricPlan
	ms := h.metrics
	if ms == nil {
		ms = metrics
	}
	for _, m := range ms {
		mp := metricPlan{Metric: m, Sizes: m.Sizes(h.mode)}
		var tcpCase *Case
		var floors, peers []runner
		for i := range registry {
			c := &registry[i]
			if c.Metric != m {
				continue
			}
			if c.Floor {
				if baselines.MatchString(c.Name) {
					floors = append(floors, runner{Label: c.Name, Kind: "floor", Metric: m, Case: c})
				}
				continue
			}
			if c.TCP && tcpCase == nil {
				tcpCase = c
			}
			if c.Peer {
				if baselines.MatchString(c.Name) {
					peers = append(peers, runner{Label: c.Name, Kind: "peer", Metric: m, Case: c})
				}
				continue
			}
			if cases.MatchString(m.Short() + "/" + c.Name) {
				if why := h.lack(c.Needs); why != "" {
					h.logf("not run on %s: %s/%s: %s", h.device, m.Short(), c.Name, why)
					continue
				}
				mp.Ours = append(mp.Ours, runner{Label: c.Name, Kind: "ours", Metric: m, Case: c})
			}
		}
		if len(mp.Ours) == 0 {
			continue
		}
		mp.Baselns = append(mp.Baselns, peers...)
		for i := range perftestTools {
			t := &perftestTools[i]
			if t.Metric == m && baselines.MatchString(t.Label()) {
				if why := h.lack(t.needs()); why != "" {
					h.logf("not run on %s: %s baseline %s: %s", h.device, m.Short(), t.Label(), why)
					continue
				}
				mp.Baselns = append(mp.Baselns, runner{Label: t.Label(), Kind: "perftest", Metric: m, Tool: t})
			}
		}
		if (m == RStreamLatency || m == RStreamBandwidth) && h.remote == nil && baselines.MatchString("rstream") {
			// The tool runs on one host only: make bench-2host has no column for it.
			mp.Baselns = append(mp.Baselns, runner{Label: "rstream", Kind: "rstream", Metric: m})
		}
		if tcpCase != nil && baselines.MatchString("tcp") {
			mp.Baselns = append(mp.Baselns, runner{Label: "tcp", Kind: "tcp", Metric: m, Case: tcpCase})
		}
		mp.Baselns = append(mp.Baselns, floors...)
		out = append(out, mp)
	}
	return out
}

// lack says why the device cannot run what needs n ("" if it can, or if
// the device was not probed).
func (h *harness) lack(n need) string {
	if h.lacks == nil || n == needNothing {
		return ""
	}
	return h.lacks(n)
}

// cellKey identifies the samples of one runner at one size.
type cellKey struct {
	Metric Metric
	Size   int
	Label  string
}

type cell struct {
	Samples []*Sample
	Rounds  []int // the round of each sample
	Errs    []string
}

func (h *harness) run(ctx context.Context, plan []metricPlan) map[cellKey]*cell {
	total := 0
	for _, mp := range plan {
		for _, size := range mp.Sizes {
			for _, r := range mp.runners() {
				if r.runsAt(size) {
					total += h.roundsOf(mp.Metric)
				}
			}
		}
	}
	pin := "not pinned"
	if h.serverCPU >= 0 {
		pin = fmt.Sprintf("servers on CPU %d, clients on CPU %d", h.serverCPU, h.clientCPU)
	}
	h.logf("rdmabench: %d runs on %s (%s), %s, depth %d, %s",
		total, h.addr, deviceName(), h.roundsText(), h.depth, pin)
	res := map[cellKey]*cell{}
	n := 0
	for _, mp := range plan {
		rounds := h.roundsOf(mp.Metric)
		for _, size := range mp.Sizes {
			var runners []runner
			for _, r := range mp.runners() {
				if r.runsAt(size) {
					runners = append(runners, r)
				}
			}
			for round := 1; round <= rounds; round++ {
				for _, r := range roundOrder(runners, round) {
					if ctx.Err() != nil {
						return res
					}
					n++
					k := cellKey{mp.Metric, size, r.Label}
					if res[k] == nil {
						res[k] = &cell{}
					}
					t0 := time.Now()
					s, err := h.runOne(ctx, r, size)
					el := time.Since(t0)
					prefix := fmt.Sprintf("[%*d/%d] %-9s %-7s round %d/%d  %-17s", len(fmt.Sprint(total)), n, total,
						mp.Metric.Short(), sizeString(size), round, rounds, r.Label)
					if err != nil {
						res[k].Errs = append(res[k].Errs, firstLine(err.Error()))
						h.logf("%s FAILED (%.1f s): %v", prefix, el.Seconds(), err)
						continue
					}
					res[k].Samples = append(res[k].Samples, s)
					res[k].Rounds = append(res[k].Rounds, round)
					h.logf("%s %s  (%.1f s)", prefix, describeSample(mp.Metric, s, size), el.Seconds())
				}
			}
		}
	}
	return res
}

// roundOrder is the order in which the runners take their turns in a round
// (1-based): rotated by one each round, so that no runner always follows
// the same one (a perftest server's teardown, a Go process's exit) or
// always comes first after the previous size's runs, and drift in the
// machine's load within a round spreads over all of them.
func roundOrder(runners []runner, round int) []runner {
	if len(runners) == 0 {
		return nil
	}
	k := (round - 1) % len(runners)
	return append(slices.Clone(runners[k:]), runners[:k]...)
}

func (h *harness) runOne(ctx context.Context, r runner, size int) (*Sample, error) {
	iters := h.work.Iters(r.Metric, size)
	if h.remote != nil {
		switch r.Kind {
		case "perftest":
			return h.runPerftestRemote(ctx, *r.Tool, size, iters)
		case "tcp":
			return h.runOursRemote(ctx, childArgs{caseName: r.Case.Name, network: "tcp", size: size, iters: iters, warmup: h.work.Warmup(r.Metric)}, "tcp")
		case "floor":
			return h.runOursRemote(ctx, childArgs{caseName: r.Case.Name, network: "verbs", size: size, iters: iters, warmup: h.work.Warmup(r.Metric)}, "floor")
		}
		return h.runOursRemote(ctx, childArgs{caseName: r.Case.Name, network: "rdma", size: size, iters: iters, warmup: h.work.Warmup(r.Metric)}, "ours")
	}
	switch r.Kind {
	case "floor":
		warmup := h.work.Warmup(r.Metric)
		return measure(r.Metric, iters+warmup, true, func() (*Sample, error) {
			return h.runOurs(ctx, childArgs{caseName: r.Case.Name, network: "verbs", size: size, iters: iters, warmup: warmup})
		})
	case "rstream":
		// Per transfer each way (a round trip in the latency test), as ours.
		return measure(r.Metric, iters, true, func() (*Sample, error) { return h.runRStream(ctx, r.Metric, size, iters) })
	case "perftest":
		// Divided by -n: a warm-up of perftest's own would show as more
		// packets per message.
		return measure(r.Metric, iters, true, func() (*Sample, error) { return h.runPerftest(ctx, *r.Tool, size, iters) })
	case "tcp":
		warmup := h.work.Warmup(r.Metric)
		return measure(r.Metric, iters+warmup, false, func() (*Sample, error) {
			return h.runOurs(ctx, childArgs{caseName: r.Case.Name, network: "tcp", size: size, iters: iters, warmup: warmup})
		})
	}
	warmup := h.work.Warmup(r.Metric)
	return measure(r.Metric, iters+warmup, true, func() (*Sample, error) {
		return h.runOurs(ctx, childArgs{caseName: r.Case.Name, network: "rdma", size: size, iters: iters, warmup: warmup})
	})
}

func describeSample(m Metric, s *Sample, size int) string {
	switch m {
	case Latency, GRPCUnary, AtomicLatency:
		return fmt.Sprintf("%9.2f µs  (p99 %.2f, p99.9 %.2f)", s.Value, s.P99, s.P999)
	case AtomicRate:
		return fmt.Sprintf("%9.4f Mops/s", s.Value)
	case GRPCCallers:
		return fmt.Sprintf("%9.0f calls/s", s.Value)
	case RStreamLatency:
		return fmt.Sprintf("%9.2f µs  (mean)", s.Value)
	case RStreamBandwidth:
		return fmt.Sprintf("%9.2f MB/s", s.Value)
	case GRPCStream:
		return fmt.Sprintf("%9.2f MB/s", s.Value)
	case Bandwidth:
		d := fmt.Sprintf("%9.2f MB/s", s.Value)
		if s.Check > 0 {
			d += fmt.Sprintf("  (check: MsgRate x size = %.2f MB/s%s)", s.Check, checkVerdict(s, size))
		}
		return d
	}
	return fmt.Sprintf("%9.4f Mmsg/s", s.Value)
}

// checkVerdict compares perftest's converted bandwidth with MsgRate x size.
// MsgRate is printed with 6 decimals, BW with 2: the tolerance allows for that
// rounding plus 1%.
func checkVerdict(s *Sample, size int) string {
	rate := s.Check / float64(size)
	tol := 0.01 + 0.5e-6/rate + 0.005*mibToMB/s.Value
	if d := s.Check/s.Value - 1; d > tol || d < -tol {
		return fmt.Sprintf(", MISMATCH %.1f%%", d*100)
	}
	return ", agrees"
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func deviceName() string {
	if d := os.Getenv("RDMA_TEST_DEVICE"); d != "" {
		return d
	}
	return "device chosen by address"
}
