//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/cmsetup"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// TestNoLeaks: after connections (with traffic in both directions, closed
// from either side) and their listener are closed, the process holds no QP,
// CQ, MR, PD or cm_id more than before, and no extra goroutine.
func TestNoLeaks(t *testing.T) {
	// Warm up librdmacm's per-device state (it keeps a PD and context per device).
	c, s, ln := connPair(t, nil)
	c.Close()
	s.Close()
	ln.Close()
	time.Sleep(100 * time.Millisecond)
	baseRes, baseG := rdmatest.Resources(t), runtime.NumGoroutine()

	ln = listenTest(t, nil)
	for i := 0; i < 8; i++ {
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.Copy(c, c)
			c.Close()
		}()
		c, err := Dial("rdma", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		msg := []byte(fmt.Sprintf("conn %d", i))
		c.Write(msg)
		io.ReadFull(c, make([]byte, len(msg)))
		if i == 0 {
			// The check below can only see leaks if it sees live objects.
			if live := rdmatest.Resources(t); live["qp"] < 2 || live["cm_id"] < 3 || live["mr"] < 1 || live["cq"] < 1 {
				out, _ := exec.Command("rdma", "resource", "show", "qp").CombinedOutput()
				t.Fatalf("with a connection open, rdma resource show lists %v for this process (pid %d):\n%s", live, os.Getpid(), out)
			}
		}
		if i%2 == 0 {
			c.CloseWrite()
			io.Copy(io.Discard, c)
		}
		c.Close()
	}
	// A handshake the listener refuses must not leak either.
	rawDial(t, ln.Addr().String(), []byte("not a handshake"))
	ln.Close()
	rdmatest.CheckNoLeaks(t, baseRes, baseG)
	t.Logf("resources after: %v", rdmatest.Resources(t))
}

// rawDial connects with rdma_cm directly, sending priv as the handshake, and
// returns the event the listener answers with.
func rawDial(t *testing.T, addr string, priv []byte) rdmacm.Event {
	ch, err := rdmacm.NewChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	id, err := ch.CreateID()
	if err != nil {
		t.Fatal(err)
	}
	defer id.Destroy()
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(5*time.Second))
	defer cancel()
	if err := id.ResolveAddr(netip.AddrPort{}, netip.MustParseAddrPort(addr), 2000); err != nil {
		t.Fatal(err)
	}
	if _, err := cmsetup.Expect(ctx, ch, rdmacm.EventAddrResolved, ""); err != nil {
		t.Fatal(err)
	}
	if err := id.ResolveRoute(2000); err != nil {
		t.Fatal(err)
	}
	if _, err := cmsetup.Expect(ctx, ch, rdmacm.EventRouteResolved, ""); err != nil {
		t.Fatal(err)
	}
	cfg := (&Config{}).withDefaults()
	c, err := newConn(&cfg, ch, id)
	if err != nil {
		t.Fatal(err)
	}
	defer c.abort()
	ep := c.ep
	if err := ep.moveQP(id, verbs.StateInit); err != nil {
		t.Fatal(err)
	}
	if err := id.Connect(rdmacm.ConnParam{PrivateData: priv, RetryCount: 7, RNRRetryCount: 7, QPNum: ep.qp.Num}); err != nil {
		t.Fatal(err)
	}
	ev, err := cmsetup.WaitEvent(ctx, ch)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// TestForeignHandshake: a peer that does not speak the protocol (or a newer
// version of it) is refused with a reason the dialer can read.
func TestForeignHandshake(t *testing.T) {
	ln := listenTest(t, nil)
	defer ln.Close()
	newer := wire.Hello{Version: wire.Version + 1, Credits: 8, RecvBufSize: 4096}
	for _, tc := range []struct {
		name string
		priv []byte
		want string
	}{
		{"garbage", []byte("GET / HTTP/1.1\r\n"), "not a verbline handshake"},
		{"empty", nil, "not a verbline handshake"},
		{"newer version", newer.AppendTo(nil), "version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := rawDial(t, ln.Addr().String(), tc.priv)
			if ev.Type != rdmacm.EventRejected {
				t.Fatalf("listener answered %s, want a reject", ev.Type)
			}
			err := cmsetup.EventError(ev, "")
			if !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("dialer's error %q, want ErrHandshake mentioning %q", err, tc.want)
			}
			t.Log(err)
		})
	}
}

// TestPeerKilled: when the peer's process is killed, a blocked Read and a
// blocked Write on this side return an error within a bounded time.
func TestPeerKilled(t *testing.T) {
	if os.Getenv("RDMA_TEST_CHILD_DIAL") != "" {
		return // in the child, this test is peerChild's entry (see TestMain)
	}
	for _, blocked := range []string{"read", "write"} {
		t.Run(blocked, func(t *testing.T) {
			ln := listenTest(t, nil)
			defer ln.Close()
			child := exec.Command(os.Args[0], "-test.run=^$")
			child.Env = append(os.Environ(), "RDMA_TEST_CHILD_DIAL="+ln.Addr().String())
			child.Stderr = os.Stderr
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			defer child.Wait()
			defer child.Process.Kill()
			c, err := ln.AcceptRDMA()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// The child writes one byte to say it is up, then blocks forever.
			if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
				t.Fatal(err)
			}
			errc := make(chan error, 1)
			go func() {
				var err error
				if blocked == "read" {
					_, err = c.Read(make([]byte, 10))
				} else {
					_, err = c.Write(make([]byte, 256<<20)) // the child never reads
				}
				errc <- err
			}()
			time.Sleep(200 * time.Millisecond)
			start := time.Now()
			child.Process.Signal(syscall.SIGKILL)
			select {
			case err := <-errc:
				if err == nil {
					t.Fatal("blocked call returned no error after the peer died")
				}
				t.Logf("%s returned %v after %v", blocked, err, time.Since(start))
			case <-time.After(rdmatest.Scale(30 * time.Second)):
				t.Fatalf("blocked %s still blocked after the peer was killed", blocked)
			}
		})
	}
}

// peerChild is the process TestPeerKilled kills: it dials, says hello, and hangs.
func peerChild(addr string) {
	c, err := Dial("rdma", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child dial:", err)
		os.Exit(1)
	}
	c.Write([]byte{1})
	select {}
}

func TestMain(m *testing.M) {
	if addr := os.Getenv("RDMA_TEST_CHILD_DIAL"); addr != "" {
		peerChild(addr)
	}
	if addr := os.Getenv("RDMA_SETUP_LISTEN"); addr != "" {
		setupServer(addr) // scripts/setupbench's server process (setup_rdma_test.go)
	}
	// RDMA_TEST_TRAILERS=1 runs every connection over trailers, as on a
	// device without immediate data (trailer.go; docs/testing.md).
	forceTrailers.Store(os.Getenv("RDMA_TEST_TRAILERS") == "1")
	os.Exit(m.Run())
}
