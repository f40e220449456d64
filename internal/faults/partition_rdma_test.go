//go:build linux && cgo

package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/rdmatest/baseline"
	"github.com/verbline/rdma/internal/rdmatest/twoguest"
)

// The keepalive settings of the partition and power-off tests: a dead peer
// is detected within KeepAlive + AckTimeout x (RetryCount + 1).
const liveKeepAlive = 2 * time.Second

func liveConfig() rdma.Config {
	cfg := testConfig()
	cfg.KeepAlive = liveKeepAlive
	return cfg
}

// detectionBound is liveConfig's bound, with the ACK timeout rounded up
// as devices count it (4.096 µs x 2^n).
func detectionBound() time.Duration {
	cfg := liveConfig()
	ack := 4096 * time.Nanosecond
	for ack < cfg.AckTimeout {
		ack *= 2
	}
	retries := cfg.RetryCount
	if retries == 0 {
		retries = 6
	}
	return cfg.KeepAlive + ack*time.Duration(retries+1)
}

// The three connections of a blocked set, each with one call blocked on
// each side: a Read with nothing coming, a Write waiting for credit from a
// peer that never reads, a Recv with no message coming.
var blockedKinds = []string{"Read", "Write", "Recv"}

// blockedSet is one side's three connections and their blocked calls.
type blockedSet struct {
	conns    map[string]*rdma.Conn
	returned chan blockedCall // one per call, as it returns
}

type blockedCall struct {
	kind string
	err  error
	at   time.Time
}

// block starts the blocked calls on the three connections and returns once
// each is blocked: the Write once its work requests stopped (its credit is
// spent; a keepalive probe is the only thing this side still sends).
func block(conns map[string]*rdma.Conn) (*blockedSet, error) {
	b := &blockedSet{conns: conns, returned: make(chan blockedCall, len(blockedKinds))}
	for _, kind := range blockedKinds {
		c := conns[kind]
		go func() {
			var err error
			switch kind {
			case "Read":
				_, err = c.Read(make([]byte, 100))
			case "Write":
				_, err = c.Write(make([]byte, 64<<20))
			case "Recv":
				if m, rerr := c.Recv(context.Background()); rerr != nil {
					err = rerr
				} else {
					m.Release()
					err = errors.New("a message arrived")
				}
			}
			b.returned <- blockedCall{kind, err, time.Now()}
		}()
	}
	w := conns["Write"]
	sent := func() uint64 { st := w.Stats(); return st.SendWRs - st.KeepaliveProbes }
	deadline := time.Now().Add(rdmatest.Scale(20 * time.Second))
	for last, still := sent(), 0; still < 5; {
		time.Sleep(100 * time.Millisecond)
		if n := sent(); n != last || n == 0 {
			last, still = n, 0
		} else {
			still++
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the Write did not stop for credit in %v", rdmatest.Scale(20*time.Second))
		}
	}
	return b, nil
}

// dialBlocked dials the three connections of a blocked set (the first
// byte on each names its kind; the acceptor reads it).
func dialBlocked(ctx context.Context, addr string) (map[string]*rdma.Conn, error) {
	d := rdma.Dialer{Config: liveConfig()}
	conns := map[string]*rdma.Conn{}
	for i, kind := range blockedKinds {
		nc, err := d.DialContext(ctx, "rdma", addr)
		if err != nil {
			return nil, err
		}
		conns[kind] = nc.(*rdma.Conn)
		if _, err := nc.Write([]byte{byte(i)}); err != nil {
			return nil, err
		}
	}
	return conns, nil
}

// acceptBlocked accepts the three connections dialBlocked makes.
func acceptBlocked(t *testing.T, ln *rdma.Listener, p *twoguest.Proc) map[string]*rdma.Conn {
	t.Helper()
	conns := map[string]*rdma.Conn{}
	for range blockedKinds {
		c := accept(t, ln, p, rdmatest.Scale(30*time.Second))
		t.Cleanup(func() { c.Close() })
		var b [1]byte
		if _, err := io.ReadFull(c, b[:]); err != nil || int(b[0]) >= len(blockedKinds) {
			t.Fatalf("first byte %d, %v", b[0], err)
		}
		conns[blockedKinds[b[0]]] = c
	}
	return conns
}

