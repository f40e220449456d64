//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Two-host mode. "rdmabench -listen HOST:PORT" on host B waits for clients on
// a TCP control connection; "rdmabench -connect HOST:PORT" on host A runs the
// plan with every server side (ours, perftest's server, TCP's) on B and every
// client side on A, and writes the one report (table, JSON, chart) on A.
//
// The control protocol is JSON, one object per line. The client opens with a
// hello (protocol version, build, its list of cases and perftest tools, and
// the parameters: depth, spin, GOMAXPROCS); the server answers with an error
// if any of them differs from its own, else with its RDMA address. Then, per
// run, "start" (the server starts its side and answers "ready" with what the
// client connects to) and "finish" (the client's side has exited; the server
// waits for its own side and answers with its output).

// controlProto is the control protocol's version: change it with the messages.
const controlProto = 1

type ctlHello struct {
	Proto  int      `json:"proto"`
	Build  string   `json:"build"`
	Cases  []string `json:"cases"`
	Tools  []string `json:"tools"`
	Depth  int      `json:"depth"`
	Spin   string   `json:"spin"`
	Procs  int      `json:"procs"`
	Client string   `json:"client"` // the client's RDMA address, for the server's log
}

type ctlHelloReply struct {
	Error string `json:"error,omitempty"`
	Addr  string `json:"addr"` // the server's RDMA address: where the clients connect
	Build string `json:"build"`
}

type ctlStart struct {
	Op      string `json:"op"` // "start"
	Kind    string `json:"kind"`
	Case    string `json:"case,omitempty"`
	Tool    string `json:"tool,omitempty"` // perftest: perftestTool.Label() and metric
	Metric  Metric `json:"metric"`
	Network string `json:"network,omitempty"`
	Size    int    `json:"size"`
	Iters   int    `json:"iters"`
	Warmup  int    `json:"warmup"`
}

type ctlReady struct {
	Error string `json:"error,omitempty"`
	Ready string `json:"ready"` // ours and TCP: the listener's address; perftest: the port
}

type ctlFinish struct {
	Op           string `json:"op"` // "finish"
	ClientFailed bool   `json:"client_failed"`
}

type ctlDone struct {
	Err    string `json:"err,omitempty"` // the server side's exit error
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	Cmd    string `json:"cmd"`
}

// buildID identifies this program's build: the VCS revision (with
// "+modified" for a dirty tree) and the Go version.
func buildID() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, mod := "", ""
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				mod = "+modified"
			}
		}
	}
	if rev == "" {
		rev = "no-vcs"
	}
	return rev + mod + " " + bi.GoVersion
}

// localHello is what this build offers: its cases, tools and parameters.
func (h *harness) localHello() ctlHello {
	hl := ctlHello{Proto: controlProto, Build: buildID(), Depth: h.depth, Spin: h.spin.String(), Procs: h.procs, Client: h.addr}
	for _, c := range registry {
		hl.Cases = append(hl.Cases, c.Metric.Short()+"/"+c.Name)
	}
	for _, t := range perftestTools {
		hl.Tools = append(hl.Tools, t.Metric.Short()+"/"+t.Label())
	}
	return hl
}

