//go:build !linux || !cgo

package rdma

// This file stands in for the RDMA implementation where there is none: a
// build without cgo (CGO_ENABLED=0) or for a system other than Linux. It
// declares the exported API of the Linux build (apicheck, run by make vet,
// compares the two), so code that imports the package builds, and its host
// tests run, anywhere. Dial, Listen, Dialer.DialContext and
// ListenConfig.Listen check the network and resolve the address as on
// Linux, then fail with a *net.OpError wrapping ErrNoDevice that says what
// RDMA needs. No *Conn, *Listener or *Export can be obtained here; the
// methods of their zero values report the same error.

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

func opError(op string) error { return &net.OpError{Op: op, Net: "rdma", Err: errNoRDMA} }

// Conn is an RDMA reliable connection with the semantics of a TCP stream; in
// this build none can be made (see Dial).
type Conn struct {
	tcp *tcpConn // non-nil: a TCP connection of a Dialer or ListenConfig with Fallback (fallback.go)
}

var (
	_ net.Conn     = (*Conn)(nil)
	_ net.Listener = (*Listener)(nil)
)

// Read fails: there is no RDMA in this build.
func (c *Conn) Read(b []byte) (int, error) {
	if c.tcp != nil {
		return c.tcp.read(b)
	}
	return 0, opError("read")
}

// WriteTo fails: there is no RDMA in this build.
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	if c.tcp != nil {
		return io.Copy(w, tcpReader{c.tcp})
	}
	return 0, opError("read")
}

// Write fails: there is no RDMA in this build.
func (c *Conn) Write(b []byte) (int, error) {
	if c.tcp != nil {
		return c.tcp.write(b)
	}
	return 0, opError("write")
}

// Close does nothing: no connection can be open in this build.
func (c *Conn) Close() error {
	if c.tcp != nil {
		return c.tcp.close()
	}
	return nil
}

// CloseWrite fails: there is no RDMA in this build.
func (c *Conn) CloseWrite() error {
	if c.tcp != nil {
		return c.tcp.closeWrite()
	}
	return opError("close")
}

// LocalAddr returns nil.
func (c *Conn) LocalAddr() net.Addr {
	if c.tcp != nil {
		return c.tcp.laddr
	}
	return nil
}

// RemoteAddr returns nil.
func (c *Conn) RemoteAddr() net.Addr {
	if c.tcp != nil {
		return c.tcp.raddr
	}
	return nil
}

// SetDeadline fails: there is no RDMA in this build.
func (c *Conn) SetDeadline(t time.Time) error {
	if c.tcp != nil {
		return c.tcp.setDeadline("set deadline", t, true, true)
	}
	return opError("set")
}

// SetReadDeadline fails: there is no RDMA in this build.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.tcp != nil {
		return c.tcp.setDeadline("set read deadline", t, true, false)
	}
	return opError("set")
}

// SetWriteDeadline fails: there is no RDMA in this build.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.tcp != nil {
		return c.tcp.setDeadline("set write deadline", t, false, true)
	}
	return opError("set")
}

// MaxMessageSize returns 0.
func (c *Conn) MaxMessageSize() int {
	if c.tcp != nil {
		return c.tcp.peerMaxMsg
	}
	return 0
}

// Alloc fails: there is no RDMA in this build.
func (c *Conn) Alloc(n int) (buffer.Buf, error) {
	if c.tcp != nil {
		return c.tcp.alloc(n)
	}
	return buffer.Buf{}, opError("alloc")
}

// Send fails: there is no RDMA in this build.
func (c *Conn) Send(ctx context.Context, b buffer.Buf) error {
	if c.tcp != nil {
		return c.tcp.send(ctx, b, false, 0)
	}
	return opError("send")
}

// PostSend fails: there is no RDMA in this build.
func (c *Conn) PostSend(ctx context.Context, b buffer.Buf, id uint64) error {
	if c.tcp != nil {
		return c.tcp.send(ctx, b, true, id)
	}
	return opError("send")
}

// Messages returns a closed channel.
func (c *Conn) Messages() <-chan buffer.Buf {
	if c.tcp != nil {
		return c.tcp.msgs
	}
	return closedMessages
}

// Recv fails: there is no RDMA in this build.
func (c *Conn) Recv(ctx context.Context) (buffer.Buf, error) {
	if c.tcp != nil {
		return c.tcp.recv(ctx)
	}
	return buffer.Buf{}, opError("recv")
}

// Export fails: there is no RDMA in this build.
func (c *Conn) Export(b buffer.Buf, access Access) (*Export, error) {
	if c.tcp != nil {
		return nil, c.tcp.notRDMA("export")
	}
	return nil, opError("export")
}

// Notifications returns a closed channel.
func (c *Conn) Notifications() <-chan Notification {
	if c.tcp != nil {
		return c.tcp.notes
	}
	return closedNotifications
}

// RecvNotification fails: there is no RDMA in this build.
func (c *Conn) RecvNotification(ctx context.Context) (Notification, error) {
	if c.tcp != nil {
		return Notification{}, c.tcp.notRDMA("recv notification")
	}
	return Notification{}, opError("recv")
}

// Completions returns a closed channel.
func (c *Conn) Completions() <-chan OpCompletion {
	if c.tcp != nil {
		return c.tcp.opDone
	}
	return closedCompletions
}

// RecvCompletion waits for a TCP-backed connection's next PostSend end;
// without one it fails: there is no RDMA in this build.
func (c *Conn) RecvCompletion(ctx context.Context) (OpCompletion, error) {
	if c.tcp != nil {
		return c.tcp.recvCompletion(ctx)
	}
	return OpCompletion{}, opError("recv completion")
}

