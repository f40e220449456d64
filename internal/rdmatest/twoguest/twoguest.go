// Package twoguest runs tests across two hosts joined by a real wire.
//
// Soft-RoCE in one kernel loops traffic back inside rxe: no packet crosses a
// network device, so loss, reordering, partitions and a vanished peer host
// cannot be tested there. `scripts/softroce pair` boots two guests (A and B)
// joined by two virtio-net links: eth0, the wire, carries rxe0 and is what
// tests disturb with tc netem; eth1 is a control link that stays clean. Guest
// B runs an Agent (cmd twoguest-agent, port DefaultPort, reached over eth1);
// a test in guest A calls Require, which finds the agent, and then:
//
//   - runs programs on B (Env.StartSelf starts this test binary there, e.g.
//     as the other end of a connection; Client.Start any program), reads
//     their output and exit status, signals them (kill -9);
//   - disturbs the wire: Env.Netem (tc netem on both hosts' RDMA netdevs,
//     removed at the test's end; "loss 100%" is a partition);
//   - powers B off (Client.PowerOff: reboot(2) without sync, a pulled plug);
//   - reads both hosts' port counters (retransmissions, RNR) and RDMA object
//     counts (Counters, Resources).
//
// On two real hosts the same tests run with twoguest-agent -listen on host
// B and, on host A, RDMA_TEST_DEVICE, RDMA_TEST_ADDR and RDMA_TEST_NETDEV
// set for A's port, RDMA_TEST_PEER_ADDR to B's RDMA address and
// TWOGUEST_AGENT to the agent's host:port (the test binary must exist on B
// at the same path, StartSelf runs it there).
package twoguest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
)

// Env is the two-host environment of a test running on host A.
type Env struct {
	rdmatest.Env        // this host: RDMA device, its address and netdev
	PeerAddr     string // the other host's RDMA address (RDMA_TEST_PEER_ADDR)
	PeerDevice   string // its RDMA device, as its agent reports
	PeerNetdev   string // its RDMA netdev, as its agent reports
	Peer         *Client
}

// AgentAddr is where Require finds the peer's agent: TWOGUEST_AGENT, or
// port DefaultPort on SOFTROCE_PEER_CTL_ADDR (scripts/softroce pair sets it).
func AgentAddr() string {
	if a := os.Getenv("TWOGUEST_AGENT"); a != "" {
		return a
	}
	if h := os.Getenv("SOFTROCE_PEER_CTL_ADDR"); h != "" {
		return net.JoinHostPort(h, strconv.Itoa(DefaultPort))
	}
	return ""
}

var peerInfo struct {
	sync.Mutex
	info  map[string]string
	offBy string // the test that powered the peer off
}

