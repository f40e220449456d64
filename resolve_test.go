package rdma

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

// Host tests of address handling and error mapping: no RDMA device needed,
// and nothing here may depend on DNS (the Soft-RoCE guest has no network).

func TestCheckNetwork(t *testing.T) {
	for _, n := range []string{"rdma", "rdma4", "rdma6"} {
		if err := checkNetwork(n); err != nil {
			t.Errorf("checkNetwork(%q): %v", n, err)
		}
	}
	for _, n := range []string{"", "tcp", "tcp4", "udp", "RDMA", "rdma5", "ib"} {
		err := checkNetwork(n)
		var unknown net.UnknownNetworkError
		if !errors.As(err, &unknown) || string(unknown) != n {
			t.Errorf("checkNetwork(%q) = %v, want net.UnknownNetworkError(%q)", n, err, n)
		}
	}
}

func TestResolveLiterals(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		network, address string
		listen           bool
		want             string // the AddrPort, or "error: <substring>"
	}{
		{"rdma", "192.168.1.10:7471", false, "192.168.1.10:7471"},
		{"rdma4", "192.168.1.10:7471", false, "192.168.1.10:7471"},
		{"rdma", "[fe80::1]:1", false, "[fe80::1]:1"},
		{"rdma", "[fe80::1%rd0]:1", false, "[fe80::1%rd0]:1"},
		{"rdma6", "[2001:db8::7]:65535", false, "[2001:db8::7]:65535"},
		// An IPv4-mapped IPv6 address is the IPv4 address (rdma_cm binds it as such).
		{"rdma", "[::ffff:10.0.0.1]:9", false, "10.0.0.1:9"},
		{"rdma4", "[::ffff:10.0.0.1]:9", false, "10.0.0.1:9"},
		// The network picks the family, as net's tcp4 and tcp6 do.
		{"rdma6", "10.0.0.1:9", false, "error: network rdma6 takes only IPv6 addresses"},
		{"rdma6", "[::ffff:10.0.0.1]:9", false, "error: network rdma6 takes only IPv6 addresses"},
		{"rdma4", "[2001:db8::7]:9", false, "error: network rdma4 takes only IPv4 addresses"},
		{"rdma4", "[::]:0", true, "error: network rdma4 takes only IPv4 addresses"},
		// Ports: numbers in range and service names (Go knows the common ones
		// without /etc/services).
		{"rdma", "10.0.0.1:0", false, "10.0.0.1:0"},
		{"rdma", "10.0.0.1:http", false, "10.0.0.1:80"},
		{"rdma", "10.0.0.1:65536", false, `error: invalid port "65536"`},
		{"rdma", "10.0.0.1:-1", false, `error: invalid port "-1"`},
		{"rdma", "10.0.0.1:no-such-service-here", false, `error: invalid port "no-such-service-here"`},
		{"rdma", "10.0.0.1:", false, "10.0.0.1:0"}, // as net: an empty port is 0
		{"rdma", "10.0.0.1", false, "error: missing port in address"},
		{"rdma", "[fe80::1", false, "error: missing ']' in address"},
		// No host: an error when dialing, the wildcard of the family when listening.
		{"rdma", ":7471", false, "error: missing host in address"},
		{"rdma6", ":7471", false, "error: missing host in address"},
		{"rdma", ":7471", true, "0.0.0.0:7471"},
		{"rdma4", ":0", true, "0.0.0.0:0"},
		{"rdma6", ":0", true, "[::]:0"},
		{"rdma", "0.0.0.0:1", true, "0.0.0.0:1"},
		{"rdma", "[::]:1", true, "[::]:1"},
	} {
		got, err := resolve(ctx, tc.network, tc.address, tc.listen)
		what := tc.network + " " + tc.address
		if tc.listen {
			what += " (listen)"
		}
		if want, ok := strings.CutPrefix(tc.want, "error: "); ok {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("resolve %s = %v, %v; want an error saying %q", what, got, err, want)
			}
			continue
		}
		if err != nil || got != netip.MustParseAddrPort(tc.want) {
			t.Errorf("resolve %s = %v, %v; want %s", what, got, err, tc.want)
		}
	}
}

