package rdma

// Unreliable datagrams: PacketConn, written once here over the UD endpoint
// (internal/ud's Endpoint through packetconn.go on Linux with cgo,
// engine_stub.go elsewhere), with
// ListenPacket, the errors and the types of the zero-copy form.

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/errs"
)

// ErrDatagramTooLarge: a datagram is larger than one packet of the path can
// carry (PacketConn.MaxDatagramSize), or than the receiving PacketConn
// accepts. Unreliable datagrams are never split. It is internal/errs'
// value, which the UD endpoint wraps.
var ErrDatagramTooLarge = errs.ErrDatagramTooLarge

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

// PacketConn sends and receives unreliable datagrams over an RDMA UD queue
// pair; it implements net.PacketConn. Like UDP: a datagram arrives whole or
// not at all, in no guaranteed order, at most one packet long
// (MaxDatagramSize: the port's active MTU minus a 24-byte header, 1000
// bytes on Soft-RoCE's 1024-byte MTU), and nothing waits for a slow
// receiver: a datagram that finds none of the receiver's buffers posted is
// dropped. Many goroutines may call its methods at once.
//
// Addresses are "ip:port" as for connections, in rdma_cm's UDP port space
// (a PacketConn and a Listener may use the same port number). The first
// datagram to an address resolves it through rdma_cm (an SIDR exchange
// with the PacketConn bound there, which answers with its QP number and
// Q_Key); the result, an address handle, is cached (1024 destinations, the
// least recently used evicted first) and resolved again after 30 s without
// news of the peer, so a peer that restarted on the same port is found
// again. A received datagram changes only what it proves about its sender
// (docs/datagram-protocol.md): it never evicts or rewrites a destination
// this side resolved. A write to an address where nothing listens fails
// with syscall.ECONNREFUSED. Every datagram carries a 24-byte header with the
// sender's address (docs/datagram-protocol.md), which ReadFrom returns:
// WriteTo answers it without a resolution on RoCE, where the network
// header of the received datagram gives the way back.
//
// ReadFrom and WriteTo copy; the zero-copy form is Alloc and SendTo, and
// Messages or Recv, whose Datagram holds the receive buffer the NIC wrote.
//
// Each method is written once here over the UD endpoint (internal/ud,
// through packetconn.go; engine_stub.go in builds without RDMA).
type PacketConn struct {
	udEndpoint
}

var _ net.PacketConn = (*PacketConn)(nil)

// opError wraps an endpoint error for the user, as package net does.
func (p *PacketConn) opError(op string, addr net.Addr, err error) error {
	return &net.OpError{Op: op, Net: "rdma", Source: p.localAddr(), Addr: addr, Err: err}
}

// ReadFrom reads the next datagram into b and returns its length and
// sender; a datagram longer than b is truncated (the rest is discarded, as
// for UDP). It waits, bounded by the read deadline, while none has arrived.
// The sender's address is an *Addr, which WriteTo answers.
func (p *PacketConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, from, err := p.readFrom(b)
	if err != nil {
		return n, nil, p.opError("read", nil, err)
	}
	return n, &Addr{from}, nil
}

// ReadFromAddrPort is ReadFrom returning the sender as a netip.AddrPort,
// which costs no allocation (as net.UDPConn's ReadFromUDPAddrPort).
func (p *PacketConn) ReadFromAddrPort(b []byte) (int, netip.AddrPort, error) {
	n, from, err := p.readFrom(b)
	if err != nil {
		err = p.opError("read", nil, err)
	}
	return n, from, err
}

// Recv waits (bounded by ctx and the read deadline) for the next datagram
// and returns it without a copy: its Buf is the receive buffer the NIC
// wrote the payload into, the caller's until its Release.
func (p *PacketConn) Recv(ctx context.Context) (Datagram, error) {
	d, err := p.recvDatagram(ctx)
	if err != nil {
		err = p.opError("recv", nil, err)
	}
	return d, err
}

