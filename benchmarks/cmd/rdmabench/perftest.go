//go:build linux

package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/verbline/rdma"
)

// perftestTool is a perftest program used as a baseline for one metric. Every
// tool runs with -R (connections set up by rdma_cm, as ours are) and the same
// -s (size) and -n (iterations) as ours; not with -F, so that perftest's
// warning about the CPU frequency it converts cycles with shows in the log.
type perftestTool struct {
	Cmd    string // ib_send_lat, ...
	Metric Metric
	// Conn is perftest's -c (connection type): "" for its default, RC;
	// "UD" for unreliable datagrams.
	Conn string
	// MaxSize: the tool runs only at sizes up to it (0: every size). A UD
	// datagram is one packet: at most the path MTU.
	MaxSize int
	// Atomic is the atomics tools' -A (CMP_AND_SWAP or FETCH_AND_ADD).
	Atomic string
}

// Label is the tool's column name in the table, the JSON and the chart.
func (t perftestTool) Label() string {
	if t.Conn != "" {
		return t.Cmd + " -c " + t.Conn
	}
	if t.Atomic != "" {
		return t.Cmd + " -A " + t.Atomic + " -R"
	}
	return t.Cmd + " -R"
}

// rdmaCM reports whether the tool runs with -R (rdma_cm). The UD runs do
// not: with -R, perftest 4.5's client sends its address resolution (SIDR)
// right after the parameter exchange, before the server listens in the UDP
// port space, gets "RDMA_CM_EVENT_UNREACHABLE; error: 1" and crashes (every
// time when pinned). Without -R, perftest exchanges its parameters over a
// TCP socket and addresses the peer by GID (-x, found by udGIDIndex).
func (t perftestTool) rdmaCM() bool { return t.Conn != "UD" }

// perftestTools are the perftest baselines of each metric. Latency uses
// t_typical (perftest's median) and the 99% / 99.9% percentile columns, all
// one-way (perftest halves the round trip, as we do). Bandwidth uses
// "BW average[MB/sec]", whose MB is 2^20 bytes (perftest divides by 0x100000
// unless --report_gbits): it is multiplied by 1.048576 to get MB = 10^6 bytes,
// and checked against MsgRate[Mpps] x size. Message rate uses MsgRate[Mpps].
var perftestTools = []perftestTool{
	{Cmd: "ib_send_lat", Metric: Latency},
	{Cmd: "ib_write_lat", Metric: Latency},
	{Cmd: "ib_send_lat", Metric: Latency, Conn: "UD", MaxSize: udMaxSize}, // beside our PacketConn
	{Cmd: "ib_send_bw", Metric: Bandwidth},
	{Cmd: "ib_write_bw", Metric: Bandwidth},
	{Cmd: "ib_read_bw", Metric: Bandwidth}, // the ceiling of messages above a receive buffer (one RDMA READ each)
	{Cmd: "ib_send_bw", Metric: Rate},
	{Cmd: "ib_send_bw", Metric: Rate, Conn: "UD", MaxSize: udMaxSize},
	{Cmd: "ib_atomic_lat", Metric: AtomicLatency, Atomic: "CMP_AND_SWAP"},
	{Cmd: "ib_atomic_lat", Metric: AtomicLatency, Atomic: "FETCH_AND_ADD"},
	{Cmd: "ib_atomic_bw", Metric: AtomicRate, Atomic: "FETCH_AND_ADD"},
}

