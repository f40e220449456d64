//go:build linux && cgo

package rdma

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/verbs"
)

// silence makes c's peer vanish as a host that lost power does: c's QP
// goes to ERR without a disconnect, so the device drops whatever arrives
// for it and acknowledges nothing, and nothing tells the peer.
func silence(t *testing.T, c *Conn) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.ep.qp.Modify(&verbs.QPAttr{State: verbs.StateErr}, verbs.AttrState, c.ep.lim); err != nil {
		t.Fatal(err)
	}
}

// peerEndsAtOnce checks what a silenced peer (its QP moved to ERR) does
// to c on iWARP, where that cannot stand for a vanished host: the peer's
// device closes the TCP connection, so c's calls fail at once with
// ECONNRESET, and a write before Close is reported lost (a vanished host
// is noticed only by TCP's retransmission timeout: docs/devices.md).
func peerEndsAtOnce(t *testing.T, c *Conn) {
	t.Helper()
	start := time.Now()
	_, err := c.Read(make([]byte, 16))
	t.Logf("Read after the peer's QP failed (iWARP): %v after %v", err, time.Since(start))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("Read: %v, want ECONNRESET", err)
	}
	_, werr := c.Write([]byte("lost"))
	cerr := c.Close()
	t.Logf("then Write: %v, Close: %v", werr, cerr)
	if werr == nil && cerr == nil {
		t.Fatal("a write to a peer that ended the connection was not reported lost")
	}
}

// checkTimedOut checks that err is what a dead peer gives: a *net.OpError
// wrapping ETIMEDOUT, a timeout, worded as TCP's.
func checkTimedOut(t *testing.T, what string, err error) {
	t.Helper()
	var oe *net.OpError
	if !errors.As(err, &oe) || !errors.Is(err, syscall.ETIMEDOUT) || !oe.Timeout() ||
		!strings.Contains(err.Error(), "connection timed out") {
		t.Errorf("%s: got %v (%T), want a *net.OpError wrapping ETIMEDOUT, \"connection timed out\"", what, err, err)
	}
}

// A peer that vanishes is detected by the keepalive within KeepAlive +
// AckTimeout x (RetryCount + 1): a blocked Read, a Write waiting for
// credit and a blocked Recv all return a timeout wrapping ETIMEDOUT.
// (iWARP: peerEndsAtOnce.)
func TestKeepaliveDetectsVanishedPeer(t *testing.T) {
	cfg := &Config{KeepAlive: rdmatest.Scale(300 * time.Millisecond), AckTimeout: 30 * time.Millisecond,
		RetryCount: 3, RecvBuffers: 8, BufferSize: 4096}
	client, server, ln := connPair(t, cfg)
	defer ln.Close()
	defer server.Close()
	defer client.Close()
	if client.dev.Caps.CMConnectsQP {
		silence(t, server)
		peerEndsAtOnce(t, client)
		return
	}
	timeout := ackTimeoutOf(client.ep.ackTimeoutSet)
	bound := cfg.KeepAlive + timeout*time.Duration(cfg.RetryCount+1)
	t.Logf("QP ack timeout %v (n=%d), retries %d: detection bound %v", timeout, client.ep.ackTimeoutSet, cfg.RetryCount, bound)

	type result struct {
		what string
		err  error
		at   time.Time
	}
	res := make(chan result, 3)
	go func() {
		_, err := client.Read(make([]byte, 100))
		res <- result{"Read", err, time.Now()}
	}()
	go func() {
		_, err := client.Recv(context.Background())
		res <- result{"Recv", err, time.Now()}
	}()
	// The server never reads: the write fills its 8 buffers, then waits for credit.
	go func() {
		_, err := client.Write(make([]byte, 64*4096))
		res <- result{"Write", err, time.Now()}
	}()
	waitFor(t, "the writer to run out of credit", func() bool {
		client.mu.Lock()
		defer client.mu.Unlock()
		return client.stream.credits <= 1 && client.sqUsedLocked() == 0 && client.stream.sendSeq > 0
	})
	// Everything the client sent is acknowledged: only a probe can find out now.
	start := time.Now()
	silence(t, server)
	for range 3 {
		select {
		case r := <-res:
			took := r.at.Sub(start)
			t.Logf("%s returned after %v: %v", r.what, took, r.err)
			checkTimedOut(t, r.what, r.err)
			// Scheduling slack on top of the bound: the guest is emulated.
			if limit := bound + rdmatest.Scale(time.Second); took > limit {
				t.Errorf("%s took %v to notice, more than the bound %v plus slack", r.what, took, bound)
			}
		case <-time.After(bound + rdmatest.Scale(10*time.Second)):
			t.Fatalf("calls still blocked %v after the peer vanished (bound %v)", time.Since(start), bound)
		}
	}
	if st := client.Stats(); st.KeepaliveProbes == 0 {
		t.Error("the dead peer was detected without a keepalive probe")
	}
	// Later calls fail the same way at once.
	if _, err := client.Write([]byte("x")); !errors.Is(err, syscall.ETIMEDOUT) {
		t.Errorf("Write after detection: %v, want ETIMEDOUT", err)
	}
}

