//go:build linux && cgo

package faults

import (
	"bufio"
	"context"
	"io"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/rdmatest/baseline"
	"github.com/verbline/rdma/internal/rdmatest/twoguest"
)

// TestPeerProcessKilled: the peer's process is killed (SIGKILL) in
// mid-transfer, while a Read here is receiving its data and a Write here
// waits for credit it never returns. Both return an error (not io.EOF)
// within a scaled second: the peer's kernel tears its connection down and
// tells this host over the wire. The Listener serves a new dial after.
func TestPeerProcessKilled(t *testing.T) {
	env := twoguest.Require(t)
	base, baseG := baseline.Take(t, env.Env)
	peerBase := peerResources(t, env)
	ln := listenWith(t, env, testConfig())
	p := startPeer(t, env, "flood", "default", ln)
	c := accept(t, ln, p, rdmatest.Scale(30*time.Second))
	defer c.Close()

	var read atomic.Int64
	readErr, writeErr := make(chan error, 1), make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			read.Add(int64(n))
			if err != nil {
				readErr <- err
				return
			}
		}
	}()
	go func() {
		_, err := c.Write(make([]byte, 256<<20)) // the peer never reads
		writeErr <- err
	}()
	// Mid-transfer: data keeps arriving.
	deadline := time.Now().Add(rdmatest.Scale(10 * time.Second))
	for read.Load() < 4<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d bytes from the peer in %v", read.Load(), rdmatest.Scale(10*time.Second))
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Signal(ctx, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	bound := rdmatest.Scale(time.Second)
	for _, w := range []struct {
		op string
		ch chan error
	}{{"Read", readErr}, {"Write", writeErr}} {
		select {
		case err := <-w.ch:
			if err == nil || err == io.EOF {
				t.Errorf("blocked %s returned %v after the peer was killed, want an error", w.op, err)
			}
			t.Logf("blocked %s returned after %v: %v", w.op, time.Since(killed).Round(time.Millisecond), err)
		case <-time.After(bound - time.Since(killed)):
			t.Fatalf("blocked %s still blocked %v after the peer was killed", w.op, bound)
		}
	}
	t.Logf("%d bytes read before the kill", read.Load())
	st, err := p.Wait(ctx)
	if err != nil || st.Signal != "killed" {
		t.Fatalf("peer process: %v, %v", st, err)
	}
	c.Close()

	serveEcho(t, env, ln)
	ln.Close()
	rdmatest.CheckNoLeaks(t, base, baseG)
	checkPeerResources(t, env, peerBase)
}

// serveEcho has a new peer process dial ln and checks one echoed line.
func serveEcho(t *testing.T, env *twoguest.Env, ln *rdma.Listener) {
	t.Helper()
	p := startPeer(t, env, "echo", "default", ln)
	start := time.Now()
	c := accept(t, ln, p, rdmatest.Scale(30*time.Second))
	defer c.Close()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, line); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(30*time.Second))
	defer cancel()
	var got string
	peerResult(t, ctx, p, &got)
	t.Logf("the listener served a new dial (%v): %q", time.Since(start).Round(time.Millisecond), got)
}