// Names are looked up as net does, then filtered by the network's family.
// "localhost" comes from /etc/hosts (the guest sees the host's), so its
// addresses decide what each network must give.
func TestResolveNames(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", "localhost")
	if err != nil || len(ips) == 0 {
		t.Fatalf("localhost does not resolve here (%v): the test needs it in /etc/hosts", err)
	}
	first := map[string]netip.Addr{}
	for _, ip := range ips {
		ip = ip.Unmap()
		for _, n := range []string{"rdma", "rdma4", "rdma6"} {
			if _, ok := first[n]; !ok && familyFits(n, ip) {
				first[n] = ip
			}
		}
	}
	t.Logf("localhost: %v", ips)
	for _, n := range []string{"rdma", "rdma4", "rdma6"} {
		got, err := resolve(ctx, n, "localhost:7471", false)
		want, ok := first[n]
		switch {
		case !ok && err == nil:
			t.Errorf("resolve %s localhost = %v; want an error (localhost has no address of that family)", n, got)
		case !ok && !strings.Contains(err.Error(), "no suitable address for localhost"):
			t.Errorf("resolve %s localhost: %v; want 'no suitable address'", n, err)
		case ok && (err != nil || got != netip.AddrPortFrom(want, 7471)):
			t.Errorf("resolve %s localhost = %v, %v; want %v", n, got, err, netip.AddrPortFrom(want, 7471))
		}
		if ok && (n == "rdma4" && !got.Addr().Is4() || n == "rdma6" && got.Addr().Is4()) {
			t.Errorf("resolve %s localhost gave %v, of the other family", n, got)
		}
	}
	// A name that cannot resolve (.invalid is reserved, RFC 6761): an error
	// from the resolver, whether or not DNS is reachable.
	if got, err := resolve(ctx, "rdma", "verbline-test.invalid:1", false); err == nil {
		t.Errorf("resolve of a .invalid name = %v, want an error", got)
	}
}

// DialContext takes net.Dialer's network names, so http.Transport and grpc
// can use it as is: tcp, tcp4 and tcp6 mean rdma, rdma4 and rdma6. Errors
// before any device is touched show the mapped network in the *net.OpError.
func TestDialContextNetworks(t *testing.T) {
	ctx := context.Background()
	var d Dialer
	for _, tc := range []struct {
		network, wantNet string
		unknown          bool
	}{
		{"tcp", "rdma", false},
		{"tcp4", "rdma4", false},
		{"tcp6", "rdma6", false},
		{"rdma", "rdma", false},
		{"rdma4", "rdma4", false},
		{"rdma6", "rdma6", false},
		{"tcp5", "rdma5", true},
		{"udp", "udp", true},
		{"unix", "unix", true},
		{"", "", true},
	} {
		// No host: resolve fails right after the network check, before any device work.
		c, err := d.DialContext(ctx, tc.network, ":7471")
		if c != nil {
			t.Fatalf("DialContext(%q) returned a non-nil net.Conn (%#v) with error %v", tc.network, c, err)
		}
		var op *net.OpError
		if !errors.As(err, &op) {
			t.Fatalf("DialContext(%q): %T %v, want *net.OpError", tc.network, err, err)
		}
		if op.Op != "dial" || op.Net != tc.wantNet {
			t.Errorf("DialContext(%q): Op %q Net %q, want dial %q", tc.network, op.Op, op.Net, tc.wantNet)
		}
		var unknown net.UnknownNetworkError
		if got := errors.As(err, &unknown); got != tc.unknown {
			t.Errorf("DialContext(%q): %v; unknown network %v, want %v", tc.network, err, got, tc.unknown)
		}
		if !tc.unknown && !strings.Contains(err.Error(), "missing host") {
			t.Errorf("DialContext(%q): %v, want the missing host error", tc.network, err)
		}
	}
	// Dial itself takes only rdma networks (TestBadAddresses checks it on a device too).
	var unknown net.UnknownNetworkError
	if _, err := Dial("tcp", "10.0.0.1:1"); !errors.As(err, &unknown) {
		t.Errorf(`Dial("tcp"): %v, want an unknown network`, err)
	}
}

