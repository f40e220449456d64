//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/verbline/rdma"
)

// The harness re-executes itself for each side of our cases and of the TCP
// baseline: "-serve" listens, prints "ready ADDR", accepts one connection and
// runs the case's server side; "-client ADDR" dials and runs the client side.
// The side that measures prints "result {json Sample}". Both are pinned by the
// parent (taskset), the same way as perftest's server and client.

// childArgs are the flags a child needs, besides -serve / -client.
type childArgs struct {
	caseName string
	network  string // "rdma", "tcp", or "verbs" (the Go floor, floor.go)
	size     int
	iters    int
	warmup   int
	tcpHost  string // TCP baseline: the server's listening address (default 127.0.0.1)
}

func (a childArgs) flags(h *harness) []string {
	return []string{"-case", a.caseName, "-net", a.network, "-size", fmt.Sprint(a.size),
		"-iters", fmt.Sprint(a.iters), "-warmup", fmt.Sprint(a.warmup),
		"-addr", h.addr, "-depth", fmt.Sprint(h.depth), "-spin", h.spin.String(),
		"-gomaxprocs", fmt.Sprint(h.procs), "-tcp-host", a.host()}
}

func (a childArgs) host() string {
	if a.tcpHost == "" {
		return "127.0.0.1"
	}
	return a.tcpHost
}

// rdmaConfig is the library configuration of ours, the same in both children:
// depth receive buffers (the peer's credits, i.e. messages in flight) and
// depth send buffers, as perftest's -t / -r.
func rdmaConfig(depth int, spin time.Duration) rdma.Config {
	return rdma.Config{RecvBuffers: depth, SendBuffers: depth, PollSpin: spin}
}

func runChild(serve bool, connect string, a childArgs, addr string, depth int, spin time.Duration) error {
	c, ok := caseByName(a.caseName)
	if !ok {
		return fmt.Errorf("unknown case %q", a.caseName)
	}
	if a.network == "tcp" && !c.TCP {
		return fmt.Errorf("case %s does not run over TCP", c.Name)
	}
	if c.Floor != (a.network == "verbs") {
		return fmt.Errorf("case %s with -net %s: the floor cases, and only they, run with -net verbs", c.Name, a.network)
	}
	if c.Floor {
		return runFloorChild(serve, connect, a, addr)
	}
	if c.Packet {
		return runPacketChild(serve, connect, c, a, addr, depth, spin)
	}
	cfg := rdmaConfig(depth, spin)
	if c.DefaultConfig {
		cfg = rdma.Config{PollSpin: spin}
	}
	ctx := context.Background()
	var conn net.Conn
	if serve {
		var ln net.Listener
		var err error
		if a.network == "tcp" {
			ln, err = net.Listen("tcp", net.JoinHostPort(a.host(), "0"))
		} else {
			ln, err = (&rdma.ListenConfig{Config: cfg}).Listen(ctx, "rdma", net.JoinHostPort(addr, "0"))
		}
		if err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		fmt.Printf("ready %s\n", ln.Addr())
		conn, err = ln.Accept()
		ln.Close()
		if err != nil {
			return fmt.Errorf("accept: %w", err)
		}
	} else {
		var err error
		if a.network == "tcp" {
			conn, err = net.Dial("tcp", connect)
		} else {
			d := rdma.Dialer{Config: cfg}
			conn, err = d.DialContext(ctx, "rdma", connect)
		}
		if err != nil {
			return fmt.Errorf("dial %s: %w", connect, err)
		}
	}
	stop, err := startProfile(serve)
	if err != nil {
		return err
	}
	defer stop()
	rc, ours := conn.(*rdma.Conn)
	var before rdma.ConnStats
	var csw0 [2]float64
	if ours {
		before = rc.Stats()
		csw0, _ = ctxSwitches()
	}
	side := &Side{Server: serve, Conn: conn, Size: a.size, Iters: a.iters, Warmup: a.warmup}
	if c.Metric == Latency && !serve {
		name := c.Name
		if a.network == "tcp" {
			name += " (tcp baseline)"
		}
		if side.Slow, err = newSlowLog(name, a.size, conn); err != nil {
			return err
		}
		defer side.Slow.close()
	}
	s, err := c.Run(side)
	if ours && err == nil {
		m := perMessage(before, rc.Stats(), a.iters+a.warmup)
		csw1, thr1 := ctxSwitches()
		n := float64(max(1, a.iters+a.warmup))
		m["ctx_switches_voluntary"] = (csw1[0] - csw0[0]) / n
		m["ctx_switches_involuntary"] = (csw1[1] - csw0[1]) / n
		m["threads"] = thr1
		printCounters(m)
	}
	if cerr := conn.Close(); err == nil && cerr != nil && !serve {
		err = fmt.Errorf("close: %w", cerr)
	}
	if err != nil {
		return err
	}
	if s != nil {
		printResult(s)
	}
	return nil
}