// Messages delivers received datagrams as they arrive (the zero-copy form
// of ReadFrom); each must be released. It is closed when the PacketConn is
// (or fails: Recv then says why). While its receiver holds a datagram, one
// fewer receive is posted for new ones.
func (p *PacketConn) Messages() <-chan Datagram { return p.messages() }

// WriteTo sends b as one datagram to addr (an *Addr, a *net.UDPAddr, or
// any net.Addr whose String is "ip:port"). It returns once the datagram is
// posted; it waits (bounded by the write deadline) only for a free send
// slot and, for an address not yet known, for its resolution. A datagram
// larger than MaxDatagramSize, or than the peer accepts, fails with an
// error matching ErrDatagramTooLarge.
func (p *PacketConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	ap, err := addrPortOf(addr)
	if err == nil {
		err = p.send(context.Background(), b, buffer.Buf{}, ap)
	}
	if err != nil {
		return 0, p.opError("write", addr, err)
	}
	return len(b), nil
}

// WriteToAddrPort is WriteTo with a netip.AddrPort (as net.UDPConn's).
func (p *PacketConn) WriteToAddrPort(b []byte, addr netip.AddrPort) (int, error) {
	if err := p.send(context.Background(), b, buffer.Buf{}, addr); err != nil {
		return 0, p.opError("write", &Addr{addr}, err)
	}
	return len(b), nil
}

// Alloc returns a registered buffer of n bytes from the device's pool, for
// SendTo (which refuses a buffer longer than MaxDatagramSize with
// ErrDatagramTooLarge).
func (p *PacketConn) Alloc(n int) (buffer.Buf, error) {
	b, err := p.alloc(n)
	if err != nil {
		return buffer.Buf{}, p.opError("alloc", nil, err)
	}
	return b, nil
}

// SendTo sends b as one datagram to addr without copying it: the device
// reads the payload from b. b is the PacketConn's from the call on, whatever
// the outcome, and is released once the device has sent it. b may be a
// Buf from Alloc, from a Conn's Alloc on the same device, or a received
// Datagram's Buf (forwarded as it is). It waits as WriteTo does, bounded
// also by ctx.
func (p *PacketConn) SendTo(ctx context.Context, b buffer.Buf, addr netip.AddrPort) error {
	if err := p.sendTo(ctx, b, addr); err != nil {
		return p.opError("send", &Addr{addr}, err)
	}
	return nil
}

// MaxDatagramSize is the largest payload WriteTo and SendTo send: the
// port's active MTU minus the 24-byte datagram header (1000 bytes on a
// 1024-byte MTU). A peer may accept less (it says so in its datagrams and
// in its answer to an address resolution); sends above its limit fail too.
func (p *PacketConn) MaxDatagramSize() int { return p.maxDatagramSize() }

// Close closes the PacketConn: blocked reads and writes return
// net.ErrClosed, sends already posted may or may not leave, datagrams
// received and not read are dropped, and every RDMA resource is released
// (datagrams the user holds stay valid until their Release).
func (p *PacketConn) Close() error {
	if err := p.close(); err != nil {
		return p.opError("close", nil, err)
	}
	return nil
}

// LocalAddr is the address the PacketConn is bound to (an *Addr).
func (p *PacketConn) LocalAddr() net.Addr { return p.localAddr() }

// SetDeadline sets the read and write deadlines.
func (p *PacketConn) SetDeadline(t time.Time) error {
	if err := p.setDeadline(t, true, true); err != nil {
		return p.opError("set deadline", nil, err)
	}
	return nil
}

// SetReadDeadline sets the deadline of ReadFrom and Recv calls, pending and future.
func (p *PacketConn) SetReadDeadline(t time.Time) error {
	if err := p.setDeadline(t, true, false); err != nil {
		return p.opError("set read deadline", nil, err)
	}
	return nil
}

// SetWriteDeadline sets the deadline of WriteTo and SendTo calls, pending and future.
func (p *PacketConn) SetWriteDeadline(t time.Time) error {
	if err := p.setDeadline(t, false, true); err != nil {
		return p.opError("set write deadline", nil, err)
	}
	return nil
}

// Stats returns the PacketConn's counters.
func (p *PacketConn) Stats() PacketStats { return p.stats() }
