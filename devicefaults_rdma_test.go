//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"io"
	"net"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/verbs"
)

// blockedCalls starts a Read and a Recv on c, which block (nothing is
// sent), and returns where their errors arrive.
func blockedCalls(c *Conn) <-chan error {
	errc := make(chan error, 2)
	go func() {
		_, err := c.Read(make([]byte, 10))
		errc <- err
	}()
	go func() {
		_, err := c.Recv(context.Background())
		errc <- err
	}()
	return errc
}

// expectErrors waits for n errors on errc, each matching target.
func expectErrors(t *testing.T, what string, errc <-chan error, n int, target error) {
	t.Helper()
	for range n {
		select {
		case err := <-errc:
			var oe *net.OpError
			if !errors.As(err, &oe) || !errors.Is(err, target) {
				t.Errorf("%s: got %v, want a *net.OpError wrapping %v", what, err, target)
			} else {
				t.Logf("%s: %v", what, err)
			}
		case <-time.After(rdmatest.Scale(10 * time.Second)):
			t.Fatalf("%s: call still blocked", what)
		}
	}
}

// echoOnce checks that c and its peer s still carry bytes.
func echoOnce(t *testing.T, c, s *Conn) {
	t.Helper()
	msg := []byte("ping")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(s, got); err != nil || string(got) != "ping" {
		t.Fatalf("echo: %q, %v", got, err)
	}
}

// An injected QP fatal or access error fails that connection alone: its
// blocked calls return ECONNABORTED naming the event; the device's other
// connections carry on.
func TestAsyncQPError(t *testing.T) {
	for _, typ := range []verbs.AsyncEventType{verbs.EventQPFatal, verbs.EventQPAccessErr} {
		t.Run(typ.String(), func(t *testing.T) {
			c1, s1, ln1 := connPair(t, nil)
			defer ln1.Close()
			defer s1.Close()
			defer c1.Close()
			c2, s2, ln2 := connPair(t, nil)
			defer ln2.Close()
			defer s2.Close()
			defer c2.Close()
			errc := blockedCalls(c1)
			time.Sleep(rdmatest.Scale(50 * time.Millisecond))
			before := c1.Stats().DeviceEvents
			c1.dev.HandleAsync(verbs.AsyncEvent{Type: typ, QPN: c1.ep.qp.Num})
			expectErrors(t, "blocked on the failed QP", errc, 2, syscall.ECONNABORTED)
			if _, err := c1.Write([]byte("x")); !errors.Is(err, syscall.ECONNABORTED) {
				t.Errorf("Write after the event: %v, want ECONNABORTED", err)
			}
			if got := c1.Stats().DeviceEvents; got != before+1 {
				t.Errorf("DeviceEvents %d -> %d, want one more", before, got)
			}
			echoOnce(t, c2, s2)
			echoOnce(t, s2, c2)
		})
	}
}

// An injected CQ error fails the connections on that CQ; the poller takes
// no new connection, and a new dial gets a working CQ.
func TestAsyncCQError(t *testing.T) {
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	defer s.Close()
	defer c.Close()
	p := c.ep.poller
	errc := blockedCalls(c)
	time.Sleep(rdmatest.Scale(50 * time.Millisecond))
	c.dev.HandleAsync(verbs.AsyncEvent{Type: verbs.EventCQErr, CQ: p.CQ().Key()})
	expectErrors(t, "blocked on the failed CQ", errc, 2, syscall.ECONNABORTED)
	if p.Err() == nil {
		t.Fatal("the poller of the failed CQ is not marked failed")
	}
	c2, err := Dial("rdma", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	s2, err := ln.AcceptRDMA()
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if c2.ep.poller == p || s2.ep.poller == p {
		t.Fatal("a new connection was attached to the failed poller")
	}
	echoOnce(t, c2, s2)
}

// An injected device fatal error fails every connection on the device and
// the listener bound to it; dials and listens on it then fail fast with
// ErrNoDevice, until (here, for the test's sake) the record is cleared.
func TestAsyncDeviceFatal(t *testing.T) {
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	defer s.Close()
	defer c.Close()
	key := c.dev.Key()
	defer func() {
		device.ForgetFatal(key)
	}()
	errc := blockedCalls(c)
	accepted := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		accepted <- err
	}()
	time.Sleep(rdmatest.Scale(50 * time.Millisecond))
	c.dev.HandleAsync(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
	expectErrors(t, "blocked on the failed device", errc, 2, ErrNoDevice)
	expectErrors(t, "Accept on the failed device", accepted, 1, ErrNoDevice)
	start := time.Now()
	_, err := Dial("rdma", ln.Addr().String())
	if !errors.Is(err, ErrNoDevice) {
		t.Errorf("Dial on the failed device: %v, want ErrNoDevice", err)
	}
	t.Logf("Dial failed in %v: %v", time.Since(start), err)
}

// Taking the RDMA netdev down raises a real port error: the connections on
// the port fail with ENETDOWN, dials fail fast while it is down, and once
// it is up again (port active) the same listener serves a new dial.
func TestPortDown(t *testing.T) {
	env := rdmatest.Require(t)
	if env.Netdev == "" {
		t.Fatal("RDMA_TEST_NETDEV is not set")
	}
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	defer s.Close()
	defer c.Close()
	link := func(state string) {
		t.Helper()
		if out, err := exec.Command("ip", "link", "set", env.Netdev, state).CombinedOutput(); err != nil {
			t.Fatalf("ip link set %s %s: %v: %s", env.Netdev, state, err, out)
		}
	}
	errc := blockedCalls(c)
	time.Sleep(rdmatest.Scale(50 * time.Millisecond))
	before := c.Stats().DeviceEvents
	start := time.Now()
	link("down")
	up := false
	defer func() {
		if !up {
			link("up")
		}
	}()
	expectErrors(t, "blocked when the port went down", errc, 2, syscall.ENETDOWN)
	t.Logf("port error noticed after %v", time.Since(start))
	if got := c.Stats().DeviceEvents; got <= before {
		t.Errorf("DeviceEvents %d -> %d, want more", before, got)
	}
	dialStart := time.Now()
	if _, err := (&Dialer{Timeout: rdmatest.Scale(5 * time.Second)}).DialContext(context.Background(), "rdma", ln.Addr().String()); err == nil {
		t.Error("Dial succeeded with the port down")
	} else {
		t.Logf("Dial with the port down failed after %v: %v", time.Since(dialStart), err)
	}
	link("up")
	up = true
	// Port active arrives shortly after the link; then dials work again.
	upAt := time.Now()
	deadline := upAt.Add(rdmatest.Scale(15 * time.Second))
	accepted := make(chan *Conn, 1)
	go func() {
		a, _ := ln.AcceptRDMA() // nil once the deferred ln.Close runs, if no dial got through
		accepted <- a
	}()
	for {
		c2, err := (&Dialer{Timeout: rdmatest.Scale(3 * time.Second)}).DialContext(context.Background(), "rdma", ln.Addr().String())
		if err == nil {
			s2 := <-accepted
			defer c2.Close()
			defer s2.Close()
			echoOnce(t, c2.(*Conn), s2)
			t.Logf("dial works again %v after the link came up", time.Since(upAt))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no dial works after the link came back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