// startProfile: RDMABENCH_CPUPROFILE=prefix writes each child's CPU
// profile to prefix.server / prefix.client (for go tool pprof). The
// returned func stops it. RDMABENCH_CPUPROFILE_HZ sets the sampling rate
// (default 100 Hz, pprof's; a few seconds of a ping-pong at 100 Hz are too
// few samples to tell functions of a few percent apart). The runtime then
// prints a harmless "cannot set cpu profile rate" warning. The block
// profile (startBlockProfile) and perf's (startPerfRecord) start and stop
// with it.
func startProfile(serve bool) (stop func(), err error) {
	stopPerf, err := startPerfRecord(serve)
	if err != nil {
		return nil, err
	}
	stopOnlyBlock, err := startBlockProfile(serve)
	if err != nil {
		stopPerf()
		return nil, err
	}
	stopBlock := func() { stopOnlyBlock(); stopPerf() }
	prefix := os.Getenv("RDMABENCH_CPUPROFILE")
	stages := os.Getenv(stagesEnv) != ""
	if prefix == "" && !stages {
		return stopBlock, nil
	}
	if hz, err := strconv.Atoi(os.Getenv("RDMABENCH_CPUPROFILE_HZ")); err == nil && hz > 0 {
		runtime.SetCPUProfileRate(hz)
	}
	profiling = true
	var out []io.Writer
	var f *os.File
	if prefix != "" {
		if f, err = os.Create(profilePath(prefix, serve)); err != nil {
			stopBlock()
			return nil, err
		}
		out = append(out, f)
	}
	var prof bytes.Buffer
	if stages {
		out = append(out, &prof)
	}
	pprof.StartCPUProfile(io.MultiWriter(out...))
	return func() {
		pprof.StopCPUProfile()
		if f != nil {
			f.Close()
		}
		if stages {
			printStages(&prof)
		}
		stopBlock()
	}, nil
}

// stagesEnv, set by the harness's -stages, makes each child profile its CPU
// and print its samples by stage (stages.go) on a "stages" line.
const stagesEnv = "RDMABENCH_STAGES"

// printStages prints a CPU profile's samples by stage for runOurs.
func printStages(prof io.Reader) {
	counts, err := profileStages(prof)
	if err != nil {
		fmt.Fprintf(os.Stderr, "stages: reading the CPU profile: %v\n", err)
		return
	}
	b, _ := json.Marshal(counts)
	fmt.Printf("stages %s\n", b)
}

// startBlockProfile: RDMABENCH_BLOCKPROFILE=prefix records every blocking
// event of each child (runtime.SetBlockProfileRate(1)) and writes the
// profile to prefix.server / prefix.client: which select a parked wait sat
// in, how often and how long (go tool pprof -sample_index=contentions).
func startBlockProfile(serve bool) (stop func(), err error) {
	prefix := os.Getenv("RDMABENCH_BLOCKPROFILE")
	if prefix == "" {
		return func() {}, nil
	}
	f, err := os.Create(profilePath(prefix, serve))
	if err != nil {
		return nil, err
	}
	runtime.SetBlockProfileRate(1)
	return func() {
		runtime.SetBlockProfileRate(0)
		pprof.Lookup("block").WriteTo(f, 0)
		f.Close()
	}, nil
}

// profilePath is a child's profile file: prefix.server or prefix.client.
func profilePath(prefix string, serve bool) string {
	if serve {
		return prefix + ".server"
	}
	return prefix + ".client"
}

// profiling is set while a CPU profile is written: the latency clients
// then label their samples with the phase of the round trip they are in
// (go tool pprof -tags, -tagfocus phase=recv). A sample taken inside C
// (runtime._ExternalCode: a poll or a post through the fast calls) has no
// Go stack, but it has the goroutine's labels, so the label says whether
// the C time was posting (send) or polling (recv).
var profiling bool

const (
	phaseOther = iota
	phaseSend
	phaseRecv
	phaseRelease
)

var phaseCtx = func() (ctx [4]context.Context) {
	for i, name := range []string{"other", "send", "recv", "release"} {
		ctx[i] = pprof.WithLabels(context.Background(), pprof.Labels("phase", name))
	}
	return
}()

// phase labels the calling goroutine's CPU samples (only while profiling).
func phase(p int) {
	if profiling {
		pprof.SetGoroutineLabels(phaseCtx[p])
	}
}

// printCounters and printResult write the lines runOurs reads.
func printCounters(m map[string]float64) {
	b, _ := json.Marshal(m)
	fmt.Printf("counters %s\n", b)
}

func printResult(s *Sample) {
	b, _ := json.Marshal(s)
	fmt.Printf("result %s\n", b)
}

