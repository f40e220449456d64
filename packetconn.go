//go:build linux && cgo

package rdma

import (
	"context"
	"net"
	"net/netip"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/ud"
	"github.com/verbline/rdma/internal/verbs"
)

// What a PacketConn's UD endpoint (internal/ud) takes from this package,
// which it cannot import: its options from the Config, the device
// acquisition with the Config's device settings, and this package's
// Datagram, the type it delivers datagrams as (its channel is Messages'
// as it is).

// udEndpoint is the RDMA side of a PacketConn: the endpoint, held by
// value, and the local address as an *Addr (made once: LocalAddr and every
// error carry it).
type udEndpoint struct {
	ep    ud.Endpoint[Datagram]
	laddr *Addr
}

// Variables so that tests can shrink them (ud.Options says what each is).
var (
	udMaxPeers = 1024
	udPeerTTL  = 30 * time.Second
	udRecheck  = time.Second
)

// udOptions is what a PacketConn's endpoint takes from cfg (defaults
// applied).
func udOptions(cfg *Config) *ud.Options {
	return &ud.Options{
		RecvBuffers: cfg.RecvBuffers, SendBuffers: cfg.SendBuffers,
		Backlog:        cfg.Backlog,
		ConnectTimeout: cfg.ConnectTimeout,
		PollEvent:      cfg.PollMode == PollEvent,
		PollSpin:       cfg.PollSpin,
		MaxPeers:       udMaxPeers,
		PeerTTL:        udPeerTTL,
		Recheck:        udRecheck,
		AcquireDevice:  func(ctx *verbs.Context) (*device.Device, error) { return acquireDevice(ctx, cfg) },
	}
}

func listenPacket(cfg *Config, ap netip.AddrPort) (*PacketConn, error) {
	pc := &PacketConn{}
	if err := pc.ep.Listen(ap, udOptions(cfg)); err != nil {
		return nil, err
	}
	pc.laddr = &Addr{pc.ep.LocalAddrPort()}
	return pc, nil
}

// The PacketConn's operations on the endpoint (packet.go writes each public
// method once over them).

func (p *udEndpoint) readFrom(b []byte) (int, netip.AddrPort, error) { return p.ep.ReadFrom(b) }
func (p *udEndpoint) recvDatagram(ctx context.Context) (Datagram, error) {
	return p.ep.Recv(ctx)
}
func (p *udEndpoint) messages() <-chan Datagram                  { return p.ep.Messages() }
func (p *udEndpoint) alloc(n int) (buffer.Buf, error)            { return p.ep.Alloc(n) }
func (p *udEndpoint) maxDatagramSize() int                       { return p.ep.MaxDatagramSize() }
func (p *udEndpoint) close() error                               { return p.ep.Close() }
func (p *udEndpoint) localAddr() net.Addr                        { return p.laddr }
func (p *udEndpoint) setDeadline(t time.Time, rd, wr bool) error { return p.ep.SetDeadline(t, rd, wr) }
func (p *udEndpoint) stats() PacketStats                         { return PacketStats(p.ep.Stats()) }

func (p *udEndpoint) send(ctx context.Context, payload []byte, zb buffer.Buf, to netip.AddrPort) error {
	return p.ep.Send(ctx, payload, zb, to)
}

// sendTo sends b by reference; b is the endpoint's whatever the outcome.
func (p *udEndpoint) sendTo(ctx context.Context, b buffer.Buf, to netip.AddrPort) error {
	return p.ep.SendTo(ctx, b, to)
}