// A peer that does not read for many keepalive intervals, with the writer
// blocked on credit, is alive: its NIC acknowledges the probes. Nothing
// fails, and every byte arrives once it reads.
func TestKeepaliveSlowReaderIsAlive(t *testing.T) {
	cfg := &Config{KeepAlive: rdmatest.Scale(50 * time.Millisecond), AckTimeout: 30 * time.Millisecond,
		RetryCount: 2, RecvBuffers: 8, BufferSize: 4096}
	client, server, ln := connPair(t, cfg)
	defer ln.Close()
	defer server.Close()
	defer client.Close()
	data := make([]byte, 64*4096)
	for i := range data {
		data[i] = byte(i * 7)
	}
	werr := make(chan error, 1)
	go func() {
		_, err := client.Write(data)
		werr <- err
	}()
	time.Sleep(10 * cfg.KeepAlive)
	select {
	case err := <-werr:
		t.Fatalf("Write returned before the peer read: %v", err)
	default:
	}
	got := make([]byte, len(data))
	if _, err := io.ReadFull(server, got); err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("bytes differ")
	}
	cs, ss := client.Stats(), server.Stats()
	t.Logf("probes: client %d, server %d", cs.KeepaliveProbes, ss.KeepaliveProbes)
	if cs.KeepaliveProbes == 0 {
		t.Error("the blocked writer's side sent no probe in 10 keepalive intervals")
	}
}

// While traffic flows, no probe is sent: the keepalive costs nothing.
func TestKeepaliveQuietWhileBusy(t *testing.T) {
	cfg := &Config{KeepAlive: rdmatest.Scale(300 * time.Millisecond)}
	client, server, ln := connPair(t, cfg)
	defer ln.Close()
	defer server.Close()
	defer client.Close()
	go io.Copy(server, server)
	buf := make([]byte, 64)
	end := time.Now().Add(5 * cfg.KeepAlive)
	n := 0
	for time.Now().Before(end) {
		if _, err := client.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(client, buf); err != nil {
			t.Fatal(err)
		}
		n++
		time.Sleep(cfg.KeepAlive / 30)
	}
	cs, ss := client.Stats(), server.Stats()
	t.Logf("%d round trips over %v; probes: client %d, server %d", n, 5*cfg.KeepAlive, cs.KeepaliveProbes, ss.KeepaliveProbes)
	if cs.KeepaliveProbes != 0 || ss.KeepaliveProbes != 0 {
		t.Errorf("probes sent while traffic flowed: client %d, server %d", cs.KeepaliveProbes, ss.KeepaliveProbes)
	}
	// Once idle, probes go out, and the connection stays up. A side probes
	// after KeepAlive without receiving anything, and a probe that arrives
	// counts as hearing from the peer: when one side's timer fires first,
	// its probes keep the other side's idle time short, so that side may
	// never probe. Some side must.
	time.Sleep(3 * cfg.KeepAlive)
	if cs, ss = client.Stats(), server.Stats(); cs.KeepaliveProbes+ss.KeepaliveProbes == 0 {
		t.Errorf("idle for 3 intervals: probes client %d, server %d, want some", cs.KeepaliveProbes, ss.KeepaliveProbes)
	}
	if _, err := client.Write(buf); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(client, buf); err != nil {
		t.Fatal(err)
	}
}