// runOurs runs one case (over RDMA, or over TCP as the baseline) in two child
// processes and returns the sample of the side that measured.
func (h *harness) runOurs(ctx context.Context, a childArgs) (*Sample, error) {
	t0 := time.Now()
	srv, err := startProc(ctx, h.timeout, h.serverCPU, append([]string{h.self, "-serve"}, a.flags(h)...)...)
	if err != nil {
		return nil, err
	}
	defer srv.kill()
	addr, err := srv.waitFor("ready ", h.readyTimeout)
	if err != nil {
		return nil, childErr(fmt.Errorf("server: %w", err), srv)
	}
	h.vlogf(t0, "server ready on %s", addr)
	cli, err := startProc(ctx, h.timeout, h.clientCPU, append([]string{h.self, "-client", addr}, a.flags(h)...)...)
	if err != nil {
		return nil, err
	}
	defer cli.kill()
	cerr := cli.wait(h.timeout + 5*time.Second)
	h.vlogf(t0, "client exited: %v", cerr)
	grace := 30 * time.Second // for the server's Close after the client's
	if cerr != nil {
		grace = 2 * time.Second // the server has nothing more to do
	}
	serr := srv.wait(grace)
	h.vlogf(t0, "server exited: %v", serr)
	if cerr != nil || serr != nil {
		return nil, childErr(fmt.Errorf("client: %v; server: %v", status(cli, cerr), status(srv, serr)), srv, cli)
	}
	var sample *Sample
	counters, stages := map[string]float64{}, map[string]float64{}
	for i, p := range []*proc{srv, cli} {
		for _, l := range p.stdout.lines() {
			if js, ok := strings.CutPrefix(l, "result "); ok && sample == nil {
				var s Sample
				if err := json.Unmarshal([]byte(js), &s); err != nil {
					return nil, childErr(fmt.Errorf("bad result line %q: %w", l, err), p)
				}
				sample = &s
			}
			// "counters {json}" and "stages {json}": each side's, keyed by side.
			for prefix, into := range map[string]map[string]float64{"counters ": counters, "stages ": stages} {
				js, ok := strings.CutPrefix(l, prefix)
				if !ok {
					continue
				}
				var m map[string]float64
				if err := json.Unmarshal([]byte(js), &m); err != nil {
					return nil, childErr(fmt.Errorf("bad %sline %q: %w", prefix, l, err), p)
				}
				side := [...]string{"server.", "client."}[i]
				for k, v := range m {
					into[side+k] = v
				}
			}
		}
	}
	if sample == nil {
		return nil, childErr(fmt.Errorf("neither side reported a result"), srv, cli)
	}
	if len(counters) > 0 {
		sample.Counters = counters
	}
	if len(stages) > 0 {
		sample.Stages = stages
	}
	return sample, nil
}

// ctxSwitches sums the voluntary and involuntary context switches of every
// thread of this process (a thread switch is what a Go runtime hand-over
// costs and what perftest's single thread never pays), and counts threads.
func ctxSwitches() (sw [2]float64, threads float64) {
	dirs, _ := filepath.Glob("/proc/self/task/*/status")
	for _, p := range dirs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		threads++
		for _, l := range strings.Split(string(b), "\n") {
			var v float64
			if _, err := fmt.Sscanf(l, "voluntary_ctxt_switches: %g", &v); err == nil {
				sw[0] += v
			}
			if _, err := fmt.Sscanf(l, "nonvoluntary_ctxt_switches: %g", &v); err == nil {
				sw[1] += v
			}
		}
	}
	return sw, threads
}

// perMessage is the work one process did per message (per round trip for
// latency cases) between two ConnStats: doorbells, signaled completions,
// calls into C, wake-ups and parks, the work a message costs beside
// perftest's. cgo_work counts the crossings that returned work (posts and
// polls that found completions), cgo_empty the polls that found nothing.
func perMessage(a, b rdma.ConnStats, n int) map[string]float64 {
	if n <= 0 {
		n = 1
	}
	d := func(x, y uint64) float64 { return float64(y-x) / float64(n) }
	polls := d(a.InlinePolls, b.InlinePolls) + d(a.PollCalls, b.PollCalls)
	empty := d(a.EmptyPolls, b.EmptyPolls)
	return map[string]float64{
		"send_doorbells": d(a.SendPosts, b.SendPosts),
		"recv_doorbells": d(a.RecvPosts, b.RecvPosts),
		"send_wrs":       d(a.SendWRs, b.SendWRs),
		"signaled":       d(a.Signaled, b.Signaled),
		"inlined":        d(a.Inlined, b.Inlined),
		"completions":    d(a.Completions, b.Completions),
		"caller_polls":   d(a.InlinePolls, b.InlinePolls),
		"poller_polls":   d(a.PollCalls, b.PollCalls),
		"poller_wakeups": d(a.PollerWakeups, b.PollerWakeups),
		"parks":          d(a.Parks, b.Parks),
		"arms":           d(a.Arms, b.Arms),
		"cgo_work":       d(a.PostCalls, b.PostCalls) + polls - empty,
		"cgo_empty":      empty + d(a.Arms, b.Arms),
	}
}

// status is a child's exit error with the last line it wrote to stderr.
func status(p *proc, err error) string {
	if err == nil {
		return "ok"
	}
	l := strings.Split(strings.TrimSpace(p.stderr.String()), "\n")
	if last := strings.TrimPrefix(l[len(l)-1], "rdmabench child: "); last != "" {
		return fmt.Sprintf("%v (%s)", err, last)
	}
	return err.Error()
}

func fatalChild(err error) {
	fmt.Fprintf(os.Stderr, "rdmabench child: %v\n", err)
	os.Exit(1)
}