// args are the tool's arguments for one run, but for the port (both sides
// use the same ones; the client adds the server's address). gid is the GID
// index of the address, for the tools without -R.
func (t perftestTool) args(size, iters, depth, gid int) []string {
	a := []string{t.Cmd}
	if t.rdmaCM() {
		a = append(a, "-R")
	} else {
		a = append(a, "-x", strconv.Itoa(gid))
	}
	if t.Atomic != "" {
		// The word is 8 bytes (perftest refuses -s for atomics); the rate
		// keeps the depth ours negotiates outstanding (-o, and -t so that
		// the send queue holds them).
		a = append(a, "-A", t.Atomic, "-n", strconv.Itoa(iters))
		if t.Metric == AtomicRate {
			a = append(a, "-o", strconv.Itoa(atomicDepth), "-t", strconv.Itoa(atomicDepth))
		}
		return a
	}
	a = append(a, "-s", strconv.Itoa(size), "-n", strconv.Itoa(iters))
	if t.Conn != "" {
		a = append(a, "-c", t.Conn)
	}
	if t.Metric != Latency {
		// The send queue depth (outstanding sends); for ib_send_bw also the
		// receive queue depth (posted receives), as ours gets depth credits.
		a = append(a, "-t", strconv.Itoa(depth))
		if t.Cmd == "ib_send_bw" {
			a = append(a, "-r", strconv.Itoa(depth))
		}
	}
	return a
}

// mibToMB converts perftest's MB/sec (2^20 bytes per second) into MB/s with
// MB = 10^6 bytes.
const mibToMB = 1048576.0 / 1e6

// perftestAttempts is how often a perftest server and client pair is started
// for one run before the run counts as failed. perftest is flaky in an
// emulated guest: a client that connects while the server is still setting
// up its listener can wedge both, and the CPU frequency perftest samples at
// start to convert TSC cycles into time sometimes fails ("Correlation
// coefficient r^2 < 0.9"), and then it reports 0.
const perftestAttempts = 3

// runPerftest runs one server and one client of tool and parses the report.
func (h *harness) runPerftest(ctx context.Context, t perftestTool, size, iters int) (*Sample, error) {
	var err error
	for attempt := 1; attempt <= perftestAttempts; attempt++ {
		var s *Sample
		var retry bool
		s, retry, err = h.perftestOnce(ctx, t, size, iters)
		if err == nil {
			return s, nil
		}
		if !retry || ctx.Err() != nil || attempt == perftestAttempts {
			break
		}
		h.logf("  note: %s attempt %d failed, retrying with a new server and client: %s", t.Cmd, attempt, firstLine(err.Error()))
	}
	return nil, err
}