// checkHello compares a client's hello with the server's own and says what
// differs. Parameters the server was not given explicitly (given[name] false)
// are taken from the client.
func checkHello(client, server ctlHello, given map[string]bool) error {
	var diffs []string
	if client.Proto != server.Proto {
		diffs = append(diffs, fmt.Sprintf("control protocol: client %d, server %d", client.Proto, server.Proto))
	}
	if client.Build != server.Build {
		diffs = append(diffs, fmt.Sprintf("build: client %q, server %q", client.Build, server.Build))
	}
	if d := listDiff(client.Cases, server.Cases); d != "" {
		diffs = append(diffs, "cases: "+d)
	}
	if d := listDiff(client.Tools, server.Tools); d != "" {
		diffs = append(diffs, "perftest baselines: "+d)
	}
	if given["depth"] && client.Depth != server.Depth {
		diffs = append(diffs, fmt.Sprintf("-depth: client %d, server %d", client.Depth, server.Depth))
	}
	if given["spin"] && client.Spin != server.Spin {
		diffs = append(diffs, fmt.Sprintf("-spin: client %s, server %s", client.Spin, server.Spin))
	}
	if given["gomaxprocs"] && client.Procs != server.Procs {
		diffs = append(diffs, fmt.Sprintf("-gomaxprocs: client %d, server %d", client.Procs, server.Procs))
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("client and server differ (%s): build rdmabench from the same commit for both hosts, "+
		"and give -depth, -spin and -gomaxprocs on the client only", strings.Join(diffs, "; "))
}

// listDiff names the entries only one side has, or "" if the lists are equal.
func listDiff(client, server []string) string {
	if slices.Equal(client, server) {
		return ""
	}
	var onlyC, onlyS []string
	for _, c := range client {
		if !slices.Contains(server, c) {
			onlyC = append(onlyC, c)
		}
	}
	for _, s := range server {
		if !slices.Contains(client, s) {
			onlyS = append(onlyS, s)
		}
	}
	if len(onlyC) == 0 && len(onlyS) == 0 {
		return "the same entries in a different order"
	}
	return fmt.Sprintf("only the client has %q, only the server has %q", onlyC, onlyS)
}

// ctlConn is one end of a control connection.
type ctlConn struct {
	c   net.Conn
	enc *json.Encoder
	dec *json.Decoder
}

func newCtlConn(c net.Conn) *ctlConn {
	return &ctlConn{c: c, enc: json.NewEncoder(c), dec: json.NewDecoder(bufio.NewReader(c))}
}

func (c *ctlConn) send(v any) error { return c.enc.Encode(v) }

// recv decodes the next message into v, waiting at most d (0: no limit).
func (c *ctlConn) recv(v any, d time.Duration) error {
	if d > 0 {
		c.c.SetReadDeadline(time.Now().Add(d))
		defer c.c.SetReadDeadline(time.Time{})
	}
	return c.dec.Decode(v)
}

// ---- the server (-listen) ----

// serveControl accepts control connections on ln, one session at a time,
// until ctx ends.
func (h *harness) serveControl(ctx context.Context, ln net.Listener, given map[string]bool) error {
	go func() { <-ctx.Done(); ln.Close() }()
	h.logf("rdmabench server: control on %s, RDMA address %s (%s), build %s", ln.Addr(), h.addr, deviceName(), buildID())
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		// A session ends with an error, io.EOF when the client hangs up.
		if err := h.serveSession(ctx, newCtlConn(c), given); !errors.Is(err, io.EOF) {
			h.logf("rdmabench server: session from %s: %v", c.RemoteAddr(), err)
		} else {
			h.logf("rdmabench server: session from %s ended", c.RemoteAddr())
		}
		c.Close()
	}
}

func (h *harness) serveSession(ctx context.Context, c *ctlConn, given map[string]bool) error {
	var hello ctlHello
	if err := c.recv(&hello, 30*time.Second); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	mine := h.localHello()
	if err := checkHello(hello, mine, given); err != nil {
		c.send(ctlHelloReply{Error: err.Error(), Addr: h.addr, Build: mine.Build})
		return err
	}
	// The client's parameters, the same on both hosts.
	h.depth, h.procs = hello.Depth, hello.Procs
	if d, err := time.ParseDuration(hello.Spin); err == nil {
		h.spin = d
	}
	h.logf("rdmabench server: client %s (RDMA %s): depth %d, spin %v, GOMAXPROCS %d", c.c.RemoteAddr(), hello.Client, h.depth, h.spin, h.procs)
	if err := c.send(ctlHelloReply{Addr: h.addr, Build: mine.Build}); err != nil {
		return err
	}
	for {
		var st ctlStart
		if err := c.recv(&st, 0); err != nil {
			return err
		}
		if st.Op != "start" {
			return fmt.Errorf("unexpected control message %q", st.Op)
		}
		if err := h.serveRun(ctx, c, st); err != nil {
			return err
		}
	}
}

// serveRun starts the server side of one run, answers ready, waits for the
// client's finish and answers with the server side's output. An error here
// ends the session (the control connection broke); a failed run is reported
// to the client instead.
func (h *harness) serveRun(ctx context.Context, c *ctlConn, st ctlStart) error {
	if st.Kind == "load" {
		return h.serveLoadRun(c, st)
	}
	srv, ready, grace, err := h.startServerSide(ctx, st)
	if err != nil {
		done := ctlReady{Error: err.Error()}
		if srv != nil {
			done.Error = childErr(err, srv).Error()
			srv.kill()
		}
		return c.send(done)
	}
	defer srv.kill()
	if err := c.send(ctlReady{Ready: ready}); err != nil {
		return err
	}
	var fin ctlFinish
	if err := c.recv(&fin, h.timeout+time.Minute); err != nil {
		return err
	}
	if fin.ClientFailed {
		grace = 2 * time.Second
	}
	serr := srv.wait(grace)
	done := ctlDone{Stdout: srv.stdout.String(), Stderr: srv.stderr.String(), Cmd: srv.name}
	if serr != nil {
		done.Err = status(srv, serr)
	}
	return c.send(done)
}

