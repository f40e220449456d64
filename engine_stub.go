//go:build !linux || !cgo

package rdma

// This file stands in for the RDMA engine where there is none: a build
// without cgo (CGO_ENABLED=0) or for a system other than Linux. The public
// API is written once (conn.go, listener.go, packet.go) over the engine,
// acceptor and UD endpoint types; here they are empty, and every operation
// fails with errNoRDMA, so code that imports the package builds, and its
// host tests run, anywhere (apicheck, run by make vet, compares the exported
// API of both builds).
// Dial, Listen, Dialer.DialContext and ListenConfig.Listen check the
// network and resolve the address as on Linux, then fail with a
// *net.OpError wrapping ErrNoDevice that says what RDMA needs. No RDMA
// *Conn, *Listener or *Export can be obtained here; the methods of their
// zero values report the same error, and a Fallback's TCP connections work
// as on Linux.

import (
	"context"
	"io"
	"net"
	"net/netip"
	"runtime"
	"time"

	"github.com/verbline/rdma/buffer"
)

// noRDMAError is the error of every operation in a build without RDMA. It
// wraps ErrNoDevice, whose own text (which driver or Soft-RoCE to add) would
// mislead here: the machine may have a device, the binary cannot use it.
type noRDMAError struct{}

func (noRDMAError) Error() string {
	build := "CGO_ENABLED=0"
	if runtime.GOOS != "linux" {
		build = "GOOS=" + runtime.GOOS
	}
	return "no RDMA support in this build (" + build + "): RDMA needs cgo and rdma-core on Linux " +
		"(build on Linux with CGO_ENABLED=1 and the rdma-core headers installed: libibverbs-dev and librdmacm-dev, " +
		"or rdma-core-devel)"
}

func (noRDMAError) Unwrap() error { return ErrNoDevice }

var errNoRDMA error = noRDMAError{}

// dialConn and listen are where the Linux build starts using rdma_cm.
func dialConn(context.Context, *Config, netip.AddrPort, netip.AddrPort) (*Conn, error) {
	return nil, errNoRDMA
}

func listen(*Config, netip.AddrPort, func(netip.AddrPort) error) (*Listener, error) {
	return nil, errNoRDMA
}

func iwarpDevices() []string { return nil }

func opError(op string) error { return &net.OpError{Op: op, Net: "rdma", Err: errNoRDMA} }

// engine is the RDMA connection engine of engine.go; none here.
type engine struct{}

func (*engine) read([]byte) (int, error)                     { return 0, errNoRDMA }
func (*engine) writeTo(io.Writer) (n int64, werr, err error) { return 0, nil, errNoRDMA }
func (*engine) write([]byte) (int, error)                    { return 0, errNoRDMA }
func (*engine) closeWrite() error                            { return errNoRDMA }
func (*engine) close() error                                 { return nil } // nothing is open
func (*engine) setDeadline(time.Time, bool, bool) error      { return errNoRDMA }
func (*engine) localAddr() net.Addr                          { return nil }
func (*engine) remoteAddr() net.Addr                         { return nil }
func (*engine) stats() ConnStats                             { return ConnStats{} }
func (*engine) qpInfo() (QPInfo, error)                      { return QPInfo{}, errNoRDMA }
func (*engine) deviceInfo() (DeviceInfo, error)              { return DeviceInfo{}, errNoRDMA }
func (*engine) maxMessageSize() int                          { return 0 }
func (*engine) alloc(int) (buffer.Buf, error)                { return buffer.Buf{}, errNoRDMA }
func (*engine) messages() <-chan buffer.Buf                  { return closedMessages }
func (*engine) recv(context.Context) (buffer.Buf, error)     { return buffer.Buf{}, errNoRDMA }
func (*engine) export(buffer.Buf, Access) (*Export, error)   { return nil, errNoRDMA }
func (*engine) notifications() <-chan Notification           { return closedNotifications }
func (*engine) recvNotification(context.Context) (Notification, error) {
	return Notification{}, errNoRDMA
}
func (*engine) completions() <-chan OpCompletion { return closedCompletions }
func (*engine) recvCompletion(context.Context) (OpCompletion, error) {
	return OpCompletion{}, errNoRDMA
}

// sendMessage releases b: a sent Buf belongs to the connection whatever the
// outcome.
func (*engine) sendMessage(_ context.Context, b buffer.Buf, _ bool, _ uint64) error {
	b.Release()
	return errNoRDMA
}

func (*engine) writeRemote(context.Context, buffer.Buf, RemoteBuf, uint64, uint32, bool, bool, uint64) error {
	return errNoRDMA
}

func (*engine) readRemote(context.Context, buffer.Buf, RemoteBuf, uint64, bool, uint64) error {
	return errNoRDMA
}

func (*engine) compareAndSwap(context.Context, RemoteBuf, uint64, uint64, uint64, bool, uint64) (uint64, error) {
	return 0, errNoRDMA
}

func (*engine) fetchAdd(context.Context, RemoteBuf, uint64, uint64, bool, uint64) (uint64, error) {
	return 0, errNoRDMA
}

var (
	closedMessages      = closedChan[buffer.Buf]()
	closedNotifications = closedChan[Notification]()
	closedCompletions   = closedChan[OpCompletion]()
)

func closedChan[T any]() chan T {
	ch := make(chan T)
	close(ch)
	return ch
}

// acceptor is the RDMA side of a Listener (acceptor.go); none here.
type acceptor struct{ stats listenStats }

func (*acceptor) accept() (*Conn, error) { return nil, opError("accept") }
func (*acceptor) close() error           { return nil } // nothing is open
func (*acceptor) localAddr() net.Addr    { return nil }

// exported is what grants access to an Export (onesided.go); none here.
type exported struct{}

func (*Export) revoke() error { return nil }

func listenPacket(*Config, netip.AddrPort) (*PacketConn, error) { return nil, errNoRDMA }

// udEndpoint is the RDMA side of a PacketConn (internal/ud through
// packetconn.go); none here.
type udEndpoint struct{}

func (*udEndpoint) readFrom([]byte) (int, netip.AddrPort, error) {
	return 0, netip.AddrPort{}, errNoRDMA
}
func (*udEndpoint) recvDatagram(context.Context) (Datagram, error) { return Datagram{}, errNoRDMA }
func (*udEndpoint) messages() <-chan Datagram                      { return closedDatagrams }
func (*udEndpoint) alloc(int) (buffer.Buf, error)                  { return buffer.Buf{}, errNoRDMA }
func (*udEndpoint) maxDatagramSize() int                           { return 0 }
func (*udEndpoint) close() error                                   { return nil } // nothing is open
func (*udEndpoint) localAddr() net.Addr                            { return nil }
func (*udEndpoint) setDeadline(time.Time, bool, bool) error        { return errNoRDMA }
func (*udEndpoint) stats() PacketStats                             { return PacketStats{} }

func (*udEndpoint) send(context.Context, []byte, buffer.Buf, netip.AddrPort) error { return errNoRDMA }

// sendTo releases b: a sent Buf belongs to the PacketConn whatever the
// outcome.
func (*udEndpoint) sendTo(_ context.Context, b buffer.Buf, _ netip.AddrPort) error {
	b.Release()
	return errNoRDMA
}

var closedDatagrams = closedChan[Datagram]()
