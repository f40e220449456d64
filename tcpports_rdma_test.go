//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/cmsetup"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/rdmatest"
)

// TestDialTCPPortTaken: on iWARP a dial is a kernel TCP connection from the
// port rdma_cm chose, and rdma_cm does not ask TCP whether that port is
// free. With the ephemeral range narrowed to two ports A and A+1 and
// rdma_cm made to pick A first (its last port was A+1): where TCP holds A
// (bound by an ordinary TCP connection: the connect fails with EADDRINUSE;
// or a live connection from A to the listener's port, as a closed
// connection's socket may still be: EADDRNOTAVAIL) the dial is made again
// and connects from A+1; where TCP holds both it fails after its attempts
// with an error that says so. On a device whose CM does not use TCP (RoCE,
// InfiniBand) each dial connects from A.
func TestDialTCPPortTaken(t *testing.T) {
	env := rdmatest.Require(t)
	checkLeaksAtEnd(t)
	iwarp := OnIWARPDevice(t)
	ip := netip.MustParseAddr(env.Addr)

	a := twoFreePorts(t, ip)
	b := a + 1
	// The listeners' ports and a TCP listener to hold ports with, all
	// outside the range narrowed below.
	lports := []uint16{freePort(t, ip), freePort(t, ip), freePort(t, ip)}
	holder, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	restore := setPortRange(t, a, b)
	defer restore()

	for i, tc := range []struct {
		name      string
		bound     []uint16 // bound by a TCP connection to another port
		pair      []uint16 // connected over TCP to the listener's port
		connectOK bool     // on iWARP
	}{
		{"port bound", []uint16{a}, nil, true},
		{"pair connected", nil, []uint16{a}, true},
		{"both taken", []uint16{a}, []uint16{b}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lport := lports[i]
			for _, p := range tc.pair {
				defer holdPair(t, netip.AddrPortFrom(ip, p), netip.AddrPortFrom(ip, lport))()
			}
			for _, p := range tc.bound {
				defer holdPort(t, holder, netip.AddrPortFrom(ip, p))()
			}
			lc := ListenConfig{}
			ln, err := lc.Listen(context.Background(), "rdma", netip.AddrPortFrom(ip, lport).String())
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() { io.Copy(io.Discard, c); c.Close() }()
				}
			}()
			lastUsedPort(t, ip, ln.Addr().(*Addr).AddrPort, b) // rdma_cm's next pick is A
			d := Dialer{Timeout: rdmatest.Scale(10 * time.Second)}
			c, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
			if !iwarp || tc.connectOK {
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				defer c.Close()
				want := a
				if iwarp {
					want = b // TCP held A: the dial was made again
				}
				if got := c.LocalAddr().(*Addr).AddrPort.Port(); got != want {
					t.Errorf("connected from port %d, want %d (range %d-%d)", got, want, a, b)
				}
				t.Logf("connected from port %d", c.LocalAddr().(*Addr).AddrPort.Port())
				return
			}
			if err == nil {
				c.Close()
				t.Fatalf("dial connected from %v although TCP holds both ports", c.LocalAddr())
			}
			if !errors.Is(err, errTCPPortTaken) || !strings.Contains(err.Error(), "TCP holds the local port") {
				t.Fatalf("dial: %v; want the error saying TCP holds the port", err)
			}
			t.Logf("refused as it should be: %v", err)
		})
	}
}

// holdPort makes a TCP connection from port from to holder, the way an
// ordinary client holds its ephemeral port; the returned func ends it, the
// holder's side first (so that from is left free, with no TIME_WAIT).
func holdPort(t *testing.T, holder net.Listener, from netip.AddrPort) func() {
	t.Helper()
	return connectFrom(t, holder, net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(from)})
}

// connectFrom dials ln with d and accepts the connection; the returned
// func ends it, ln's side first (d's end is left with no TIME_WAIT).
func connectFrom(t *testing.T, ln net.Listener, d net.Dialer) func() {
	t.Helper()
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("TCP dial from %v to %v: %v", d.LocalAddr, ln.Addr(), err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		s.Close()
		io.Copy(io.Discard, c)
		c.Close()
	}
}