// Errors from Dial and Listen before a connection exists: *net.OpError with
// the op, the network asked for and the address when it parses.
func TestDialListenErrorShape(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		op, network, address string
		wantAddr             string // "" for none
		wantErr              string
	}{
		{"dial", "ib", "10.0.0.1:1", "10.0.0.1:1", "unknown network ib"},
		{"dial", "rdma", ":1", "", "missing host"},
		{"dial", "rdma", "no-port", "", "missing port"},
		{"dial", "rdma6", "10.0.0.1:1", "10.0.0.1:1", "no suitable address"},
		{"listen", "udp", "10.0.0.1:1", "10.0.0.1:1", "unknown network udp"},
		{"listen", "rdma", "10.0.0.1:99999", "", "invalid port"},
		{"listen", "rdma4", "[::1]:0", "[::1]:0", "no suitable address"},
	} {
		var err error
		if tc.op == "dial" {
			_, err = (&Dialer{}).DialContext(ctx, tc.network, tc.address)
		} else {
			_, err = (&ListenConfig{}).Listen(ctx, tc.network, tc.address)
		}
		var op *net.OpError
		if !errors.As(err, &op) {
			t.Errorf("%s %s %s: %T %v, want *net.OpError", tc.op, tc.network, tc.address, err, err)
			continue
		}
		if op.Op != tc.op || op.Net != tc.network || op.Source != nil {
			t.Errorf("%s %s %s: OpError{Op %q Net %q Source %v}", tc.op, tc.network, tc.address, op.Op, op.Net, op.Source)
		}
		gotAddr := ""
		if op.Addr != nil {
			gotAddr = op.Addr.String()
			if op.Addr.Network() != "rdma" {
				t.Errorf("%s %s %s: Addr.Network() %q", tc.op, tc.network, tc.address, op.Addr.Network())
			}
		}
		if gotAddr != tc.wantAddr {
			t.Errorf("%s %s %s: Addr %q, want %q", tc.op, tc.network, tc.address, gotAddr, tc.wantAddr)
		}
		if !strings.Contains(err.Error(), tc.wantErr) || !strings.HasPrefix(err.Error(), tc.op+" "+tc.network) {
			t.Errorf("%s %s %s: %q, want %q after %q", tc.op, tc.network, tc.address, err, tc.wantErr, tc.op+" "+tc.network)
		}
	}
}

// Without an RDMA device (the build host), Dial and Listen must fail with
// ErrNoDevice, never crash; with one (the Soft-RoCE guest), listening on the
// wildcard works and reports the port it picked.
func TestListenWildcardOrNoDevice(t *testing.T) {
	ln, err := Listen("rdma", ":0")
	if err == nil {
		defer ln.Close()
		a, ok := ln.Addr().(*Addr)
		if !ok || !a.AddrPort.Addr().IsUnspecified() || a.AddrPort.Port() == 0 {
			t.Fatalf("listening on :0: Addr() = %v, want the wildcard and a picked port", ln.Addr())
		}
		t.Logf("device present: listening on %v", a)
		return
	}
	if os.Getenv("RDMA_TEST_DEVICE") != "" {
		t.Fatalf("listen on the wildcard with an RDMA device (%s): %v", os.Getenv("RDMA_TEST_DEVICE"), err)
	}
	var op *net.OpError
	if !errors.Is(err, ErrNoDevice) || !errors.As(err, &op) || op.Op != "listen" || op.Net != "rdma" {
		t.Fatalf("listen without a device: %v, want a listen *net.OpError wrapping ErrNoDevice", err)
	}
	if _, err := Dial("rdma", "10.0.0.1:7471"); !errors.Is(err, ErrNoDevice) || !errors.As(err, &op) || op.Op != "dial" {
		t.Fatalf("dial without a device: %v, want a dial *net.OpError wrapping ErrNoDevice", err)
	}
	t.Logf("no device: %v", err)
}