// The peer's side of a blocked set: it prints READY once its calls are
// blocked, then "RETURNED kind timeout error" as each returns.
func init() {
	peerRoles["blocked"] = func(ctx context.Context, addr string) (any, error) {
		conns, err := dialBlocked(ctx, addr)
		if err != nil {
			return nil, err
		}
		b, err := block(conns)
		if err != nil {
			return nil, err
		}
		fmt.Println("READY")
		out := map[string]string{}
		for range blockedKinds {
			r := <-b.returned
			fmt.Printf("RETURNED %s %v %v\n", r.kind, isTimedOut(r.err) == nil, r.err)
			out[r.kind] = fmt.Sprint(r.err)
		}
		for _, c := range conns {
			c.Close()
		}
		return out, nil
	}
}

// isTimedOut returns nil if err is what a dead peer gives: a *net.OpError
// wrapping ETIMEDOUT, a timeout, worded as TCP's.
func isTimedOut(err error) error {
	var oe *net.OpError
	if !errors.As(err, &oe) || !errors.Is(err, syscall.ETIMEDOUT) || !oe.Timeout() ||
		!strings.Contains(err.Error(), "connection timed out") {
		return fmt.Errorf("got %w (%T), want a *net.OpError wrapping ETIMEDOUT, \"connection timed out\"", err, err)
	}
	return nil
}

// peerWatch is what poll has seen of p's output (read over the undisturbed
// control link): READY, and each RETURNED line when it first appeared.
type peerWatch struct {
	mu       sync.Mutex
	ready    bool
	returned map[string]time.Time // kind: when first seen
	lines    map[string]string
	ended    bool
}

