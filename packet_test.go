package rdma

import (
	"net"
	"net/netip"
	"testing"
)

// addrPortOf accepts what code written for UDP passes to WriteTo.
func TestAddrPortOf(t *testing.T) {
	want := netip.MustParseAddrPort("169.254.77.1:7471")
	for _, a := range []net.Addr{
		&Addr{want},
		&net.UDPAddr{IP: net.ParseIP("169.254.77.1"), Port: 7471},
		&net.TCPAddr{IP: net.ParseIP("169.254.77.1"), Port: 7471}, // by its String
	} {
		got, err := addrPortOf(a)
		if err != nil || got.Addr().Unmap() != want.Addr() || got.Port() != want.Port() {
			t.Errorf("%T %v: %v, %v", a, a, got, err)
		}
	}
	v6 := netip.MustParseAddrPort("[fe80::1]:9")
	if got, err := addrPortOf(&net.UDPAddr{IP: net.ParseIP("fe80::1"), Port: 9}); err != nil || got != v6 {
		t.Errorf("IPv6: %v, %v", got, err)
	}
	for _, a := range []net.Addr{nil, (*Addr)(nil), (*net.UDPAddr)(nil), &net.IPAddr{IP: net.ParseIP("10.0.0.1")}, &net.UnixAddr{Name: "/x"}} {
		if got, err := addrPortOf(a); err == nil {
			t.Errorf("%T %v: accepted as %v", a, a, got)
		}
	}
}
