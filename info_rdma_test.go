//go:build linux && cgo

package rdma

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
)

// pairWith connects a dialer with dcfg to a listener with lcfg (each side
// its own Config) and returns both ends.
func pairWith(t *testing.T, dcfg, lcfg Config) (client, server *Conn, ln *Listener) {
	t.Helper()
	checkLeaksAtEnd(t)
	ln = listenTest(t, &lcfg)
	accepted := acceptAsync(ln)
	d := Dialer{Config: dcfg, Timeout: rdmatest.Scale(10 * time.Second)}
	nc, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		nc.Close()
		ln.Close()
		t.Fatal("accept failed")
	}
	return nc.(*Conn), server, ln
}

func qpInfo(t *testing.T, c *Conn) QPInfo {
	t.Helper()
	info, err := c.QPInfo()
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// Each side's transport settings land on its own QP, read back with
// ibv_query_qp on both ends; a connection whose sides share a path MTU
// cap moves multi-packet messages both ways.
func TestQPInfoSettings(t *testing.T) {
	dcfg := Config{AckTimeout: 100 * time.Millisecond, RetryCount: 3, RNRRetry: 4, MinRNRTimer: time.Millisecond,
		MaxPathMTU: 512, ServiceLevel: 5, TrafficClass: 96, RecvBuffers: 8, BufferSize: 8192}
	lcfg := Config{AckTimeout: 300 * time.Millisecond, RetryCount: 5, RNRRetry: 2, MinRNRTimer: 20 * time.Millisecond,
		MaxPathMTU: 600, ServiceLevel: 3, TrafficClass: 184, RecvBuffers: 8, BufferSize: 8192}
	client, server, ln := pairWith(t, dcfg, lcfg)
	defer ln.Close()
	defer server.Close()
	defer client.Close()
	ci, si := qpInfo(t, client), qpInfo(t, server)
	t.Logf("dialer:   %v", ci)
	t.Logf("listener: %v", si)
	if client.dev.Caps.CMConnectsQP {
		iwarpQPInfo(t, "dialer", ci, client)
		iwarpQPInfo(t, "listener", si, server)
		return
	}
	check := func(side string, info, peer QPInfo, c *Conn, cfg Config) {
		t.Helper()
		for _, f := range []struct {
			name      string
			got, want any
		}{
			{"State", info.State, "RTS"},
			{"QPN", info.QPN, c.ep.qp.Num},
			{"DestQPN", info.DestQPN, peer.QPN},
			{"TimeoutExp", info.TimeoutExp, ackTimeoutExp(cfg.AckTimeout)},
			{"AckTimeout", info.AckTimeout, ackTimeoutOf(ackTimeoutExp(cfg.AckTimeout))},
			{"RetryCount", info.RetryCount, cfg.RetryCount},
			{"RNRRetry", info.RNRRetry, cfg.RNRRetry},
			{"MinRNRTimerCode", info.MinRNRTimerCode, rnrTimerCode(cfg.MinRNRTimer)},
			{"PathMTU", info.PathMTU, 512}, // 600 rounds down to 512
			{"SL given to ibv_modify_qp", c.ep.avSet.SL, cfg.ServiceLevel},
			{"TrafficClass", info.TrafficClass, cfg.TrafficClass},
			{"MaxInline", info.MaxInline, c.ep.maxInline},
		} {
			if fmt.Sprint(f.got) != fmt.Sprint(f.want) {
				t.Errorf("%s: %s %v, want %v", side, f.name, f.got, f.want)
			}
		}
		// Soft-RoCE does not keep the service level (its address vector
		// has none: the SL reads back 0); other devices hold what was set.
		if rxe := strings.HasPrefix(rdmatest.Require(t).Device, "rxe"); info.ServiceLevel != cfg.ServiceLevel &&
			(!rxe || info.ServiceLevel != 0) {
			t.Errorf("%s: ServiceLevel %d, want %d", side, info.ServiceLevel, cfg.ServiceLevel)
		} else if info.ServiceLevel != cfg.ServiceLevel {
			t.Logf("%s: the QP holds SL %d: %s keeps no service level", side, info.ServiceLevel, rdmatest.Require(t).Device)
		}
		if info.MinRNRTimer < cfg.MinRNRTimer {
			t.Errorf("%s: MinRNRTimer %v below the %v asked for", side, info.MinRNRTimer, cfg.MinRNRTimer)
		}
		if info.AckTimeout < cfg.AckTimeout {
			t.Errorf("%s: AckTimeout %v below the %v asked for", side, info.AckTimeout, cfg.AckTimeout)
		}
	}
	check("dialer", ci, si, client, dcfg)
	check("listener", si, ci, server, lcfg)

	// 64 KiB each way: packets of 512 bytes, many per buffer.
	for _, p := range [][2]*Conn{{client, server}, {server, client}} {
		data := bytes.Repeat([]byte("0123456789abcdef"), 4096)
		errc := make(chan error, 1)
		go func() { _, err := p[0].Write(data); errc <- err }()
		got := make([]byte, len(data))
		if _, err := io.ReadFull(p[1], got); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatal("data corrupted at path MTU 512")
		}
	}
	// Once quiet, what one side sends next is what the other expects next.
	waitFor(t, "the PSNs to settle", func() bool {
		ci, si = qpInfo(t, client), qpInfo(t, server)
		return ci.SendPSN == si.RecvPSN && si.SendPSN == ci.RecvPSN
	})
	t.Logf("after 128 KiB: dialer sq_psn 0x%x rq_psn 0x%x, listener sq_psn 0x%x rq_psn 0x%x",
		ci.SendPSN, ci.RecvPSN, si.SendPSN, si.RecvPSN)
}

