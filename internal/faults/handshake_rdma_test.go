//go:build linux && cgo

package faults

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/rdmatest/baseline"
	"github.com/verbline/rdma/internal/rdmatest/twoguest"
)

// TestLostRTU: the wire drops every RTU the dialer sends (a tc u32 filter
// on the peer's side matching the CM's RTU datagrams, its REP
// retransmissions' answers included), so the listener's CM never hears
// that the dialer is established. The listener still accepts, within its
// default HandshakeTimeout: the dialer's first message on the QP proves it
// (rdma_notify COMM_EST), and the connection carries data both ways.
// Otherwise a lost RTU on a lossy wire would fail the accept after the
// timeout while the dialer thought itself connected, and its first
// message would then exhaust the transport's retries.
func TestLostRTU(t *testing.T) {
	env := twoguest.Require(t)
	base, baseG := baseline.Take(t, env.Env)
	peerBase := peerResources(t, env)
	ln := listenWith(t, env, testConfig()) // HandshakeTimeout: the default
	dropPeerRTUs(t, env)
	// The dialer speaks first: its data is the first message.
	serveEcho(t, env, ln)
	// The listener speaks first: the dialer's first message is the one
	// the library sends when it has sent nothing 50 ms after establishing.
	p := startPeer(t, env, "reply", "default", ln)
	start := time.Now()
	c := accept(t, ln, p, rdmatest.Scale(30*time.Second))
	t.Logf("accepted a quiet dialer in %v", time.Since(start).Round(time.Millisecond))
	line := fmt.Sprintf("hello from the listener, pid %d\n", os.Getpid())
	if _, err := io.WriteString(c, line); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || got != line {
		t.Fatalf("the quiet dialer answered %q, %v; want %q", got, err, line)
	}
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(30*time.Second))
	defer cancel()
	var theirs string
	peerResult(t, ctx, p, &theirs)
	c.Close()
	if n := peerRTUsDropped(t, env); n < 2 {
		t.Fatalf("the filter dropped %d RTUs, want one per dial: it did not match the CM's datagrams, and the test proved less", n)
	} else {
		t.Logf("RTUs dropped on the wire: %d", n)
	}
	ln.Close()
	rdmatest.CheckNoLeaks(t, base, baseG)
	checkPeerResources(t, env, peerBase)
}

// dropPeerRTUs makes the peer's RDMA netdev drop the CM's RTU datagrams
// it sends, until t ends. RoCE v2, offsets from the IP header (20 bytes):
// UDP (8, destination port 4791), BTH (12), DETH (8), then the MAD:
// management class at 49 (0x07, communication management) and attribute
// ID at 64 (0x0014, RTU; REQ is 0x0010, REP 0x0013).
func dropPeerRTUs(t *testing.T, env *twoguest.Env) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dev := env.PeerNetdev
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := env.Peer.Run(ctx, "tc", "qdisc", "del", "dev", dev, "root"); err != nil {
			t.Error(err)
		}
	})
	for _, cmd := range [][]string{
		{"tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "prio"},
		{"tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
			"match", "ip", "protocol", "17", "0xff", "match", "ip", "dport", "4791", "0xffff",
			"match", "u8", "0x07", "0xff", "at", "49", "match", "u16", "0x0014", "0xffff", "at", "64",
			"action", "drop"},
	} {
		if _, err := env.Peer.Run(ctx, cmd...); err != nil {
			t.Fatal(err)
		}
	}
}

var droppedPkts = regexp.MustCompile(`Sent \d+ bytes (\d+) pkt`)

// peerRTUsDropped is how many packets the peer's RTU filter dropped.
func peerRTUsDropped(t *testing.T, env *twoguest.Env) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := env.Peer.Run(ctx, "tc", "-s", "filter", "show", "dev", env.PeerNetdev, "parent", "1:")
	if err != nil {
		t.Fatal(err)
	}
	m := droppedPkts.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no action statistics in the peer's filter listing:\n%s", out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