// Require skips t unless it runs on host A of two hosts (RDMA_TEST_PEER_ADDR
// set: scripts/softroce pair, or by hand), and fails it if the peer's agent
// does not answer within a scaled minute (guest B boots alongside A).
// `make faults` fails if any test skipped.
func Require(t testing.TB) *Env {
	t.Helper()
	peer := os.Getenv("RDMA_TEST_PEER_ADDR")
	if peer == "" {
		t.Skip("needs two hosts joined by a wire: run through scripts/softroce pair (make faults does)")
	}
	env := rdmatest.Require(t)
	addr := AgentAddr()
	if addr == "" {
		t.Fatal("RDMA_TEST_PEER_ADDR is set but not where the peer's agent listens: set TWOGUEST_AGENT=host:port (twoguest-agent -listen on the peer)")
	}
	c := &Client{Addr: addr}
	peerInfo.Lock()
	defer peerInfo.Unlock()
	if peerInfo.offBy != "" {
		t.Fatalf("the peer host is off: %s powered it off (a test that does must run last)", peerInfo.offBy)
	}
	if peerInfo.info == nil {
		ctx, cancel := context.WithTimeout(context.Background(), max(rdmatest.Scale(10*time.Second), time.Minute))
		defer cancel()
		info, err := c.WaitReady(ctx)
		if err != nil {
			t.Fatalf("the peer's agent: %v (is twoguest-agent running on the peer? make faults starts it in guest B)", err)
		}
		if info["RDMA_TEST_ADDR"] != peer {
			t.Fatalf("the agent at %s is on a host whose RDMA address is %q, not RDMA_TEST_PEER_ADDR %q", addr, info["RDMA_TEST_ADDR"], peer)
		}
		// The wire too, before the first test uses it: soon after boot
		// the guests' wire may still drop most frames while the control
		// link answers, and the first test's dial would time out for the
		// environment's sake.
		e := &Env{Env: env, PeerAddr: peer, Peer: c}
		start := time.Now()
		if err := e.WireUp(ctx); err != nil {
			t.Fatalf("%v: the guests' network carries no traffic between the RDMA addresses (not the library: see ip -s link on both)", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Logf("the wire to %s carried traffic %v after the agent answered", peer, d.Round(time.Millisecond))
		}
		peerInfo.info = info
	}
	e := &Env{Env: env, PeerAddr: peer, PeerDevice: peerInfo.info["RDMA_TEST_DEVICE"],
		PeerNetdev: peerInfo.info["RDMA_TEST_NETDEV"], Peer: c}
	t.Cleanup(func() {
		if t.Failed() {
			e.logWireState(t)
		}
	})
	return e
}

// logWireState logs both hosts' view of the wire (link counters, qdiscs,
// neighbours, the kernel's last messages) for a failed test: the wire can
// stop carrying one side's packets while the control link answers, and a
// failure should say where.
func (e *Env) logWireState(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), ctlTimeout())
	defer cancel()
	for _, host := range []struct {
		name, dev string
		run       func(args ...string) (string, error)
	}{
		{"this host", e.Netdev, func(args ...string) (string, error) {
			out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
			return string(out), err
		}},
		{"the peer", e.PeerNetdev, func(args ...string) (string, error) { return e.Peer.Run(ctx, args...) }},
	} {
		peerInfo.Lock()
		off := peerInfo.offBy != ""
		peerInfo.Unlock()
		if host.dev == "" || off && host.name == "the peer" {
			continue
		}
		for _, cmd := range [][]string{
			{"ip", "-s", "link", "show", "dev", host.dev},
			{"tc", "-s", "qdisc", "show", "dev", host.dev},
			{"ip", "neigh", "show", "dev", host.dev},
			{"dmesg"},
		} {
			out, err := host.run(cmd...)
			if cmd[0] == "dmesg" {
				lines := strings.Split(strings.TrimSpace(out), "\n")
				out = strings.Join(lines[max(0, len(lines)-20):], "\n")
			}
			t.Logf("wire state, %s: %s (%v):\n%s", host.name, strings.Join(cmd, " "), err, out)
		}
	}
}

// PowerOff cuts the peer host's power (Client.PowerOff) and fails t if the
// agent does not confirm. Later calls of Require fail: the peer is gone
// for the rest of the test binary's run.
func (e *Env) PowerOff(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ctlTimeout())
	defer cancel()
	peerInfo.Lock()
	peerInfo.offBy = t.Name()
	peerInfo.Unlock()
	if err := e.Peer.PowerOff(ctx); err != nil {
		t.Fatal(err)
	}
}

// WireUp waits until the wire carries IP traffic both ways again (after a
// partition heals): it reaches the peer's agent through the peer's RDMA
// address, over the wire, rather than the control link. The agent listens
// on every address for this (twoguest-agent's default). An RDMA dial in the
// first seconds after healing can otherwise meet a neighbour (ARP) entry
// the partition left failed: the kernel's state, not the library's.
func (e *Env) WireUp(ctx context.Context) error {
	_, port, err := net.SplitHostPort(e.Peer.Addr)
	if err != nil {
		return err
	}
	c := &Client{Addr: net.JoinHostPort(e.PeerAddr, port)}
	if _, err := c.WaitReady(ctx); err != nil {
		return fmt.Errorf("the wire to %s is not up: %w", e.PeerAddr, err)
	}
	return nil
}

