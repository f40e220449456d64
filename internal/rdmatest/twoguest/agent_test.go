//go:build unix

package twoguest

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startAgent serves an Agent on a loopback port for the test's duration.
func startAgent(t *testing.T, a *Agent) *Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go a.Serve(ln)
	return &Client{Addr: ln.Addr().String()}
}

func TestAgentProcesses(t *testing.T) {
	c := startAgent(t, &Agent{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	out, err := c.Run(ctx, "sh", "-c", "echo out; echo err >&2")
	if err != nil || out != "out\nerr\n" {
		t.Fatalf("Run: %q, %v", out, err)
	}
	out, err = c.Run(ctx, "sh", "-c", "echo why; exit 3")
	if err == nil || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "why") || out != "why\n" {
		t.Fatalf("Run of a failing command: %q, %v; want exit status 3 and its output in the error", out, err)
	}
	if _, err := c.Run(ctx, "/nonexistent/program"); err == nil || !strings.Contains(err.Error(), "/nonexistent/program") {
		t.Fatalf("Run of a missing program: %v", err)
	}

	p, err := c.Start(ctx, Cmd{Args: []string{"sh", "-c", `echo "$X in $(pwd)"; exec sleep 60`}, Env: []string{"X=x1"}, Dir: "/"})
	if err != nil {
		t.Fatal(err)
	}
	// Wait bounded by a context returns the output so far and a context error.
	wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	st, err := p.Wait(wctx)
	wcancel()
	if !errors.Is(err, context.DeadlineExceeded) || st.Exited {
		t.Fatalf("Wait on a running process: %v, %v; want it running and DeadlineExceeded", st, err)
	}
	if st.Output != "x1 in /\n" {
		t.Fatalf("output so far %q, want the environment and directory given", st.Output)
	}
	start := time.Now()
	if err := p.Signal(ctx, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st, err = p.Wait(ctx)
	if err != nil || !st.Exited || st.Signal != "killed" || st.Code != -1 {
		t.Fatalf("after SIGKILL: %+v, %v", st, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Wait returned %v after the process died", d)
	}
	if err := p.Signal(ctx, syscall.SIGKILL); err == nil || !strings.Contains(err.Error(), "already ended") {
		t.Fatalf("signal to an ended process: %v", err)
	}
	if _, err := (&Proc{c: c, ID: 99}).Status(ctx); err == nil || !strings.Contains(err.Error(), "no process 99") {
		t.Fatalf("status of an unknown process: %v", err)
	}
	if _, err := c.call(ctx, request{Op: "dance"}); err == nil || !strings.Contains(err.Error(), `unknown request "dance"`) {
		t.Fatalf("unknown request: %v", err)
	}
}

func TestAgentPowerOffAndInfo(t *testing.T) {
	t.Setenv("RDMA_TEST_ADDR", "169.254.78.2")
	off := make(chan struct{}, 1)
	c := startAgent(t, &Agent{PowerOff: func() error { off <- struct{}{}; return nil }})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := c.Info(ctx)
	if err != nil || info["RDMA_TEST_ADDR"] != "169.254.78.2" {
		t.Fatalf("Info: %v, %v", info, err)
	}
	if err := c.PowerOff(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-off:
	case <-time.After(5 * time.Second):
		t.Fatal("PowerOff answered but did not power off")
	}
}

func TestWaitReadyGivesUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nobody listens there now
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err = (&Client{Addr: addr}).WaitReady(ctx)
	if err == nil || !strings.Contains(err.Error(), "did not answer") || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("WaitReady with no agent: %v", err)
	}
}

func TestTailBuffer(t *testing.T) {
	b := &tailBuffer{max: 4}
	b.Write([]byte("abc"))
	b.Write([]byte("def"))
	if b.String() != "cdef" {
		t.Fatalf("%q, want the last 4 bytes", b.String())
	}
}