// iwarpQPInfo checks a QPInfo of an iWARP connection as QPInfo documents
// it: the library's state and the device's capacities, none of
// InfiniBand's transport attributes (the Config's are not applied: TCP
// retransmits), and the port's MTU.
func iwarpQPInfo(t *testing.T, side string, info QPInfo, c *Conn) {
	t.Helper()
	want := QPInfo{QPN: c.ep.qp.Num, State: "RTS", PathMTU: c.ep.lim.ActiveMTU.Bytes(),
		MaxInline: info.MaxInline, MaxSendWR: info.MaxSendWR, MaxRecvWR: info.MaxRecvWR,
		MaxRdAtomic: info.MaxRdAtomic, MaxDestRdAtomic: info.MaxDestRdAtomic}
	if info != want {
		t.Errorf("%s on iWARP: %+v, want %+v", side, info, want)
	}
	// siw reports its device limit, not what the QP was created with.
	if info.MaxInline < c.ep.maxInline {
		t.Errorf("%s on iWARP: max_inline %d below the %d the library sends inline", side, info.MaxInline, c.ep.maxInline)
	}
	if info.MaxSendWR == 0 || info.MaxRecvWR == 0 {
		t.Errorf("%s on iWARP: queue depths %d and %d, want the device's", side, info.MaxSendWR, info.MaxRecvWR)
	}
}

// The zero Config's settings as the QP holds them (logged:
// docs/troubleshooting.md quotes them): retry_cnt and rnr_retry 6,
// rdma_cm's ack timeout and RNR NAK timer, the port's MTU.
func TestQPInfoDefaults(t *testing.T) {
	client, server, ln := connPair(t, nil)
	defer ln.Close()
	defer server.Close()
	defer client.Close()
	for _, c := range []*Conn{client, server} {
		info := qpInfo(t, c)
		t.Logf("%v", info)
		if c.dev.Caps.CMConnectsQP {
			iwarpQPInfo(t, "defaults", info, c)
			continue
		}
		if info.State != "RTS" || info.RetryCount != 6 || info.RNRRetry != 6 || info.TimeoutExp != c.ep.ackTimeoutSet ||
			info.PathMTU != c.ep.lim.ActiveMTU.Bytes() || info.ServiceLevel != 0 || info.TrafficClass != 0 {
			t.Errorf("defaults: %+v (ack timeout set n=%d, active MTU %v)", info, c.ep.ackTimeoutSet, c.ep.lim.ActiveMTU)
		}
		if info.MinRNRTimerCode != 0 { // rdma_cm's, documented as 655.36 ms
			t.Errorf("min_rnr_timer code %d (%v), want rdma_cm's 0", info.MinRNRTimerCode, info.MinRNRTimer)
		}
	}
	client.Close()
	if _, err := client.QPInfo(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("QPInfo after Close: %v, want net.ErrClosed", err)
	}
}

