package rdma

// Unreliable datagrams: PacketConn (packetconn.go on Linux with cgo,
// unsupported_packet.go elsewhere). This file holds what every build
// shares: ListenPacket, the errors and the types of the zero-copy form.

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"

	"github.com/verbline/rdma/buffer"
)

// ErrDatagramTooLarge: a datagram is larger than one packet of the path can
// carry (PacketConn.MaxDatagramSize), or than the receiving PacketConn
// accepts. Unreliable datagrams are never split.
var ErrDatagramTooLarge = errors.New("datagram larger than the path MTU allows " +
	"(see PacketConn.MaxDatagramSize: the port's active MTU minus the 24-byte datagram header; " +
	"split the payload, or use a Conn, whose messages have no such limit)")

// ListenPacket opens a PacketConn: unreliable datagrams (an RDMA UD queue
// pair) on address, "host:port" where host is the IP of one RDMA netdev and
// port 0 picks a free port. The networks are "rdma", "rdma4" and "rdma6";
// "udp", "udp4" and "udp6" are taken to mean them, as Dialer.DialContext
// takes "tcp".
func ListenPacket(network, address string) (*PacketConn, error) {
	var lc ListenConfig
	return lc.ListenPacket(context.Background(), network, address)
}

// ListenPacket is ListenPacket with lc's Config: RecvBuffers is how many
// datagrams may wait to be read (0 means 256 here: a datagram that finds no
// receive posted is dropped, as UDP drops on a full socket buffer),
// SendBuffers how many sends may be in flight (0 means 64), and the poll
// settings apply as for connections. Admit does not apply (there is no
// connection to admit). ctx bounds only the set-up.
func (lc *ListenConfig) ListenPacket(ctx context.Context, network, address string) (*PacketConn, error) {
	if strings.HasPrefix(network, "udp") {
		network = "rdma" + strings.TrimPrefix(network, "udp")
	}
	cfg := lc.Config
	if cfg.RecvBuffers == 0 {
		cfg.RecvBuffers = defaultPacketRecvBuffers
	}
	cfg = cfg.withDefaults()
	ap, err := lc.listenAddr(ctx, network, address)
	if err != nil {
		return nil, err
	}
	p, err := listenPacket(&cfg, ap)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Addr: &Addr{ap}, Err: err}
	}
	return p, nil
}

// defaultPacketRecvBuffers is a PacketConn's receive ring when
// Config.RecvBuffers is 0.
const defaultPacketRecvBuffers = 256

// Datagram is one received datagram of the zero-copy form
// (PacketConn.Messages, PacketConn.Recv): Buf is the receive buffer the NIC
// wrote the payload into, exactly the payload long, and From the sender's
// address, which PacketConn.SendTo and WriteToAddrPort answer. Buf is the
// receiver's until its Release (which posts the buffer for the next
// datagram); it may instead be passed to SendTo, or to a Conn's Send on the
// same device, to forward it without a copy.
type Datagram struct {
	Buf  buffer.Buf
	From netip.AddrPort
}

// Bytes is the payload (valid until Release).
func (d Datagram) Bytes() []byte { return d.Buf.Bytes() }

// Release gives the buffer back for the next datagram.
func (d Datagram) Release() error { return d.Buf.Release() }

// PacketStats counts a PacketConn's datagrams and the work behind them.
type PacketStats struct {
	// Sent and Received count datagrams; Dropped counts those received and
	// discarded: not from a verbline PacketConn (no header, or another
	// header version), a sender address the network's header contradicts,
	// or a receive the device reported failed. Datagrams that found no
	// receive posted are dropped by the device and counted nowhere here.
	Sent, Received, Dropped uint64
	// Resolutions counts address resolutions (rdma_cm's SIDR exchange) this
	// side made; Peers is how many destinations have an address handle
	// cached now (at most 1024; the least recently used goes first).
	Resolutions uint64
	Peers       int
	// Doorbells (post calls) and work requests as ConnStats counts them.
	SendPosts, SendWRs, Signaled, Inlined, RecvPosts, RecvWRs uint64
	// From the device poller (shared with the device's connections), as in
	// ConnStats: diagnostics whose meaning follows the implementation.
	PollCalls, Completions, PollerSleeps, PollerWakeups uint64
	InlinePolls, EmptyPolls, Parks, Arms                uint64
}

// addrPortOf turns a net.Addr given to WriteTo into an address: an *Addr, a
// *net.UDPAddr (code written for UDP passes those), or anything whose
// String is "ip:port".
func addrPortOf(a net.Addr) (netip.AddrPort, error) {
	switch a := a.(type) {
	case *Addr:
		if a != nil {
			return a.AddrPort, nil
		}
	case *net.UDPAddr:
		if a != nil {
			return a.AddrPort(), nil
		}
	case nil:
	default:
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			return ap, nil
		}
		return netip.AddrPort{}, errors.New("address " + a.String() + " is not ip:port")
	}
	return netip.AddrPort{}, errors.New("missing address")
}
