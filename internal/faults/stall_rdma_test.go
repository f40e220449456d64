//go:build linux && cgo

package faults

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/rdmatest/twoguest"
)

// A stalled exchange (such as a rendezvous waiting forever on Soft-RoCE
// without the bind rule in post.go: docs/reliability.md) is caught while it is stuck,
// not when its generous transfer bound runs out: exchangeMessages counts
// its steps in progress, and a watchdog that sees none for -faults.stall
// dumps both sides (queue pairs, counters, connection stats, goroutines)
// and fails the test.
var (
	stallFlag = flag.Duration("faults.stall", 0, "fail an exchange that makes no progress for this long, with a dump of both sides (0: a scaled 6 s)")
	progress  atomic.Int64 // steps of exchangeMessages: a message or notification taken, a send or write posted
)

func stallAfter() time.Duration {
	if *stallFlag > 0 {
		return *stallFlag
	}
	return rdmatest.Scale(6 * time.Second)
}

// peerConn is the connection of host B's process (runPeer), for its
// SIGUSR1 handler: it prints the connection's stats as a STATS line.
var peerConn atomic.Pointer[rdma.Conn]

func init() {
	if os.Getenv("FAULTS_PEER") == "" {
		return
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		for sig := range ch {
			if sig == syscall.SIGUSR2 {
				fmt.Printf("KICK at SIGUSR2: %v\n", doKick())
				continue
			}
			if c := peerConn.Load(); c != nil {
				fmt.Printf("STATS at SIGUSR1: %+v\n", c.Stats())
			}
		}
	}()
}

// kick posts one more work request on a stalled connection: a 1-byte
// one-sided write into the last byte of the peer's export (no write of
// the exchange reaches it, none checks it). Posting runs rxe's requester
// in the caller's context: if a stalled send queue moves again after it,
// the requester had work but was never rescheduled (a lost wakeup).
var kick atomic.Pointer[func() error]

func setKick(c *rdma.Conn, r rdma.RemoteBuf) {
	f := func() error {
		b, err := c.Alloc(1)
		if err != nil {
			return err
		}
		defer b.Release()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		start := time.Now()
		err = c.WriteRemote(ctx, b, r, slots*slotSize-1)
		return fmt.Errorf("posted, completed after %v: %w", time.Since(start).Round(time.Millisecond), err)
	}
	kick.Store(&f)
}

// doKick runs kick and returns its result, or says that the write did
// not complete within 10 s.
func doKick() string {
	f := kick.Load()
	if f == nil {
		return "no peer export known yet"
	}
	ch := make(chan error, 1)
	go func() { ch <- (*f)() }()
	select {
	case err := <-ch:
		return err.Error()
	case <-time.After(10 * time.Second):
		return "the 1-byte write did not complete in 10 s"
	}
}

// watchStall runs exchange, which must return once ctx ends, and fails t
// with a dump of both sides if progress stands still for stallAfter.
func watchStall(t *testing.T, env *twoguest.Env, c *rdma.Conn, p *twoguest.Proc, ctx context.Context, name string,
	exchange func(context.Context) (msgResult, error)) (msgResult, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		r   msgResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := exchange(ctx)
		done <- result{r, err}
	}()
	last, since := progress.Load(), time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			return r.r, r.err
		case <-tick.C:
		}
		if n := progress.Load(); n != last {
			last, since = n, time.Now()
			continue
		}
		if time.Since(since) < stallAfter() {
			continue
		}
		// A step can take long (a 1 MiB rendezvous read under loss is
		// re-requested from the first lost packet on): stuck means the
		// wire is quiet too, at most a keepalive probe's few packets.
		if moved := packetsMoved(env, 5*time.Second); moved >= 50 {
			t.Logf("%s: no step for %v but %d packets in 5 s: slow, not stuck", name, time.Since(since).Round(time.Second), moved)
			since = time.Now()
			continue
		}
		t.Errorf("%s: no progress for %v (after %d steps) and the wire quiet: dumping both sides", name, stallAfter(), last)
		dumpStall(t, env, c, p)
		cancel()
		r := <-done
		if r.err == nil {
			r.err = errors.New("it ended during the dump")
		}
		return r.r, fmt.Errorf("stalled for %v: %w", stallAfter(), r.err)
	}
}