// A one-sided write with a key the peer never issued fails on the peer's
// NIC: the error names the status as ibv_wc_status_str does, the operation
// (from the work request: a failed completion's opcode is not valid) and
// the QP; the QP is then in ERR, as QPInfo shows. (On iWARP the write
// completes once TCP took it and the peer's device ends the connection.)
func TestCompletionErrorNamesOperation(t *testing.T) {
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(20*time.Second))
	defer cancel()
	target, _ := s.Alloc(4096)
	defer target.Release()
	exp, err := s.Export(target, RemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Close()
	bad := exp.Remote()
	bad.RKey ^= 0x5a5a00 // a key the peer never issued
	local, _ := c.Alloc(1024)
	defer local.Release()
	err = c.WriteRemote(ctx, local, bad, 0)
	t.Logf("write with a bad rkey: %v", err)
	if c.dev.Caps.SendsCompleteLocally {
		// iWARP: the write completes once TCP took it; the peer's device
		// refuses it and ends the connection (docs/devices.md).
		waitFor(t, "the QP to reach ERR", func() bool {
			info, err := c.QPInfo()
			return err == nil && info.State == "ERR"
		})
		if err := c.WriteRemote(ctx, local, exp.Remote(), 0); err == nil {
			t.Fatal("a write after the peer's device refused one succeeded: the connection did not end")
		} else {
			t.Logf("the next write: %v", err)
		}
		return
	}
	var oe *net.OpError
	if !errors.Is(err, ErrRemoteAccess) || !errors.As(err, &oe) || oe.Op != "write remote" {
		t.Fatalf("got %v, want ErrRemoteAccess in a write remote *net.OpError", err)
	}
	want := fmt.Sprintf("RDMA write on QP 0x%x failed: remote access error (work completion status 10", c.ep.qp.Num)
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("%q lacks %q", err, want)
	}
	waitFor(t, "the QP to reach ERR", func() bool {
		info, err := c.QPInfo()
		return err == nil && info.State == "ERR"
	})
}

// The asynchronous form names its operation too: a PostReadRemote with a
// bad key ends with an OpCompletion whose error names the RDMA read.
func TestCompletionErrorNamesAsyncRead(t *testing.T) {
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	target, _ := s.Alloc(4096)
	defer target.Release()
	exp, err := s.Export(target, RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Close()
	bad := exp.Remote()
	bad.RKey ^= 0x5a5a00
	local, _ := c.Alloc(512)
	defer local.Release()
	if err := c.PostReadRemote(local, bad, 0, 77); err != nil {
		t.Fatal(err)
	}
	var done OpCompletion
	select {
	case done = <-c.Completions():
	case <-time.After(rdmatest.Scale(10 * time.Second)):
		t.Fatal("no completion")
	}
	t.Logf("read with a bad rkey: %v", done.Err)
	if c.dev.Caps.SendsCompleteLocally {
		// iWARP: the peer's device terminates the connection, which
		// flushes the read (docs/devices.md).
		want := fmt.Sprintf("RDMA read on QP 0x%x failed: ", c.ep.qp.Num)
		if done.ID != 77 || done.Err == nil || !strings.Contains(done.Err.Error(), want) ||
			!errors.Is(done.Err, ErrRemoteAccess) && !strings.Contains(done.Err.Error(), "connection failed before the operation completed") {
			t.Fatalf("completion %d: %v, want ErrRemoteAccess or the connection's end, naming %q", done.ID, done.Err, want)
		}
		return
	}
	want := fmt.Sprintf("RDMA read on QP 0x%x failed: remote access error", c.ep.qp.Num)
	if done.ID != 77 || !errors.Is(done.Err, ErrRemoteAccess) || !strings.Contains(done.Err.Error(), want) {
		t.Fatalf("completion %d: %v, want ErrRemoteAccess naming %q", done.ID, done.Err, want)
	}
}
