//go:build linux && cgo

package faults

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/rdmatest/baseline"
	"github.com/verbline/rdma/internal/rdmatest/twoguest"
)

// lossy is the disturbance of the lossy tests, set on both hosts (each
// direction of the wire): 3% of packets lost, and 1% sent ahead of the
// others (netem reorders by delaying the rest, here by 1 ms). The delay
// line holds up to 100,000 packets: netem's default of 1,000 would
// overflow on rxe's reply to a 1 MiB RDMA read (1,024 packets sent in one
// go), a local drop that rxe counts as send_err and answers with an RNR
// NAK of its own (rxe_resp.c, read_reply), which would then count as a
// receiver-not-ready retry here. Loss on the wire is what is tested, not
// a full transmit queue.
var lossy = []string{"loss", "3%", "delay", "1ms", "reorder", "1%", "limit", "100000"}

// TestLossyStream: a stream each way at once through a Conn over the lossy
// wire arrives intact (sha256 of what each side wrote equals that of what
// the other read, byte counts equal); the transport retransmitted (the
// requester's retry counter moved on both hosts: loss happened and was
// repaired) and no receiver-not-ready retry happened (credits).
func TestLossyStream(t *testing.T) { streamTest(t, lossy, int64(*streamMiB)<<20) }

// TestCleanStream is TestLossyStream over the undisturbed wire: the rate
// to compare with, and no retransmission expected.
func TestCleanStream(t *testing.T) { streamTest(t, nil, int64(*cleanMiB)<<20) }