// perftestOnce starts a server, waits until it listens, then runs the client.
// retry says whether the failure looks transient.
func (h *harness) perftestOnce(ctx context.Context, t perftestTool, size, iters int) (_ *Sample, retry bool, _ error) {
	port, err := h.freePort()
	if err != nil {
		return nil, false, err
	}
	gid := 0
	if !t.rdmaCM() {
		if gid, err = udGIDIndex(h.addr); err != nil {
			return nil, false, err
		}
	}
	argv := append(t.args(size, iters, h.depth, gid), "-p", strconv.Itoa(port))
	lineBuffered := argv
	if h.stdbuf != "" {
		// perftest's stdout is a pipe here, so it is block-buffered: stdbuf
		// makes it line-buffered so that we can follow its progress.
		lineBuffered = append([]string{h.stdbuf, "-oL"}, argv...)
	}
	t0 := time.Now()
	srv, err := startProc(ctx, h.timeout, h.serverCPU, lineBuffered...)
	if err != nil {
		return nil, false, err
	}
	defer srv.kill()
	if h.stdbuf != "" {
		if _, err := srv.waitFor("* Waiting for client to connect", h.readyTimeout); err != nil {
			// A server that exits at once refuses its options: no retry.
			return nil, !srv.exited(), childErr(fmt.Errorf("%s server: %v", t.Cmd, status(srv, err)), srv)
		}
	}
	// perftest prints that banner before it creates its listener: wait
	// until the kernel lists the listener, or a client may be rejected.
	wait := waitListening
	if !t.rdmaCM() {
		wait = waitTCPListening
	}
	if err := wait(ctx, srv, port, h.readyTimeout); err != nil {
		return nil, !srv.exited(), childErr(fmt.Errorf("%s server: %v", t.Cmd, status(srv, err)), srv)
	}
	h.vlogf(t0, "%s server listens on port %d", t.Cmd, port)

	cli, err := startProc(ctx, h.timeout, h.clientCPU, append(lineBuffered, h.addr)...)
	if err != nil {
		return nil, false, err
	}
	defer cli.kill()
	// Connected once both sides have printed the peer's address. A pair
	// that has not connected within connectTimeout is wedged.
	connectTimeout := min(h.readyTimeout, 60*time.Second)
	if h.stdbuf != "" {
		if _, err := cli.waitFor(" remote address:", connectTimeout); err != nil {
			cli.kill()
			cli.wait(5 * time.Second)
			return nil, ctx.Err() == nil, childErr(fmt.Errorf("%s client did not connect: %v", t.Cmd, status(cli, err)), cli, srv)
		}
		h.vlogf(t0, "%s client connected", t.Cmd)
	}
	// Wait for the client. When one side fails to produce its report
	// ("Can't produce a report": the r^2 of its frequency sample), it exits
	// at once and the other hangs in teardown: give the survivor a grace
	// period, then kill it and use whatever complete table was printed.
	const grace = 15 * time.Second
	// A UD run can lose datagrams; perftest's server then waits forever
	// for the rest and its client for the server, after the client printed
	// its table: once that table is complete, give them a short grace.
	tableDone := tablePrinted(cli, t.Metric, size)
	select {
	case <-cli.done:
	case <-tableDone:
		select {
		case <-cli.done:
		case <-time.After(5 * time.Second):
			cli.kill()
			<-cli.done
			srv.kill()
			h.logf("  note: %s client still running 5s after printing its table (a lost datagram?); killed, table used", t.Cmd)
		}
	case <-srv.done:
		select {
		case <-cli.done:
		case <-time.After(grace):
			cli.kill()
			<-cli.done
			h.logf("  note: %s client still running %v after its server exited (%s); killed", t.Cmd, grace, status(srv, srv.err))
		}
	}
	h.vlogf(t0, "%s client exited: %v", t.Cmd, cli.err)
	serr := srv.wait(grace)
	h.vlogf(t0, "%s server exited: %v", t.Cmd, serr)
	if h.verbose {
		h.vlogf(t0, "%s client: %s; server: %s", t.Cmd, perftestSettings(cli), perftestSettings(srv))
	}
	for _, p := range []*proc{cli, srv} {
		for _, l := range strings.Split(p.stderr.String(), "\n") {
			if strings.Contains(l, "Conflicting CPU frequency") {
				// perftest then converts cycles with the frequency it sampled.
				h.logf("  note: %s: %s", t.Cmd, strings.TrimSpace(l))
			}
		}
	}
	// The client's table, else the server's (the same measurement from the
	// other side's clock).
	s, err := parsePerftest(cli.stdout.String(), t.Metric, size)
	if err == nil {
		if cli.err != nil {
			h.logf("  note: %s client: %s after printing its report; report used", t.Cmd, status(cli, cli.err))
		}
		return s, false, nil
	}
	s2, err2 := parsePerftest(srv.stdout.String(), t.Metric, size)
	if err2 == nil {
		h.logf("  note: %s client's report unusable (%s); using the server's", t.Cmd, firstLine(status(cli, err)))
		return s2, false, nil
	}
	timedOut := cli.err != nil && strings.Contains(cli.err.Error(), "timeout")
	return nil, !timedOut && ctx.Err() == nil, childErr(fmt.Errorf("%s: client: %w (%s); server: %w (%s)",
		t.Cmd, err, status(cli, cli.err), err2, status(srv, serr)), cli, srv)
}

// perftestSettings are the depths and MTU perftest used (it lowers depths
// above -n).
func perftestSettings(p *proc) string {
	var set []string
	for _, l := range p.stdout.lines() {
		for _, key := range []string{"TX depth", "RX depth", "CQ Moderation", "Mtu"} {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == key {
				set = append(set, key+" "+strings.TrimSpace(strings.SplitN(v, "\t", 2)[0]))
			}
		}
	}
	return strings.Join(set, ", ")
}