// WriteRemote fails: there is no RDMA in this build.
func (c *Conn) WriteRemote(ctx context.Context, local buffer.Buf, remote RemoteBuf, offset uint64) error {
	if c.tcp != nil {
		return c.tcp.notRDMA("write remote")
	}
	return opError("write remote")
}

// WriteRemoteImm fails: there is no RDMA in this build.
func (c *Conn) WriteRemoteImm(ctx context.Context, local buffer.Buf, remote RemoteBuf, offset uint64, imm uint32) error {
	if c.tcp != nil {
		return c.tcp.notRDMA("write remote")
	}
	return opError("write remote")
}

// ReadRemote fails: there is no RDMA in this build.
func (c *Conn) ReadRemote(ctx context.Context, local buffer.Buf, remote RemoteBuf, offset uint64) error {
	if c.tcp != nil {
		return c.tcp.notRDMA("read remote")
	}
	return opError("read remote")
}

// PostWriteRemote fails: there is no RDMA in this build.
func (c *Conn) PostWriteRemote(local buffer.Buf, remote RemoteBuf, offset, id uint64) error {
	if c.tcp != nil {
		return c.tcp.notRDMA("write remote")
	}
	return opError("write remote")
}

// PostWriteRemoteImm fails: there is no RDMA in this build.
func (c *Conn) PostWriteRemoteImm(ctx context.Context, local buffer.Buf, remote RemoteBuf, offset uint64, imm uint32, id uint64) error {
	if c.tcp != nil {
		return c.tcp.notRDMA("write remote")
	}
	return opError("write remote")
}

// PostReadRemote fails: there is no RDMA in this build.
func (c *Conn) PostReadRemote(local buffer.Buf, remote RemoteBuf, offset, id uint64) error {
	if c.tcp != nil {
		return c.tcp.notRDMA("read remote")
	}
	return opError("read remote")
}

// CompareAndSwap fails: there is no RDMA in this build.
func (c *Conn) CompareAndSwap(ctx context.Context, remote RemoteBuf, offset, compare, swap uint64) (uint64, error) {
	if c.tcp != nil {
		return 0, c.tcp.notRDMA("compare and swap")
	}
	return 0, opError("compare and swap")
}

// FetchAdd fails: there is no RDMA in this build.
func (c *Conn) FetchAdd(ctx context.Context, remote RemoteBuf, offset, add uint64) (uint64, error) {
	if c.tcp != nil {
		return 0, c.tcp.notRDMA("fetch and add")
	}
	return 0, opError("fetch and add")
}

// PostCompareAndSwap fails: there is no RDMA in this build.
func (c *Conn) PostCompareAndSwap(remote RemoteBuf, offset, compare, swap, id uint64) error {
	if c.tcp != nil {
		return c.tcp.notRDMA("compare and swap")
	}
	return opError("compare and swap")
}

// PostFetchAdd fails: there is no RDMA in this build.
func (c *Conn) PostFetchAdd(remote RemoteBuf, offset, add, id uint64) error {
	if c.tcp != nil {
		return c.tcp.notRDMA("fetch and add")
	}
	return opError("fetch and add")
}

// Stats returns zero counters.
func (c *Conn) Stats() ConnStats {
	if c.tcp != nil {
		return c.tcp.stats()
	}
	return ConnStats{}
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

// Listener accepts RDMA connections; in this build none can be made (see
// Listen).
type Listener struct {
	fb *fallbackListener // non-nil: ListenConfig.Fallback (fallback.go), TCP alone in this build
}

// Accept fails: there is no RDMA in this build.
func (l *Listener) Accept() (net.Conn, error) {
	if l.fb != nil {
		return l.fb.acceptConn()
	}
	return nil, opError("accept")
}

// AcceptRDMA fails: there is no RDMA in this build.
func (l *Listener) AcceptRDMA() (*Conn, error) {
	if l.fb != nil {
		return l.fb.accept()
	}
	return nil, opError("accept")
}

// Addr returns nil.
func (l *Listener) Addr() net.Addr {
	if l.fb != nil {
		return l.fb.addr
	}
	return nil
}

// Close does nothing: no listener can be open in this build.
func (l *Listener) Close() error {
	if l.fb != nil {
		return l.fb.close()
	}
	return nil
}

// The types below are declared as in the Linux build (onesided.go, stats.go);
// RemoteBuf, Access and OpCompletion are shared by both (remotebuf.go,
// access.go).

// Export is a buffer the peer may access; in this build none can be made.
type Export struct{}

// Remote returns the zero descriptor.
func (e *Export) Remote() RemoteBuf { return RemoteBuf{} }

// Close does nothing.
func (e *Export) Close() error { return nil }

// Notification is a WriteRemoteImm the peer completed into our memory.
type Notification struct {
	Imm uint32 // the peer's immediate value
	Len int    // bytes the peer wrote
}

// Release does nothing: no notification arrives in this build.
func (n Notification) Release() error { return nil }

// ConnStats counts the work behind a connection (see the Linux build's
// documentation; the poller and polling counters, PollCalls to Arms, are
// diagnostics whose meaning follows the implementation); in this build it
// stays zero.
type ConnStats struct {
	PostCalls, WorkRequests                                   uint64
	SendPosts, SendWRs, Signaled, Inlined, RecvPosts, RecvWRs uint64
	PollCalls, Completions, PollerSleeps, PollerWakeups       uint64
	InlinePolls, EmptyPolls, Parks, Arms                      uint64
	KeepaliveProbes, DeviceEvents, BufferBytes                uint64
}