// freePort returns a port free on ip for TCP.
func freePort(t *testing.T, ip netip.Addr) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

// twoFreePorts returns a port A such that A and A+1 are free on ip for TCP.
func twoFreePorts(t *testing.T, ip netip.Addr) uint16 {
	t.Helper()
	for range 100 {
		l1, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
		if err != nil {
			t.Fatal(err)
		}
		a := uint16(l1.Addr().(*net.TCPAddr).Port)
		l2, err := net.Listen("tcp", netip.AddrPortFrom(ip, a+1).String())
		l1.Close()
		if err == nil {
			l2.Close()
			return a
		}
	}
	t.Fatal("found no two adjacent free ports")
	return 0
}

// reuseAddr sets SO_REUSEADDR on a socket before it binds.
func reuseAddr(_, _ string, rc syscall.RawConn) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	}); err != nil {
		return err
	}
	return serr
}

const portRangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// setPortRange narrows the ephemeral port range, which rdma_cm picks its
// ports from, to lo-hi; the returned func puts it back.
func setPortRange(t *testing.T, lo, hi uint16) func() {
	t.Helper()
	// The range is the machine's: narrowed, it fails other programs'
	// connections. The Soft-RoCE guest (scripts/softroce) is this test's own.
	if os.Getenv("SOFTROCE_GUEST") == "" && os.Getenv("RDMA_TEST_PORT_RANGE") == "" {
		t.Skip("narrowing the ephemeral port range would disturb every program on this machine: " +
			"the test runs inside scripts/softroce's guest, or set RDMA_TEST_PORT_RANGE=1 to run it here")
	}
	old, err := os.ReadFile(portRangeFile)
	if err != nil {
		t.Skipf("cannot read the ephemeral port range: %v", err)
	}
	if err := os.WriteFile(portRangeFile, fmt.Appendf(nil, "%d %d\n", lo, hi), 0); err != nil {
		t.Skipf("cannot narrow the ephemeral port range (needs root): %v", err)
	}
	return func() {
		if err := os.WriteFile(portRangeFile, old, 0); err != nil {
			t.Errorf("restoring the ephemeral port range %q: %v", old, err)
		}
	}
}

// holdPair makes a TCP connection from from to to and closes the listener
// it took at to, so that a listener can take to again: the connection's
// sockets have SO_REUSEADDR (as siw's own), so they do not hold either port
// against another such socket, but a new connection between the same two
// ports is refused (EADDRNOTAVAIL). The returned func ends the connection,
// to's side first (so that from is left with no TIME_WAIT).
func holdPair(t *testing.T, from, to netip.AddrPort) func() {
	t.Helper()
	tl, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(to))
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	return connectFrom(t, tl, net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(from), Control: reuseAddr})
}

// lastUsedPort makes port the last one rdma_cm handed out, so that it
// hands out the other port of the narrowed range next (it never hands out
// its last port twice in a row): ids are resolved towards dst, one at a
// time, until one gets port.
func lastUsedPort(t *testing.T, ip netip.Addr, dst netip.AddrPort, port uint16) {
	t.Helper()
	for range 4 {
		if resolvedPort(t, ip, dst) == port {
			return
		}
	}
	t.Fatalf("rdma_cm never gave port %d", port)
}

// resolvedPort is the port rdma_cm gives an id resolved from ip to dst.
func resolvedPort(t *testing.T, ip netip.Addr, dst netip.AddrPort) uint16 {
	t.Helper()
	ch, id, err := cmsetup.NewChannelID()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	defer id.Destroy()
	if err := id.ResolveAddr(netip.AddrPortFrom(ip, 0), dst, 2000); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(5*time.Second))
	defer cancel()
	if _, err := cmsetup.Expect(ctx, ch, rdmacm.EventAddrResolved, "resolving the address"); err != nil {
		t.Fatal(err)
	}
	return id.LocalAddr().Port()
}