// startServerSide starts one run's server and waits until it listens; ready
// is what the client connects to, grace how long the server may take to exit
// after the client.
func (h *harness) startServerSide(ctx context.Context, st ctlStart) (srv *proc, ready string, grace time.Duration, err error) {
	switch st.Kind {
	case "ours", "tcp", "floor":
		a := childArgs{caseName: st.Case, network: st.Network, size: st.Size, iters: st.Iters, warmup: st.Warmup, tcpHost: h.addr}
		srv, err = startProc(ctx, h.timeout, h.serverCPU, append([]string{h.self, "-serve"}, a.flags(h)...)...)
		if err != nil {
			return nil, "", 0, err
		}
		addr, err := srv.waitFor("ready ", h.readyTimeout)
		if err != nil {
			return srv, "", 0, fmt.Errorf("server: %w", err)
		}
		return srv, addr, 30 * time.Second, nil
	case "perftest":
		t, ok := toolByLabel(st.Metric, st.Tool)
		if !ok {
			return nil, "", 0, fmt.Errorf("no perftest baseline %s/%s here", st.Metric.Short(), st.Tool)
		}
		port, err := h.freePort()
		if err != nil {
			return nil, "", 0, err
		}
		gid := 0
		if !t.rdmaCM() {
			if gid, err = udGIDIndex(h.addr); err != nil {
				return nil, "", 0, err
			}
		}
		argv := h.lineBuffered(append(t.args(st.Size, st.Iters, h.depth, gid), "-p", strconv.Itoa(port)))
		srv, err = startProc(ctx, h.timeout, h.serverCPU, argv...)
		if err != nil {
			return nil, "", 0, err
		}
		if h.stdbuf != "" {
			if _, err := srv.waitFor("* Waiting for client to connect", h.readyTimeout); err != nil {
				return srv, "", 0, fmt.Errorf("%s server: %v", t.Cmd, status(srv, err))
			}
		}
		wait := waitListening
		if !t.rdmaCM() {
			wait = waitTCPListening
		}
		if err := wait(ctx, srv, port, h.readyTimeout); err != nil {
			return srv, "", 0, fmt.Errorf("%s server: %v", t.Cmd, status(srv, err))
		}
		grace = 15 * time.Second
		if !t.rdmaCM() {
			grace = 5 * time.Second // UD: a lost datagram leaves the server waiting forever
		}
		return srv, strconv.Itoa(port), grace, nil
	}
	return nil, "", 0, fmt.Errorf("unknown run kind %q", st.Kind)
}

func toolByLabel(m Metric, label string) (perftestTool, bool) {
	for _, t := range perftestTools {
		if t.Metric == m && t.Label() == label {
			return t, true
		}
	}
	return perftestTool{}, false
}

func (h *harness) lineBuffered(argv []string) []string {
	if h.stdbuf == "" {
		return argv
	}
	return append([]string{h.stdbuf, "-oL"}, argv...)
}

// ---- the client (-connect) ----

// remote is the client's end of the control connection.
type remote struct {
	ctl  *ctlConn
	peer string // the server's RDMA address
}

// dialControl connects to a server, retrying for up to wait (the server's
// host may still be starting), and exchanges the hellos.
func (h *harness) dialControl(ctx context.Context, addr string, wait time.Duration) (*remote, error) {
	deadline := time.Now().Add(wait)
	var c net.Conn
	var err error
	for {
		c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", addr)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("no rdmabench server at %s (start \"rdmabench -listen %s\" on the other host): %w", addr, addr, err)
	}
	ctl := newCtlConn(c)
	if err := ctl.send(h.localHello()); err != nil {
		c.Close()
		return nil, err
	}
	var rep ctlHelloReply
	if err := ctl.recv(&rep, 30*time.Second); err != nil {
		c.Close()
		return nil, fmt.Errorf("control %s: no answer to the hello (is it an rdmabench -listen?): %w", addr, err)
	}
	if rep.Error != "" {
		c.Close()
		return nil, fmt.Errorf("server %s refused: %s", addr, rep.Error)
	}
	return &remote{ctl: ctl, peer: rep.Addr}, nil
}