// ctlTimeout bounds one control action (a tc or rdma command on either host).
func ctlTimeout() time.Duration { return max(rdmatest.Scale(5*time.Second), 30*time.Second) }

// Netem sets netem with args (tc-netem(8): "loss 3%", "delay 1ms reorder 1%",
// "loss 100%" for a partition) on both hosts' RDMA netdevs, each direction of
// the wire, and removes it at t's end (or at an earlier ClearNetem).
func (e *Env) Netem(t testing.TB, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ctlTimeout())
	defer cancel()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), ctlTimeout())
		defer cancel()
		if err := e.ClearNetem(ctx); err != nil {
			t.Error(err)
		}
	})
	if err := e.SetNetem(ctx, args...); err != nil {
		t.Fatal(err)
	}
}

// SetNetem sets netem with args on both hosts' RDMA netdevs (this host's
// first, then the peer's).
func (e *Env) SetNetem(ctx context.Context, args ...string) error {
	if err := e.LocalNetem(ctx, args...); err != nil {
		return err
	}
	return e.PeerNetem(ctx, args...)
}

// ClearNetem removes netem from both hosts' RDMA netdevs.
func (e *Env) ClearNetem(ctx context.Context) error {
	err1 := e.LocalNetem(ctx)
	err2 := e.PeerNetem(ctx)
	if err1 != nil {
		return err1
	}
	return err2
}

// LocalNetem sets netem with args on this host's RDMA netdev, or removes it
// if args is empty (the packets this host sends).
func (e *Env) LocalNetem(ctx context.Context, args ...string) error {
	cmd := netemCmd(e.Netdev, args)
	if cmd == nil {
		out, err := exec.CommandContext(ctx, "tc", "qdisc", "show", "dev", e.Netdev).CombinedOutput()
		if err != nil {
			return fmt.Errorf("tc qdisc show dev %s: %w: %s", e.Netdev, err, out)
		}
		if !strings.Contains(string(out), "netem") {
			return nil
		}
		cmd = []string{"tc", "qdisc", "del", "dev", e.Netdev, "root"}
	}
	if out, err := exec.CommandContext(ctx, cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(cmd, " "), err, out)
	}
	return nil
}

// PeerNetem sets netem with args on the peer's RDMA netdev, or removes it if
// args is empty (the packets the peer sends).
func (e *Env) PeerNetem(ctx context.Context, args ...string) error {
	cmd := netemCmd(e.PeerNetdev, args)
	if cmd == nil {
		out, err := e.Peer.Run(ctx, "tc", "qdisc", "show", "dev", e.PeerNetdev)
		if err != nil {
			return err
		}
		if !strings.Contains(out, "netem") {
			return nil
		}
		cmd = []string{"tc", "qdisc", "del", "dev", e.PeerNetdev, "root"}
	}
	_, err := e.Peer.Run(ctx, cmd...)
	return err
}

func netemCmd(dev string, args []string) []string {
	if len(args) == 0 {
		return nil
	}
	return append([]string{"tc", "qdisc", "replace", "dev", dev, "root", "netem"}, args...)
}

// StartSelf starts this test binary on the peer, in this process's working
// directory, with env added (KEY=value: what makes its TestMain play a
// role) and args (e.g. -test.run=^$). At t's end the process is killed if
// it still runs, and its output is logged if t failed.
func (e *Env) StartSelf(t testing.TB, env []string, args ...string) *Proc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ctlTimeout())
	defer cancel()
	p, err := e.Peer.Start(ctx, Cmd{Args: append([]string{exe}, args...), Env: env, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), ctlTimeout())
		defer cancel()
		st, err := p.Status(ctx)
		if err != nil {
			t.Logf("%v: %v", p, err) // e.g. the peer was powered off
			return
		}
		if !st.Exited {
			p.Signal(ctx, syscall.SIGKILL)
			st, _ = p.Wait(ctx)
		}
		if t.Failed() {
			t.Logf("%v ended (%v); its output:\n%s", p, st, st.Output)
		}
	})
	return p
}