// waitListening waits until `rdma resource show cm_id` lists a listener on
// port. Without the rdma tool it waits a second.
func waitListening(ctx context.Context, srv *proc, port int, d time.Duration) error {
	if _, err := exec.LookPath("rdma"); err != nil {
		select {
		case <-time.After(time.Second):
			return nil
		case <-srv.done:
			return fmt.Errorf("exited: %w", srv.err)
		}
	}
	deadline := time.Now().Add(d)
	for {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		out, _ := exec.CommandContext(cctx, "rdma", "resource", "show", "cm_id").Output()
		cancel()
		if listensOn(string(out), port, os.Getpid()) {
			return nil
		}
		if srv.exited() {
			return fmt.Errorf("exited (%w) before listening", srv.err)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("not listening on port %d after %v", port, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// listensOn reports whether `rdma resource show cm_id` output lists a
// listener on port that is not this process's: freePort's own probe
// listener on that port could still be listed for a moment after its
// Close, and a client started on the strength of it would be rejected
// ("Invalid Service ID", RDMA_CM_EVENT_REJECTED error 8) because perftest
// does not listen yet. (make bench-2host's first ib_send_lat in a fresh
// server guest is still rejected once in a while; the retry recovers.)
func listensOn(out string, port, self int) bool {
	re := regexp.MustCompile(`state LISTEN .*src-addr \S+:` + strconv.Itoa(port) + `\b`)
	pidRe := regexp.MustCompile(`\bpid (\d+)\b`)
	for _, l := range strings.Split(out, "\n") {
		if !re.MatchString(l) {
			continue
		}
		if m := pidRe.FindStringSubmatch(l); m != nil && m[1] == strconv.Itoa(self) {
			continue
		}
		return true
	}
	return false
}

// waitTCPListening waits until a TCP socket listens on port (where a
// perftest server without -R exchanges its parameters): its client does
// not retry a refused connection.
func waitTCPListening(ctx context.Context, srv *proc, port int, d time.Duration) error {
	want := fmt.Sprintf(":%04X ", port)
	deadline := time.Now().Add(d)
	for {
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			b, _ := os.ReadFile(f)
			for _, l := range strings.Split(string(b), "\n") {
				// "sl local_address rem_address st ...": LISTEN is st 0A.
				if fs := strings.Fields(l); len(fs) > 3 && strings.Contains(fs[1]+" ", want) && fs[3] == "0A" {
					return nil
				}
			}
		}
		if srv.exited() {
			return fmt.Errorf("exited (%w) before listening", srv.err)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no TCP listener on port %d after %v", port, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// udGIDIndex is the GID index of addr on its RDMA device (a RoCE v2 GID,
// IPv4-mapped for an IPv4 address), from sysfs: perftest without -R takes
// it as -x.
func udGIDIndex(addr string) (int, error) {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return 0, fmt.Errorf("RDMA address %q: %w", addr, err)
	}
	gid := ip.As16()
	paths, _ := filepath.Glob("/sys/class/infiniband/*/ports/*/gids/*")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		raw, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(string(b)), ":", ""))
		if err != nil || len(raw) != 16 || [16]byte(raw) != gid {
			continue
		}
		dir, idx := filepath.Split(p)
		typ, _ := os.ReadFile(filepath.Join(dir, "..", "gid_attrs", "types", idx))
		if strings.TrimSpace(string(typ)) != "RoCE v2" {
			continue
		}
		return strconv.Atoi(idx)
	}
	return 0, fmt.Errorf("no RoCE v2 GID for %s in /sys/class/infiniband (is it an address of an RDMA netdev?)", addr)
}

// tablePrinted is closed once cli, a perftest client, has printed a
// complete result table (never, if it exits first).
func tablePrinted(cli *proc, m Metric, size int) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		for {
			ch := cli.stdout.changed()
			if _, err := parsePerftest(cli.stdout.String(), m, size); err == nil {
				close(done)
				return
			}
			select {
			case <-ch:
			case <-cli.done:
				return
			}
		}
	}()
	return done
}