// start asks the server to start its side of a run.
func (r *remote) start(st ctlStart) (string, error) {
	st.Op = "start"
	if err := r.ctl.send(st); err != nil {
		return "", fmt.Errorf("control: %w", err)
	}
	var rd ctlReady
	if err := r.ctl.recv(&rd, 0); err != nil {
		return "", fmt.Errorf("control: %w", err)
	}
	if rd.Error != "" {
		return "", fmt.Errorf("server host: %s", rd.Error)
	}
	return rd.Ready, nil
}

// finish tells the server the client side is done and returns the server
// side's output.
func (r *remote) finish(clientFailed bool) (*ctlDone, error) {
	if err := r.ctl.send(ctlFinish{Op: "finish", ClientFailed: clientFailed}); err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	var d ctlDone
	if err := r.ctl.recv(&d, 0); err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	return &d, nil
}

// remoteErr describes a failed run with both sides' output.
func remoteErr(err error, d *ctlDone, procs ...*proc) error {
	var b strings.Builder
	b.WriteString(childErr(err, procs...).Error())
	if d != nil {
		fmt.Fprintf(&b, "\n  (server host) $ %s", d.Cmd)
		if d.Err != "" {
			fmt.Fprintf(&b, "\n  exit: %s", d.Err)
		}
		for _, o := range [][2]string{{"stderr", d.Stderr}, {"stdout", d.Stdout}} {
			if s := strings.TrimSpace(tail(o[1], 25)); s != "" {
				fmt.Fprintf(&b, "\n  %s:\n    %s", o[0], strings.ReplaceAll(s, "\n", "\n    "))
			}
		}
	}
	return errors.New(b.String())
}

// runOursRemote is runOurs with the server side on the server host.
func (h *harness) runOursRemote(ctx context.Context, a childArgs, kind string) (*Sample, error) {
	t0 := time.Now()
	addr, err := h.remote.start(ctlStart{Kind: kind, Case: a.caseName, Network: a.network, Size: a.size, Iters: a.iters, Warmup: a.warmup})
	if err != nil {
		return nil, err
	}
	h.vlogf(t0, "server ready on %s", addr)
	cli, err := startProc(ctx, h.timeout, h.clientCPU, append([]string{h.self, "-client", addr}, a.flags(h)...)...)
	if err != nil {
		h.remote.finish(true)
		return nil, err
	}
	defer cli.kill()
	cerr := cli.wait(h.timeout + 5*time.Second)
	h.vlogf(t0, "client exited: %v", cerr)
	d, err := h.remote.finish(cerr != nil)
	if err != nil {
		return nil, err
	}
	h.vlogf(t0, "server exited: %s", d.Err)
	if cerr != nil || d.Err != "" {
		return nil, remoteErr(fmt.Errorf("client: %v; server: %v", status(cli, cerr), map[bool]string{true: "ok", false: d.Err}[d.Err == ""]), d, cli)
	}
	return parseChildOutputs(d.Stdout, cli.stdout.String())
}

// parseChildOutputs reads the result and counters lines of the server's and
// the client's output.
func parseChildOutputs(server, client string) (*Sample, error) {
	var sample *Sample
	counters := map[string]float64{}
	for i, out := range []string{server, client} {
		for _, l := range strings.Split(out, "\n") {
			if js, ok := strings.CutPrefix(l, "result "); ok && sample == nil {
				var s Sample
				if err := json.Unmarshal([]byte(js), &s); err != nil {
					return nil, fmt.Errorf("bad result line %q: %w", l, err)
				}
				sample = &s
			}
			if js, ok := strings.CutPrefix(l, "counters "); ok {
				var m map[string]float64
				if err := json.Unmarshal([]byte(js), &m); err != nil {
					return nil, fmt.Errorf("bad counters line %q: %w", l, err)
				}
				side := [...]string{"server.", "client."}[i]
				for k, v := range m {
					counters[side+k] = v
				}
			}
		}
	}
	if sample == nil {
		return nil, fmt.Errorf("neither side reported a result")
	}
	if len(counters) > 0 {
		sample.Counters = counters
	}
	return sample, nil
}