func streamTest(t *testing.T, netem []string, n int64) {
	env := twoguest.Require(t)
	base, baseG := baseline.Take(t, env.Env)
	peerBase := peerResources(t, env)
	cfg := "default"
	if netem != nil {
		cfg = "lossy"
	}
	ln := listenWith(t, env, configs[cfg]())
	if netem != nil {
		env.Netem(t, netem...)
	}
	before := bothCounters(t, env)

	timeout := transferTimeout(2 * n)
	p := startPeer(t, env, "stream", cfg, ln, fmt.Sprintf("FAULTS_BYTES=%d", n), "FAULTS_TIMEOUT="+timeout.String())
	c := accept(t, ln, p, rdmatest.Scale(30*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	mine, err := exchangeStream(ctx, c, seedA, n)
	exchanged := time.Now()
	cerr := c.Close()
	t.Logf("exchange took %v, Close %v: %v", exchanged.Sub(start).Round(time.Millisecond), time.Since(exchanged).Round(time.Millisecond), cerr)
	if err != nil {
		t.Fatalf("after %v: %v", time.Since(start), err)
	}
	var theirs streamResult
	peerResult(t, ctx, p, &theirs)
	elapsed := time.Since(start)
	if mine.Bytes != n || theirs.Bytes != n {
		t.Fatalf("read %d bytes here and %d on the peer, want %d each", mine.Bytes, theirs.Bytes, n)
	}
	if mine.Recv != theirs.Sent {
		t.Fatalf("peer to here: sha256 %s sent, %s received", theirs.Sent, mine.Recv)
	}
	if theirs.Recv != mine.Sent {
		t.Fatalf("here to peer: sha256 %s sent, %s received", mine.Sent, theirs.Recv)
	}
	t.Logf("%d MiB each way, netem %v, in %v: here to peer %.2f MB/s, peer to here %.2f MB/s, %.2f MB/s both ways together",
		n>>20, netem, elapsed.Round(time.Millisecond), float64(n)/theirs.ReadSecs/1e6, float64(n)/mine.ReadSecs/1e6,
		float64(2*n)/elapsed.Seconds()/1e6)
	checkCounters(t, env, before, netem != nil)

	ln.Close()
	rdmatest.CheckNoLeaks(t, base, baseG)
	checkPeerResources(t, env, peerBase)
}

// TestLossyMessages: over the same lossy wire, the message view (sizes
// below and above the receive buffers: eager and rendezvous) and one-sided
// writes with immediate, each way in turn: every message and notification
// arrives once, in order, intact, and nothing after the end.
//
// Without the library's Soft-RoCE workaround (bindReadyLocked, post.go) a disturbed
// wire leaves a rendezvous waiting forever, without an error, with both
// queue pairs idle: rxe re-executes a window bind on a retry and stops
// (docs/reliability.md; -faults.rxe-bind-anytime turns the workaround
// off). Should an exchange stall, the test fails after -faults.stall
// without progress, with a dump of both sides.
func TestLossyMessages(t *testing.T) {
	env := twoguest.Require(t)
	base, baseG := baseline.Take(t, env.Env)
	peerBase := peerResources(t, env)
	ln := listenWith(t, env, lossyConfig())
	env.Netem(t, lossy...)
	before := bothCounters(t, env)

	type way struct {
		name       string
		send, recv int // this side's cycles
	}
	n := *msgCycles
	ways := []way{{"here to peer", n, 0}, {"peer to here", 0, n}}
	if *concurrent {
		ways = []way{{"both ways at once", n, n}}
	}
	for _, w := range ways {
		messagesOneWay(t, env, ln, w.name, w.send, w.recv)
	}
	checkCounters(t, env, before, true)

	ln.Close()
	rdmatest.CheckNoLeaks(t, base, baseG)
	checkPeerResources(t, env, peerBase)
}

// messagesOneWay runs exchangeMessages with a new peer process, this side
// sending send cycles and receiving recv cycles.
func messagesOneWay(t *testing.T, env *twoguest.Env, ln *rdma.Listener, name string, send, recv int) {
	t.Helper()
	var perCycle int64
	for _, s := range msgSizes {
		perCycle += int64(s)
	}
	timeout := transferTimeout(int64(send+recv)*perCycle + 2*slots*slotSize)
	phase0 := bothCounters(t, env)
	p := startPeer(t, env, "messages", "lossy", ln, fmt.Sprintf("FAULTS_SEND=%d", recv),
		fmt.Sprintf("FAULTS_RECV=%d", send), "FAULTS_TIMEOUT="+timeout.String())
	c := accept(t, ln, p, rdmatest.Scale(30*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	mine, err := watchStall(t, env, c, p, ctx, name, func(ctx context.Context) (msgResult, error) {
		return exchangeMessages(ctx, c, seedA, seedB, send, recv)
	})
	phase1 := bothCounters(t, env)
	exchanged := time.Now()
	cerr := c.Close()
	t.Logf("%s: exchange %v, Close %v: %v", name, exchanged.Sub(start).Round(time.Millisecond),
		time.Since(exchanged).Round(time.Millisecond), cerr)
	if err != nil {
		t.Fatalf("%s, after %v: %v", name, time.Since(start), err)
	}
	var theirs msgResult
	peerResult(t, ctx, p, &theirs)
	// Which phase the transport's events belong to: the exchange, or the
	// teardown (both Closes, the peer process's exit).
	phase2 := bothCounters(t, env)
	logCounters(t, name+", exchange", counterPair{phase1.here.Sub(phase0.here), phase1.peer.Sub(phase0.peer)})
	logCounters(t, name+", teardown", counterPair{phase2.here.Sub(phase1.here), phase2.peer.Sub(phase1.peer)})
	writes := func(cycles int) int {
		if cycles == 0 {
			return 0
		}
		return nWrites
	}
	if mine.Messages != recv*len(msgSizes) || theirs.Messages != send*len(msgSizes) ||
		mine.Writes != writes(recv) || theirs.Writes != writes(send) {
		t.Fatalf("%s: here %+v, peer %+v", name, mine, theirs)
	}
	t.Logf("%s: %d messages (%d bytes) and %d one-sided writes with immediate over netem %v in %v",
		name, (send+recv)*len(msgSizes), mine.Bytes+theirs.Bytes, writes(send)+writes(recv), lossy,
		time.Since(start).Round(time.Millisecond))
}

// transferTimeout bounds a lossy transfer of n bytes in all: at least
// 20 KB/s (the measured rate is far above: docs/performance.md), plus set-up time.
func transferTimeout(n int64) time.Duration {
	if *timeoutFlag > 0 {
		return *timeoutFlag
	}
	return rdmatest.Scale(30*time.Second) + time.Duration(n/20e3)*time.Second
}

type counterPair struct{ here, peer twoguest.Counters }

func bothCounters(t *testing.T, env *twoguest.Env) counterPair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	here, err := env.LocalCounters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := env.PeerCounters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return counterPair{here, peer}
}

// checkCounters fails t if, since before, either host saw a
// receiver-not-ready retry, or, with lossy, unless both hosts' requesters
// retransmitted.
func checkCounters(t *testing.T, env *twoguest.Env, before counterPair, lossy bool) {
	t.Helper()
	after := bothCounters(t, env)
	here, peer := after.here.Sub(before.here), after.peer.Sub(before.peer)
	logCounters(t, "whole test", counterPair{here, peer})
	if here.RNR() != 0 || peer.RNR() != 0 {
		t.Errorf("receiver-not-ready retries happened (here %v, peer %v): flow control let a send reach an unposted receive", here, peer)
	}
	if lossy && (here.Retransmissions() == 0 || peer.Retransmissions() == 0) {
		t.Errorf("no retransmission on one host (here %d, peer %d): the loss did not happen; is netem on %s and %s?",
			here.Retransmissions(), peer.Retransmissions(), env.Netdev, env.PeerNetdev)
	}
}

// logCounters logs d, counter differences on both hosts.
func logCounters(t *testing.T, what string, d counterPair) {
	t.Helper()
	f := func(c twoguest.Counters) string {
		return fmt.Sprintf("retransmissions %d, sequence-error NAKs %d, duplicates %d, out of sequence %d, "+
			"RNR NAKs sent %d, received %d, retries exceeded %d, packets sent %d",
			c.Retransmissions(), c["rcvd_seq_err"], c["duplicate_request"], c["out_of_seq_request"],
			c["send_rnr_err"], c["rcvd_rnr_err"], c["retry_exceeded_err"], c["sent_pkts"])
	}
	t.Logf("counters (%s): here %s; on the peer %s", what, f(d.here), f(d.peer))
}

// peerResources counts the objects on the peer's device now.
func peerResources(t *testing.T, env *twoguest.Env) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := env.PeerResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return res
}