// Counters are an RDMA port's statistics, by name (rxe: sent_pkts,
// rcvd_seq_err, completer_retry_err, rcvd_rnr_err, ...).
type Counters map[string]uint64

// ParseCounters reads `rdma statistic show link DEV/PORT` output.
func ParseCounters(out string) (Counters, error) {
	f := strings.Fields(out)
	i := 0
	for i < len(f) && f[i] != "link" {
		i++
	}
	if i+1 >= len(f) {
		return nil, fmt.Errorf("no link in rdma statistic output %q", out)
	}
	c := Counters{}
	for i += 2; i+1 < len(f); i += 2 {
		v, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("rdma statistic: counter %s: %w", f[i], err)
		}
		c[f[i]] = v
	}
	if len(c) == 0 {
		return nil, fmt.Errorf("no counters in rdma statistic output %q", out)
	}
	return c, nil
}

// Sub returns c - base, counter by counter.
func (c Counters) Sub(base Counters) Counters {
	d := Counters{}
	for k, v := range c {
		d[k] = v - base[k]
	}
	return d
}

// RNR sums the receiver-not-ready counters (sent, received, retries exceeded).
func (c Counters) RNR() uint64 {
	var n uint64
	for k, v := range c {
		if strings.Contains(k, "rnr") {
			n += v
		}
	}
	return n
}

// Retransmissions counts the times the requester went back to resend
// (rxe's completer_retry_err: after a sequence-error NAK or a timeout).
func (c Counters) Retransmissions() uint64 { return c["completer_retry_err"] }

// LocalCounters reads port 1 of this host's device.
func (e *Env) LocalCounters(ctx context.Context) (Counters, error) {
	out, err := exec.CommandContext(ctx, "rdma", "statistic", "show", "link", e.Device+"/1").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("rdma statistic show link %s/1: %w: %s", e.Device, err, out)
	}
	return ParseCounters(string(out))
}

// PeerCounters reads port 1 of the peer's device.
func (e *Env) PeerCounters(ctx context.Context) (Counters, error) {
	out, err := e.Peer.Run(ctx, "rdma", "statistic", "show", "link", e.PeerDevice+"/1")
	if err != nil {
		return nil, err
	}
	return ParseCounters(out)
}

// ParseResources reads device's summary line of `rdma resource show`
// ("0: rxe0: pd 1 cq 2 qp 1 cm_id 0 mr 0 ctx 0 srq 0"): the objects that
// exist on the device, every process's together.
func ParseResources(out, device string) (map[string]int, error) {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[1] != device+":" {
			continue
		}
		res := map[string]int{}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.Atoi(f[i+1])
			if err != nil {
				return nil, fmt.Errorf("rdma resource show: %s %q: %w", f[i], f[i+1], err)
			}
			res[f[i]] = v
		}
		return res, nil
	}
	return nil, fmt.Errorf("no device %s in rdma resource show output %q", device, out)
}

// LocalResources counts the objects on this host's device.
func (e *Env) LocalResources(ctx context.Context) (map[string]int, error) {
	out, err := exec.CommandContext(ctx, "rdma", "resource", "show").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("rdma resource show: %w: %s", err, out)
	}
	return ParseResources(string(out), e.Device)
}

// PeerResources counts the objects on the peer's device.
func (e *Env) PeerResources(ctx context.Context) (map[string]int, error) {
	out, err := e.Peer.Run(ctx, "rdma", "resource", "show")
	if err != nil {
		return nil, err
	}
	return ParseResources(out, e.PeerDevice)
}
