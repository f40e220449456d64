//go:build linux && cgo

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/verbs"
)

// TestDoctorOnSoftRoCE runs the real checks on the test device: nothing may
// block RDMA, and the device's port and address must be found as the
// library will use them.
func TestDoctorOnSoftRoCE(t *testing.T) {
	env := rdmatest.Require(t)
	rs := Run(machineEnv())
	t.Logf("\n%s", dump(rs))
	for _, r := range rs {
		if r.Status == Fail {
			t.Errorf("%s: %s (fix: %s)", r.Name, r.Detail, r.Fix)
		}
	}
	expectExit(t, rs, 0)
	expect(t, rs, "rdma_cm", OK, "/dev/infiniband/rdma_cm present", "")
	expect(t, rs, "uverbs", OK, "/dev/infiniband/uverbs", "")
	expect(t, rs, "devices", OK, env.Device, "")
	expect(t, rs, "libibverbs", OK, "opens "+env.Device, "")
	if iwarpDevice(t, env.Device) {
		// iWARP (Soft-iWARP): no RoCE GIDs; rdma_cm uses the netdev's addresses.
		expect(t, rs, "port "+env.Device+"/1", OK, "ACTIVE, Ethernet (iWARP), active MTU 1024 (libibverbs)", "")
		expect(t, rs, "gids "+env.Device+"/1", OK, "iWARP: rdma_cm uses the addresses of ", "")
		return
	}
	expect(t, rs, "port "+env.Device+"/1", OK, "ACTIVE, Ethernet (RoCE), active MTU 1024 (libibverbs)", "")
	expect(t, rs, "gids "+env.Device+"/1", OK, "RoCE v2 GIDs for "+env.Addr+" (index ", "")
}

// iwarpDevice reports whether the named device's transport is iWARP.
func iwarpDevice(t *testing.T, name string) bool {
	t.Helper()
	ctx, err := verbs.OpenDevice(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	a, err := ctx.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	return a.Transport == verbs.TransportIWARP
}

// TestDoctorPeerOnSoftRoCE runs the doctor binary twice, as on two
// machines: -listen, then -peer against it.
func TestDoctorPeerOnSoftRoCE(t *testing.T) {
	env := rdmatest.Require(t)
	ln := exec.Command(os.Args[0], "-listen", net.JoinHostPort(env.Addr, "0"))
	ln.Env = append(os.Environ(), "VERBLINE_DOCTOR_MAIN=1")
	ln.Stderr = os.Stderr
	out, err := ln.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := ln.Start(); err != nil {
		t.Fatal(err)
	}
	defer ln.Process.Kill()
	line := make(chan string, 1)
	go func() {
		br := bufio.NewReader(out)
		s, _ := br.ReadString('\n')
		line <- s
		br.WriteTo(os.Stderr) // keep draining: the listener must never block on a full pipe
	}()
	var addr string
	select {
	case s := <-line:
		_, rest, ok := strings.Cut(s, "echo listener on ")
		if !ok {
			t.Fatalf("listener said %q", s)
		}
		addr, _, _ = strings.Cut(rest, " ")
	case <-time.After(rdmatest.Scale(10 * time.Second)):
		t.Fatal("the -listen process did not report its address")
	}

	peer := exec.Command(os.Args[0], "-json", "-peer", addr, "-count", "100", "-timeout", rdmatest.Scale(5*time.Second).String())
	peer.Env = append(os.Environ(), "VERBLINE_DOCTOR_MAIN=1")
	var stdout bytes.Buffer
	peer.Stdout, peer.Stderr = &stdout, os.Stderr
	if err := peer.Run(); err != nil {
		t.Fatalf("-peer %s: %v\n%s", addr, err, stdout.String())
	}
	var doc struct {
		Exit    int
		Results []struct {
			Name, Status, Detail string
			Data                 LatencyData
		}
	}
	if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	last := doc.Results[len(doc.Results)-1]
	t.Logf("%s: %s", last.Name, last.Detail)
	d := last.Data
	if doc.Exit != 0 || last.Name != "peer "+addr || last.Status != "ok" {
		t.Fatalf("exit %d, last result %+v", doc.Exit, last)
	}
	if d.Count != 100 || d.Size != 64 || !(0 < d.MinUS && d.MinUS <= d.MedianUS && d.MedianUS <= d.P99US && d.P99US <= d.MaxUS) || d.MeanUS <= 0 {
		t.Fatalf("latency figures out of order: %+v", d)
	}
	// The memlock check's estimate against the kernel's count: the peer
	// process has exactly one connection.
	if d.PinnedBytes != d.EstimateBytes || d.EstimateBytes != pinnedBytes(1) {
		t.Fatalf("one connection pins %d bytes (VmPin), the memlock estimate says %d: update memlock.go's figures", d.PinnedBytes, d.EstimateBytes)
	}

	if err := ln.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- ln.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("-listen ended with %v after SIGTERM", err)
		}
	case <-time.After(rdmatest.Scale(5 * time.Second)):
		t.Fatal("-listen did not stop on SIGTERM")
	}
}

// TestPeerInProcess runs checkPeer against an in-process echo listener: two
// connections on one device share its pool, which the estimate must match;
// then against a port where nothing listens.
func TestPeerInProcess(t *testing.T) {
	env := rdmatest.Require(t)
	base := rdmatest.Resources(t)
	baseG := runtime.NumGoroutine()
	ln, err := rdma.Listen("rdma", net.JoinHostPort(env.Addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	s := newEchoServer(ln)
	r := checkPeer(ln.Addr().String(), 50, 1000, rdmatest.Scale(5*time.Second))
	s.close()
	t.Logf("%s: %s", r.Name, r.Detail)
	if r.Status != OK {
		t.Fatalf("%s: %s %s (fix: %s)", r.Name, r.Status, r.Detail, r.Fix)
	}
	d := r.Data.(LatencyData)
	if d.Count != 50 || d.Size != 1000 || d.MedianUS <= 0 {
		t.Fatalf("figures: %+v", d)
	}
	if d.PinnedBytes != pinnedBytes(2) {
		t.Fatalf("two connections pin %d bytes (VmPin), the memlock estimate says %d: update memlock.go's figures", d.PinnedBytes, pinnedBytes(2))
	}

	// Nothing listens on the port any more.
	r = checkPeer(ln.Addr().String(), 1, 64, rdmatest.Scale(5*time.Second))
	if r.Status != Fail || !strings.Contains(r.Fix, "nothing listens there") {
		t.Fatalf("dial to a closed listener: %s %q (fix %q)", r.Status, r.Detail, r.Fix)
	}

	res := rdmatest.Resources(t)
	base["pd"] = res["pd"] // librdmacm keeps a PD per device once it has seen it
	rdmatest.CheckNoLeaks(t, base, baseG)
}