func (w *peerWatch) poll(ctx context.Context, p *twoguest.Proc) error {
	st, err := p.Status(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ended = st.Exited
	for _, line := range strings.Split(st.Output, "\n") {
		if line == "READY" {
			w.ready = true
		}
		if rest, ok := strings.CutPrefix(line, "RETURNED "); ok {
			kind, _, _ := strings.Cut(rest, " ")
			if _, seen := w.returned[kind]; !seen {
				w.returned[kind] = now
				w.lines[kind] = rest
			}
		}
	}
	if st.Exited && st.Code != 0 {
		return fmt.Errorf("%v: %v; output:\n%s", p, st, st.Output)
	}
	return nil
}

// TestPartition: a full partition (100% loss both ways) outlasting the
// keepalive bound, with a Read, a Write waiting for credit and a Recv
// blocked on each side: all six return within the bound with a timeout
// wrapping ETIMEDOUT; nothing hangs; Close returns. After healing, the
// same Listener serves a new dial, and neither host holds an RDMA object
// more than before.
func TestPartition(t *testing.T) {
	env := twoguest.Require(t)
	base, baseG := baseline.Take(t, env.Env)
	peerBase := peerResources(t, env)
	ln := listenWith(t, env, liveConfig())
	p := startPeer(t, env, "blocked", "live", ln)
	mine, err := block(acceptBlocked(t, ln, p))
	if err != nil {
		t.Fatal(err)
	}
	w := &peerWatch{returned: map[string]time.Time{}, lines: map[string]string{}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	waitPeer(t, ctx, p, w, func() bool { return w.ready }, "its calls to block")

	bound := detectionBound()
	start := time.Now()
	if err := env.LocalNetem(ctx, "loss", "100%"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.ClearNetem(context.Background()) })
	if err := env.PeerNetem(ctx, "loss", "100%"); err != nil {
		t.Fatal(err)
	}
	t.Logf("partitioned (netem loss 100%% on both hosts' %s) in %v; detection bound %v", env.Netdev, time.Since(start), bound)
	limit := bound + rdmatest.Scale(time.Second) // scheduling slack: the guests are emulated
	checkReturned(t, mine, start, limit)
	waitPeer(t, ctx, p, w, func() bool { return len(w.returned) == len(blockedKinds) }, "its calls to return")
	for _, kind := range blockedKinds {
		took := w.returned[kind].Sub(start)
		t.Logf("peer's %s returned within %v: %s", kind, took.Round(time.Millisecond), w.lines[kind])
		if !strings.HasPrefix(w.lines[kind], kind+" true ") {
			t.Errorf("peer's %s: %s; want a *net.OpError wrapping ETIMEDOUT", kind, w.lines[kind])
		}
		if took > limit {
			t.Errorf("peer's %s took %v to notice, more than the bound %v plus slack", kind, took, bound)
		}
	}
	closeAll(t, mine)
	var res map[string]string
	peerResult(t, ctx, p, &res)

	if err := env.ClearNetem(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("healed after %v", time.Since(start).Round(time.Millisecond))
	// The first dial can meet the neighbour entry the partition left failed
	// (the kernel's ARP state; see twoguest.Env.WireUp): wait for IP first.
	if err := env.WireUp(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("IP over the wire works again after %v", time.Since(start).Round(time.Millisecond))
	serveEcho(t, env, ln)
	ln.Close()
	rdmatest.CheckNoLeaks(t, base, baseG)
	checkPeerResources(t, env, peerBase)
}

// checkReturned waits for this side's three blocked calls and checks each
// returned a timeout wrapping ETIMEDOUT within limit of start.
func checkReturned(t *testing.T, b *blockedSet, start time.Time, limit time.Duration) {
	t.Helper()
	for range blockedKinds {
		select {
		case r := <-b.returned:
			took := r.at.Sub(start)
			t.Logf("%s returned after %v: %v", r.kind, took.Round(time.Millisecond), r.err)
			if err := isTimedOut(r.err); err != nil {
				t.Errorf("%s: %v", r.kind, err)
			}
			if took > limit {
				t.Errorf("%s took %v to notice, more than %v", r.kind, took, limit)
			}
		case <-time.After(limit + rdmatest.Scale(10*time.Second) - time.Since(start)):
			t.Fatalf("calls still blocked %v after the peer became unreachable", time.Since(start))
		}
	}
}

// closeAll closes a blocked set's connections; each Close must return
// within its CloseTimeout (plus slack) though the peer is unreachable.
func closeAll(t *testing.T, b *blockedSet) {
	t.Helper()
	for _, kind := range blockedKinds {
		start := time.Now()
		err := b.conns[kind].Close()
		took := time.Since(start)
		t.Logf("Close of the %s connection: %v after %v", kind, err, took.Round(time.Millisecond))
		if limit := liveConfig().CloseTimeout + rdmatest.Scale(time.Second); took > limit {
			t.Errorf("Close took %v, more than %v", took, limit)
		}
	}
}

// waitPeer polls the peer's output until cond holds.
func waitPeer(t *testing.T, ctx context.Context, p *twoguest.Proc, w *peerWatch, cond func() bool, what string) {
	t.Helper()
	for {
		if err := w.poll(ctx, p); err != nil {
			t.Fatal(err)
		}
		w.mu.Lock()
		ok, ended := cond(), w.ended
		w.mu.Unlock()
		if ok {
			return
		}
		if ended {
			st, _ := p.Status(ctx)
			t.Fatalf("%v ended before %s: %v; output:\n%s", p, what, st, st.Output)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %v: %s: %v", p, what, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestPeerPowerOff: the peer's host loses power (reboot(2) without sync:
// nothing tells this host) while a Read, a Write waiting for credit and a
// Recv are blocked here: they return within the keepalive bound with a
// timeout wrapping ETIMEDOUT, and the Listener still serves (a dial from
// this host). The peer host is gone after it: this must be the last test
// (the last in the last file; twoguest.Require fails any test after it).
func TestPeerPowerOff(t *testing.T) {
	env := twoguest.Require(t)
	base, baseG := baseline.Take(t, env.Env)
	ln := listenWith(t, env, liveConfig())
	p := startPeer(t, env, "blocked", "live", ln)
	mine, err := block(acceptBlocked(t, ln, p))
	if err != nil {
		t.Fatal(err)
	}
	w := &peerWatch{returned: map[string]time.Time{}, lines: map[string]string{}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	waitPeer(t, ctx, p, w, func() bool { return w.ready }, "its calls to block")

	bound := detectionBound()
	env.PowerOff(t)
	start := time.Now()
	t.Logf("peer host powered off; detection bound %v", bound)
	checkReturned(t, mine, start, bound+rdmatest.Scale(time.Second))
	closeAll(t, mine)

	// The listener still serves: a dial from this host.
	c, err := (&rdma.Dialer{Config: liveConfig()}).DialContext(ctx, "rdma", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial the listener after the peer's power-off: %v", err)
	}
	s, err := ln.AcceptRDMA()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(s, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	s.Close()
	ln.Close()
	rdmatest.CheckNoLeaks(t, base, baseG)
}
