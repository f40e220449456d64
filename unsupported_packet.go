//go:build !linux || !cgo

package rdma

// PacketConn where there is no RDMA (see unsupported.go): ListenPacket
// resolves the address as on Linux, then fails with ErrNoDevice.

import (
	"context"
	"net"
	"net/netip"
	"time"

	"github.com/verbline/rdma/buffer"
)

func listenPacket(*Config, netip.AddrPort) (*PacketConn, error) { return nil, errNoRDMA }

// PacketConn sends and receives unreliable datagrams over RDMA; in this
// build none can be made (see ListenPacket).
type PacketConn struct{}

var _ net.PacketConn = (*PacketConn)(nil)

// ReadFrom fails: there is no RDMA in this build.
func (p *PacketConn) ReadFrom(b []byte) (int, net.Addr, error) { return 0, nil, opError("read") }

// ReadFromAddrPort fails: there is no RDMA in this build.
func (p *PacketConn) ReadFromAddrPort(b []byte) (int, netip.AddrPort, error) {
	return 0, netip.AddrPort{}, opError("read")
}

// WriteTo fails: there is no RDMA in this build.
func (p *PacketConn) WriteTo(b []byte, addr net.Addr) (int, error) { return 0, opError("write") }

// WriteToAddrPort fails: there is no RDMA in this build.
func (p *PacketConn) WriteToAddrPort(b []byte, addr netip.AddrPort) (int, error) {
	return 0, opError("write")
}

// Alloc fails: there is no RDMA in this build.
func (p *PacketConn) Alloc(n int) (buffer.Buf, error) { return buffer.Buf{}, opError("alloc") }

// SendTo fails: there is no RDMA in this build.
func (p *PacketConn) SendTo(ctx context.Context, b buffer.Buf, addr netip.AddrPort) error {
	return opError("send")
}

// Recv fails: there is no RDMA in this build.
func (p *PacketConn) Recv(ctx context.Context) (Datagram, error) { return Datagram{}, opError("recv") }

// Messages returns a closed channel.
func (p *PacketConn) Messages() <-chan Datagram { return closedDatagrams }

var closedDatagrams = closedChan[Datagram]()

// MaxDatagramSize returns 0.
func (p *PacketConn) MaxDatagramSize() int { return 0 }

// Close does nothing: no PacketConn can be open in this build.
func (p *PacketConn) Close() error { return nil }

// LocalAddr returns nil.
func (p *PacketConn) LocalAddr() net.Addr { return nil }

// SetDeadline fails: there is no RDMA in this build.
func (p *PacketConn) SetDeadline(t time.Time) error { return opError("set") }

// SetReadDeadline fails: there is no RDMA in this build.
func (p *PacketConn) SetReadDeadline(t time.Time) error { return opError("set") }

// SetWriteDeadline fails: there is no RDMA in this build.
func (p *PacketConn) SetWriteDeadline(t time.Time) error { return opError("set") }

// Stats returns zero counters.
func (p *PacketConn) Stats() PacketStats { return PacketStats{} }