// parsePerftest reads the result table perftest prints at the end:
//
//	#bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]
//	64      1000          13.58          89659.50      19.96             451.56         1349.18         5865.76                 89659.50
//
//	#bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
//	65536      1000             17.72              15.10              0.000242
func parsePerftest(out string, m Metric, size int) (*Sample, error) {
	cols, vals, err := perftestRow(out, size)
	if err != nil {
		return nil, err
	}
	get := func(name string) (float64, error) {
		for i, c := range cols {
			if c == name {
				if i >= len(vals) {
					return 0, fmt.Errorf("no value for column %q", name)
				}
				return vals[i], nil
			}
		}
		return 0, fmt.Errorf("no column %q in perftest's table (columns: %q)", name, cols)
	}
	var s Sample
	var errs []error
	must := func(name string) float64 {
		v, err := get(name)
		if err != nil {
			errs = append(errs, err)
		}
		return v
	}
	switch m {
	case Latency, AtomicLatency: // ib_atomic_lat's times are whole operations, not halved
		s.Value = must("t_typical[usec]")
		s.Avg = must("t_avg[usec]")
		s.P99 = must("99% percentile[usec]")
		s.P999 = must("99.9% percentile[usec]")
	case Bandwidth:
		rate := must("MsgRate[Mpps]")
		s.Check = rate * float64(size) // 10^6 msg/s x bytes = 10^6 B/s
		if v, err := get("BW average[MB/sec]"); err == nil {
			s.Value = v * mibToMB
		} else if v, err2 := get("BW average[Gb/sec]"); err2 == nil {
			s.Value = v * 1e9 / 8 / 1e6
		} else {
			errs = append(errs, err)
		}
	case Rate, AtomicRate:
		s.Value = must("MsgRate[Mpps]")
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if !(s.Value > 0) || math.IsInf(s.Value, 0) {
		return nil, fmt.Errorf("perftest reported %v", s.Value)
	}
	return &s, nil
}

// perftestRow finds the table header and the row for size.
func perftestRow(out string, size int) ([]string, []float64, error) {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != "#bytes" {
			continue
		}
		cols := headerColumns(f)
		for _, r := range lines[i+1:] {
			rf := strings.Fields(r)
			if len(rf) == 0 || rf[0] != strconv.Itoa(size) {
				continue
			}
			vals := make([]float64, len(rf))
			for j, x := range rf {
				v, err := strconv.ParseFloat(x, 64)
				if err != nil {
					return nil, nil, fmt.Errorf("perftest row %q: %w", r, err)
				}
				vals[j] = v
			}
			if len(vals) != len(cols) {
				return nil, nil, fmt.Errorf("perftest row %q has %d values for %d columns %q", r, len(vals), len(cols), cols)
			}
			return cols, vals, nil
		}
		return nil, nil, fmt.Errorf("perftest printed a table without a row for %d bytes", size)
	}
	return nil, nil, errors.New("no result table (#bytes ...) in perftest's output")
}

// headerColumns joins the header's words into column names: a word without a
// unit in brackets ("99%", "BW") belongs to the next one ("99% percentile[usec]").
func headerColumns(words []string) []string {
	var cols []string
	pending := ""
	for _, w := range words {
		if pending != "" {
			w = pending + " " + w
			pending = ""
		}
		if strings.HasPrefix(w, "#") || strings.Contains(w, "[") {
			cols = append(cols, w)
		} else {
			pending = w
		}
	}
	if pending != "" {
		cols = append(cols, pending)
	}
	return cols
}

// freePort returns an rdma_cm port nobody listens on and no earlier run of
// this harness used, for a perftest server: it listens on port 0 of the RDMA
// address, notes the port and closes. If that fails it counts up from a base.
func (h *harness) freePort() (int, error) {
	if h.usedPorts == nil {
		h.usedPorts = map[int]bool{}
	}
	for range 50 {
		p, err := listenPort(h.addr)
		if err != nil {
			h.nextPort++
			p = h.nextPort
		}
		if p > 0 && p < 65536 && !h.usedPorts[p] {
			h.usedPorts[p] = true
			return p, nil
		}
	}
	return 0, errors.New("no free rdma_cm port found")
}

func listenPort(addr string) (int, error) {
	ln, err := rdma.Listen("rdma", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	_, p, err := net.SplitHostPort(ln.Addr().String())
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(p)
}

// lookStdbuf finds stdbuf (coreutils), or returns "" (then the client is
// simply retried until the server listens).
func lookStdbuf() string {
	p, err := exec.LookPath("stdbuf")
	if err != nil {
		return ""
	}
	return p
}