// runPerftestRemote runs perftest's server on the server host and its client
// here, retrying as runPerftest does.
func (h *harness) runPerftestRemote(ctx context.Context, t perftestTool, size, iters int) (*Sample, error) {
	var err error
	for attempt := 1; attempt <= perftestAttempts; attempt++ {
		var s *Sample
		s, err = h.perftestRemoteOnce(ctx, t, size, iters)
		if err == nil {
			return s, nil
		}
		if ctx.Err() != nil || attempt == perftestAttempts || strings.HasPrefix(err.Error(), "control:") {
			break
		}
		h.logf("  note: %s attempt %d failed, retrying with a new server and client: %s", t.Cmd, attempt, firstLine(err.Error()))
	}
	return nil, err
}

func (h *harness) perftestRemoteOnce(ctx context.Context, t perftestTool, size, iters int) (*Sample, error) {
	t0 := time.Now()
	gid := 0
	if !t.rdmaCM() {
		var err error
		if gid, err = udGIDIndex(h.addr); err != nil {
			return nil, err
		}
	}
	port, err := h.remote.start(ctlStart{Kind: "perftest", Tool: t.Label(), Metric: t.Metric, Size: size, Iters: iters})
	if err != nil {
		return nil, err
	}
	h.vlogf(t0, "%s server listens on port %s", t.Cmd, port)
	argv := h.lineBuffered(append(t.args(size, iters, h.depth, gid), "-p", port, h.remote.peer))
	cli, err := startProc(ctx, h.timeout, h.clientCPU, argv...)
	if err != nil {
		h.remote.finish(true)
		return nil, err
	}
	defer cli.kill()
	// As perftestOnce: a UD client whose table is complete but that waits
	// for a lost datagram is killed after 5 s and its table used.
	tableDone := tablePrinted(cli, t.Metric, size)
	select {
	case <-cli.done:
	case <-tableDone:
		select {
		case <-cli.done:
		case <-time.After(5 * time.Second):
			cli.kill()
			<-cli.done
			h.logf("  note: %s client still running 5s after printing its table (a lost datagram?); killed, table used", t.Cmd)
		}
	}
	h.vlogf(t0, "%s client exited: %v", t.Cmd, cli.err)
	d, err := h.remote.finish(cli.err != nil)
	if err != nil {
		return nil, err
	}
	h.vlogf(t0, "%s server exited: %s", t.Cmd, d.Err)
	s, err := parsePerftest(cli.stdout.String(), t.Metric, size)
	if err == nil {
		return s, nil
	}
	s2, err2 := parsePerftest(d.Stdout, t.Metric, size)
	if err2 == nil {
		h.logf("  note: %s client's report unusable (%s); using the server's", t.Cmd, firstLine(status(cli, err)))
		return s2, nil
	}
	return nil, remoteErr(fmt.Errorf("%s: client: %w (%s); server: %w", t.Cmd, err, status(cli, cli.err), err2), d, cli)
}

// hostname for the report's context line.
func hostname() string {
	n, _ := os.Hostname()
	return n
}

// serverMain is -listen: it serves clients until interrupted and returns the
// exit status.
func (h *harness) serverMain(listen string) int {
	self, cleanup, err := privateCopy()
	if err != nil {
		fatalf("%v", err)
	}
	defer cleanup()
	h.self = self
	given := map[string]bool{}
	for _, f := range []string{"depth", "spin", "gomaxprocs"} {
		given[f] = flagGiven(f)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		h.logf("rdmabench server: -listen %s: %v", listen, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := h.serveControl(ctx, ln, given); err != nil {
		h.logf("rdmabench server: %v", err)
		return 1
	}
	return 0
}

// serveLoadRun serves a -load run in this process: a listener whose
// connections are served until the client's finish.
func (h *harness) serveLoadRun(c *ctlConn, st ctlStart) error {
	ln, err := listenLoad(st.Network, h.addr, rdmaConfig(h.depth, h.spin))
	if err != nil {
		return c.send(ctlReady{Error: fmt.Sprintf("load server: %v", err)})
	}
	defer ln.Close()
	var errs []string
	var mu sync.Mutex
	go serveLoadListener(ln, st.Case, func(format string, a ...any) {
		mu.Lock()
		errs = append(errs, fmt.Sprintf(format, a...))
		mu.Unlock()
	})
	h.logf("rdmabench server: load (%s) on %s", st.Network, ln.Addr())
	if err := c.send(ctlReady{Ready: ln.Addr().String()}); err != nil {
		return err
	}
	var fin ctlFinish
	if err := c.recv(&fin, 0); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	return c.send(ctlDone{Cmd: "load server on " + ln.Addr().String(), Err: strings.Join(errs, "; ")})
}
