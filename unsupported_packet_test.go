//go:build !linux || !cgo

package rdma

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"
)

func TestNoRDMAListenPacket(t *testing.T) {
	p, err := ListenPacket("rdma", "10.0.0.1:7471")
	if p != nil {
		t.Errorf("ListenPacket returned a PacketConn")
	}
	checkNoRDMA(t, "ListenPacket", err, "listen", "rdma", "10.0.0.1:7471")

	// "udp" means "rdma", as "tcp" does for DialContext.
	p, err = (&ListenConfig{}).ListenPacket(context.Background(), "udp4", "10.0.0.2:0")
	if p != nil {
		t.Errorf("ListenPacket returned a PacketConn")
	}
	checkNoRDMA(t, "ListenPacket udp4", err, "listen", "rdma4", "10.0.0.2:0")

	if _, err := ListenPacket("ip", "10.0.0.1:1"); !errors.As(err, new(net.UnknownNetworkError)) {
		t.Errorf("ListenPacket(ip): %v, want an UnknownNetworkError", err)
	}

	// The zero value's methods fail the same way (none can be obtained).
	var z PacketConn
	if _, _, err := z.ReadFrom(nil); !errors.Is(err, ErrNoDevice) {
		t.Errorf("ReadFrom: %v", err)
	}
	if _, err := z.WriteToAddrPort(nil, netip.MustParseAddrPort("10.0.0.1:1")); !errors.Is(err, ErrNoDevice) {
		t.Errorf("WriteToAddrPort: %v", err)
	}
	if err := z.SetDeadline(time.Now()); !errors.Is(err, ErrNoDevice) {
		t.Errorf("SetDeadline: %v", err)
	}
	if _, ok := <-z.Messages(); ok {
		t.Errorf("Messages is open")
	}
	if z.MaxDatagramSize() != 0 || z.Close() != nil || z.LocalAddr() != nil {
		t.Errorf("zero PacketConn: MaxDatagramSize %d, LocalAddr %v", z.MaxDatagramSize(), z.LocalAddr())
	}
}