// packetsMoved counts the packets this host's port sent and received in d.
func packetsMoved(env *twoguest.Env, d time.Duration) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	before, err := env.LocalCounters(ctx)
	if err != nil {
		return 0
	}
	time.Sleep(d)
	after, err := env.LocalCounters(ctx)
	if err != nil {
		return 0
	}
	return after["sent_pkts"] + after["rcvd_pkts"] - before["sent_pkts"] - before["rcvd_pkts"]
}

// dumpStall logs what a stuck exchange is waiting for: this side's
// connection stats and goroutines, both hosts' queue pairs (PSNs, state)
// and port counters twice 5 s apart (do they still move?), then the
// peer's connection stats (SIGUSR1) and goroutines (SIGQUIT: it ends).
func dumpStall(t *testing.T, env *twoguest.Env, c *rdma.Conn, p *twoguest.Proc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range 2 {
		if i > 0 {
			time.Sleep(5 * time.Second)
		}
		here, _ := exec.CommandContext(ctx, "rdma", "-d", "resource", "show", "qp").CombinedOutput()
		peer, err := env.Peer.Run(ctx, "rdma", "-d", "resource", "show", "qp")
		cs := bothCounters(t, env)
		t.Logf("stall dump %d: connection stats here %+v\nQPs here:\n%s\nQPs on the peer (%v):\n%s\ncounters here %v\npeer %v",
			i, c.Stats(), here, err, peer, cs.here, cs.peer)
	}
	// The experiment: post one more request on each side, then look again.
	before := progress.Load()
	if err := p.Signal(ctx, syscall.SIGUSR2); err != nil {
		t.Logf("SIGUSR2 to %v: %v", p, err)
	}
	t.Logf("stall dump: kick here (a 1-byte write posted): %s", doKick())
	time.Sleep(5 * time.Second)
	here, _ := exec.CommandContext(ctx, "rdma", "-d", "resource", "show", "qp").CombinedOutput()
	peer, err := env.Peer.Run(ctx, "rdma", "-d", "resource", "show", "qp")
	cs := bothCounters(t, env)
	t.Logf("stall dump after the kick: steps %d -> %d; connection stats here %+v\nQPs here:\n%s\nQPs on the peer (%v):\n%s\ncounters here %v\npeer %v",
		before, progress.Load(), c.Stats(), here, err, peer, cs.here, cs.peer)
	var buf bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&buf, 2)
	t.Logf("stall dump: goroutines here:\n%s", relevantGoroutines(buf.String()))
	if err := p.Signal(ctx, syscall.SIGUSR1); err != nil {
		t.Logf("SIGUSR1 to %v: %v", p, err)
	}
	time.Sleep(time.Second)
	if err := p.Signal(ctx, syscall.SIGQUIT); err != nil {
		t.Logf("SIGQUIT to %v: %v", p, err)
	}
	st, err := p.Wait(ctx)
	t.Logf("stall dump: the peer (%v, %v), its output with its goroutines:\n%s", st, err, relevantGoroutines(st.Output))
}

// relevantGoroutines drops, from a goroutine dump, the goroutines that are
// only the test framework's or the runtime's.
func relevantGoroutines(dump string) string {
	var out []string
	for _, g := range strings.Split(dump, "\n\n") {
		if strings.HasPrefix(g, "goroutine ") && (!strings.Contains(g, "verbline/rdma") || strings.Contains(g, "faults.dumpStall")) {
			continue
		}
		out = append(out, g)
	}
	return strings.Join(out, "\n\n")
}