// The QP gets the transport settings the Config asks for, and the default
// ack timeout is rdma_cm's (logged: docs/configuration.md quotes it); an
// iWARP QP gets none.
func TestTransportSettings(t *testing.T) {
	client, server, ln := connPair(t, &Config{AckTimeout: 100 * time.Millisecond, RetryCount: 2})
	defer ln.Close()
	defer server.Close()
	defer client.Close()
	if client.dev.Caps.CMConnectsQP {
		// iWARP: TCP retransmits; the QP takes no transport settings.
		if info := qpInfo(t, client); client.ep.ackTimeoutSet != 0 || info.AckTimeout != 0 || info.RetryCount != 0 {
			t.Errorf("iWARP QP with transport settings: set n=%d, %v", client.ep.ackTimeoutSet, info)
		}
		return
	}
	if n := client.ep.ackTimeoutSet; ackTimeoutOf(n) < 100*time.Millisecond || ackTimeoutOf(n-1) >= 100*time.Millisecond {
		t.Errorf("AckTimeout 100ms gave n=%d (%v)", n, ackTimeoutOf(n))
	}
	c2, s2, ln2 := connPair(t, nil)
	defer ln2.Close()
	defer s2.Close()
	defer c2.Close()
	t.Logf("rdma_cm's default ack timeout: dialer n=%d (%v), listener n=%d (%v)",
		c2.ep.ackTimeoutSet, ackTimeoutOf(c2.ep.ackTimeoutSet), s2.ep.ackTimeoutSet, ackTimeoutOf(s2.ep.ackTimeoutSet))
}

// waitFor polls cond until it holds, failing the test after a while.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(rdmatest.Scale(10 * time.Second))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A peer of protocol 1.1 or older does not announce the keepalive feature:
// neither side probes it (its receives are all credits), and the
// connection works on after many intervals of silence.
func TestKeepaliveOlderPeer(t *testing.T) {
	checkLeaksAtEnd(t)
	cfg := &Config{KeepAlive: rdmatest.Scale(30 * time.Millisecond)}
	ln := listenTest(t, cfg)
	defer ln.Close()
	accepted := acceptAsync(ln)
	dcfg := cfg.withDefaults()
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(10*time.Second))
	defer cancel()
	client, err := dialHello(ctx, &dcfg, netip.AddrPort{}, netip.MustParseAddrPort(ln.Addr().String()), older)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server := <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	defer server.Close()
	time.Sleep(10 * cfg.KeepAlive)
	if cs, ss := client.Stats(), server.Stats(); cs.KeepaliveProbes != 0 || ss.KeepaliveProbes != 0 {
		t.Errorf("probes with a 1.0 peer: dialer %d, listener %d", cs.KeepaliveProbes, ss.KeepaliveProbes)
	}
	go io.Copy(server, server)
	msg := []byte("still here")
	if _, err := client.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(client, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo: %q, %v", got, err)
	}
}

// Close reports what it could not deliver. With the peer's host gone (its
// QP silenced), data written just before Close is never acknowledged:
// Close says so with a timeout after Config.CloseTimeout, or with the
// transport's ETIMEDOUT when the retries run out first. A Close whose data
// and end did arrive returns nil, as does one after the peer closed.
func TestCloseReportsUndelivered(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want error
	}{
		{"close timeout first", Config{CloseTimeout: rdmatest.Scale(300 * time.Millisecond), AckTimeout: 2 * time.Second, RetryCount: 6}, os.ErrDeadlineExceeded},
		{"transport timeout first", Config{CloseTimeout: rdmatest.Scale(5 * time.Second), AckTimeout: 30 * time.Millisecond, RetryCount: 1}, syscall.ETIMEDOUT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, server, ln := connPair(t, &tc.cfg)
			defer ln.Close()
			defer server.Close()
			defer client.Close()
			silence(t, server)
			if client.dev.Caps.CMConnectsQP {
				peerEndsAtOnce(t, client)
				return
			}
			if _, err := client.Write([]byte("lost")); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err := client.Close()
			t.Logf("Close after %v: %v", time.Since(start), err)
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, tc.want) {
				t.Errorf("Close with undelivered data: %v, want a timeout matching %v", err, tc.want)
			}
		})
	}

	// A well-behaved pair closes without error.
	c2, s2, ln2 := connPair(t, nil)
	defer ln2.Close()
	if _, err := c2.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	if err := c2.Close(); err != nil {
		t.Errorf("Close of a delivered stream: %v", err)
	}
	if b, err := io.ReadAll(s2); err != nil || string(b) != "bye" {
		t.Errorf("peer read %q, %v", b, err)
	}
	if err := s2.Close(); err != nil {
		t.Errorf("Close after the peer closed: %v", err)
	}
}
