package rdma

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/tcpconn"
)

// Conn is an RDMA reliable connection with the semantics of a TCP stream. It
// implements net.Conn; many goroutines may call its methods at once.
//
// Each method is written once here: it defers to the TCP connection
// (internal/tcpconn) where a Dialer or ListenConfig with Fallback fell back
// to TCP (fallback.go), else to the RDMA engine (engine.go; engine_stub.go
// in builds without RDMA), and wraps the engine's error in a *net.OpError
// naming the operation.
type Conn struct {
	// Non-nil: the connection fell back to TCP; every method defers to it.
	tcp *tcpconn.Conn[OpCompletion, Notification]
	engine
}

var _ net.Conn = (*Conn)(nil)

// opError wraps an engine error for the user, naming the operation and the
// connection's addresses, as package net does.
func (c *Conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "rdma", Source: c.localAddr(), Addr: c.remoteAddr(), Err: err}
}

// wrap is opError for an error that may be nil or io.EOF (returned as it
// is, as net.Conn.Read returns it).
func (c *Conn) wrap(op string, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	return c.opError(op, err)
}

// Read reads data from the connection. It returns io.EOF once the peer has
// closed (or half-closed) and every byte it wrote has been read.
func (c *Conn) Read(b []byte) (int, error) {
	if c.tcp != nil {
		return c.tcp.Read(b)
	}
	n, err := c.read(b)
	if err != nil {
		err = c.wrap("read", err)
	}
	return n, err
}

// WriteTo writes what the peer sends to w until the peer's end of stream
// (which is not an error here) or an error, and returns how many bytes w
// took: io.Copy(w, conn) calls it. Each received chunk goes to w straight
// from the receive buffer the NIC filled, so io.Copy needs no buffer of
// its own (it would allocate 32 KiB per call) and the bytes are copied
// once fewer than through Read. w must not keep the slice (io.Writer's
// rule): the buffer is reposted for the peer when w.Write returns. The
// read deadline bounds the waits for data, not w.Write. An error of w is
// returned as w returned it.
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	if c.tcp != nil {
		return c.tcp.WriteTo(w)
	}
	n, werr, err := c.writeTo(w)
	if werr != nil {
		return n, werr
	}
	return n, c.wrap("writeto", err) // as net.TCPConn.WriteTo names it
}

// Write writes b to the connection, split into chunks of at most the peer's
// receive buffer size and pipelined over the send buffers. It returns once
// every byte is in a posted send buffer (as TCP's returns once the bytes are
// in the socket buffer).
func (c *Conn) Write(b []byte) (int, error) {
	if c.tcp != nil {
		return c.tcp.Write(b)
	}
	n, err := c.write(b)
	if err != nil {
		err = c.opError("write", err)
	}
	return n, err
}

// CloseWrite shuts down the writing side: the peer reads every byte written
// before it and then io.EOF, and can still write back.
func (c *Conn) CloseWrite() error {
	if c.tcp != nil {
		return c.tcp.CloseWrite()
	}
	return c.wrap("close", c.closeWrite())
}

// Close closes the connection: blocked Reads and Writes return net.ErrClosed,
// data already written is delivered (within Config.CloseTimeout) followed by
// end-of-stream, and every RDMA resource is released.
func (c *Conn) Close() error {
	if c.tcp != nil {
		return c.tcp.Close()
	}
	return c.wrap("close", c.close())
}

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	if c.tcp != nil {
		return c.tcp.SetDeadline("set deadline", t, true, true)
	}
	return c.wrap("set deadline", c.setDeadline(t, true, true))
}

// SetReadDeadline sets the deadline for Read calls, pending and future.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.tcp != nil {
		return c.tcp.SetDeadline("set read deadline", t, true, false)
	}
	return c.wrap("set read deadline", c.setDeadline(t, true, false))
}

// SetWriteDeadline sets the deadline for Write calls, pending and future.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.tcp != nil {
		return c.tcp.SetDeadline("set write deadline", t, false, true)
	}
	return c.wrap("set write deadline", c.setDeadline(t, false, true))
}

// LocalAddr returns the local address.
func (c *Conn) LocalAddr() net.Addr {
	if c.tcp != nil {
		return c.tcp.LocalAddr()
	}
	return c.localAddr()
}

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() net.Addr {
	if c.tcp != nil {
		return c.tcp.RemoteAddr()
	}
	return c.remoteAddr()
}

// Transport returns the connection's transport: "rdma", or "tcp" for a
// connection that fell back to TCP (see Fallback), as its addresses'
// Network() say. (Stats counts RDMA work: over TCP its counters stay zero.)
func (c *Conn) Transport() string {
	if c.tcp != nil {
		return "tcp"
	}
	return "rdma"
}

// FallbackReason returns why a connection dialed with Dialer.Fallback runs
// over TCP (the RDMA attempt's error), or nil: an RDMA connection, or one
// a fallback listener accepted over TCP.
func (c *Conn) FallbackReason() error {
	if c.tcp == nil {
		return nil
	}
	return c.tcp.FallbackReason()
}

// Stats returns the connection's counters.
func (c *Conn) Stats() ConnStats {
	if c.tcp != nil {
		return ConnStats{} // none of its counters (posts, work requests, polls) exists over TCP
	}
	return c.stats()
}

// QPInfo returns what the device holds for the connection's queue pair
// (ibv_query_qp): the transport settings, the path MTU, the PSNs and the
// state. It works after a transport error too (State is then "ERR"), until
// Close; after Close it returns an error wrapping net.ErrClosed. It takes
// a system call: for debugging, not for a hot path.
func (c *Conn) QPInfo() (QPInfo, error) {
	if c.tcp != nil {
		return QPInfo{}, c.tcp.OpError("qp info", ErrNotRDMA)
	}
	info, err := c.qpInfo()
	return info, c.wrap("qp info", err)
}

// DeviceInfo returns what the connection's RDMA device can do, as the
// library read it when the device was opened: which paths the connection
// takes (docs/devices.md). Over TCP it returns an error wrapping
// ErrNotRDMA.
func (c *Conn) DeviceInfo() (DeviceInfo, error) {
	if c.tcp != nil {
		return DeviceInfo{}, c.tcp.OpError("device info", ErrNotRDMA)
	}
	info, err := c.deviceInfo()
	return info, c.wrap("device info", err)
}

// The message view.

// MaxMessageSize is the largest message Send accepts. Up to the peer's
// receive buffer size a message is sent into a receive buffer; above it
// (up to the largest pool buffer, 4 MiB by default) the peer reads it from
// the sender's buffer with RDMA READs.
// Either way it arrives whole and is never copied.
func (c *Conn) MaxMessageSize() int {
	if c.tcp != nil {
		return c.tcp.MaxMessageSize()
	}
	return c.maxMessageSize()
}

// Alloc returns a registered buffer of n bytes (up to the pool's largest
// size class, 4 MiB by default) for Send, Export and the one-sided
// operations. Bytes() has length n. Send takes at most MaxMessageSize bytes.
func (c *Conn) Alloc(n int) (buffer.Buf, error) {
	if c.tcp != nil {
		return c.tcp.Alloc(n)
	}
	b, err := c.alloc(n)
	return b, c.wrap("alloc", err)
}

// Send sends b as one message without copying it. It waits (bounded by ctx
// and the write deadline) for a credit, posts b and returns; b belongs to
// the connection from the call on, whatever the outcome, and is released
// once the NIC is done with it. The peer receives it whole on Messages().
// A failure after posting ends the connection and shows in the next call.
// b should come from this connection's Alloc (or a Conn's on the same
// device); any other Buf is copied into one first.
func (c *Conn) Send(ctx context.Context, b buffer.Buf) error {
	if c.tcp != nil {
		return c.tcp.Send(ctx, b)
	}
	return c.wrap("send", c.sendMessage(ctx, b, false, 0))
}

// PostSend is Send whose outcome (the NIC finished sending b, or an error)
// also arrives on Completions() with id.
func (c *Conn) PostSend(ctx context.Context, b buffer.Buf, id uint64) error {
	if c.tcp != nil {
		return c.tcp.PostSend(ctx, b, id)
	}
	return c.wrap("send", c.sendMessage(ctx, b, true, id))
}

// Messages delivers received messages, whole and in order, as Bufs the
// receiver must Release. It is closed when the peer has finished (after its
// last message) or the connection ends; Recv reports why.
func (c *Conn) Messages() <-chan buffer.Buf {
	if c.tcp != nil {
		return c.tcp.Messages()
	}
	return c.messages()
}

// Recv waits for the next message (bounded by ctx and the read deadline).
// At the end it returns io.EOF, or the connection's error.
func (c *Conn) Recv(ctx context.Context) (buffer.Buf, error) {
	if c.tcp != nil {
		return c.tcp.Recv(ctx)
	}
	b, err := c.recv(ctx)
	if err != nil {
		err = c.wrap("recv", err)
	}
	return b, err
}

// One-sided access.

// Export makes b (a Buf from Alloc) accessible to the peer with the given
// rights until the Export is closed or the connection ends. The Export
// holds a reference to b.
//
// On a device with type 2 memory windows (Soft-RoCE, mlx4, mlx5, most RoCE
// NICs) the peer's key is a window bound to this connection's queue pair
// over a registration of exactly b's bytes, with exactly the rights asked
// for: it works on this connection only, for b's bytes only, and Close
// (or the end of the connection) revokes it. Without windows the key is a
// registration's, valid on every connection of the device: treat its
// descriptor as a secret shared with one peer.
//
// RemoteAtomic lets the peer CompareAndSwap and FetchAdd the buffer's
// 8-byte words; it needs a device with atomics on both sides and a peer
// that announced them, else Export fails with an error wrapping
// errors.ErrUnsupported.
func (c *Conn) Export(b buffer.Buf, access Access) (*Export, error) {
	if c.tcp != nil {
		return nil, c.tcp.OpError("export", ErrNotRDMA)
	}
	e, err := c.export(b, access)
	return e, c.wrap("export", err)
}

// Notifications delivers the peer's WriteRemoteImm notifications.
func (c *Conn) Notifications() <-chan Notification {
	if c.tcp != nil {
		return c.tcp.Notifications()
	}
	return c.notifications()
}

// RecvNotification waits for the next notification (bounded by ctx and the
// read deadline), polling for it meanwhile as Recv does: lower latency than
// a receive from Notifications(), which waits for the poller's thread. At
// the end it returns io.EOF, or the connection's error.
func (c *Conn) RecvNotification(ctx context.Context) (Notification, error) {
	if c.tcp != nil {
		return Notification{}, c.tcp.OpError("recv notification", ErrNotRDMA)
	}
	n, err := c.recvNotification(ctx)
	if err != nil {
		err = c.wrap("recv notification", err)
	}
	return n, err
}

// Completions delivers the ends of PostSend, PostWriteRemote,
// PostWriteRemoteImm, PostReadRemote, PostCompareAndSwap and PostFetchAdd
// operations (the atomics' old values in OpCompletion.Value); it has room for every
// one that can be in flight. The poller's goroutine feeds it: a caller that
// waits for the ends itself does better with RecvCompletion.
func (c *Conn) Completions() <-chan OpCompletion {
	if c.tcp != nil {
		return c.tcp.Completions()
	}
	return c.completions()
}

// RecvCompletion waits for the end of the next PostSend, PostWriteRemote(Imm),
// PostReadRemote or atomic's Post form, in the order they end (bounded by ctx and the read
// deadline), polling for it meanwhile as Recv does: no hand-off from the
// poller's goroutine, which Completions() needs. Ends not yet taken wait in
// order; once Completions() was called they go to that channel, which this
// then reads. After Close it returns the ends still queued, then
// net.ErrClosed.
//
// Until the Completions() channel is taken, most asynchronous operations ask
// the NIC for no completion of their own: a later one's reports them too (RC
// completes in order), and RecvCompletion makes sure one is coming before it
// waits. So an end, and the release of the operation's reference to its
// local buffer, may wait for the next RecvCompletion or operation, or the
// next keepalive check (Config.KeepAlive), whichever comes first.
func (c *Conn) RecvCompletion(ctx context.Context) (OpCompletion, error) {
	if c.tcp != nil {
		return c.tcp.RecvCompletion(ctx)
	}
	oc, err := c.recvCompletion(ctx)
	if err != nil {
		err = c.wrap("recv completion", err)
	}
	return oc, err
}

// WriteRemote writes local's bytes into the peer's exported buffer at
// offset, and returns when the NIC reports them placed.
func (c *Conn) WriteRemote(ctx context.Context, local buffer.Buf, remote RemoteBuf, offset uint64) error {
	if c.tcp != nil {
		return c.tcp.OpError("write remote", ErrNotRDMA)
	}
	return c.wrap("write remote", c.writeRemote(ctx, local, remote, offset, 0, false, false, 0))
}

// WriteRemoteImm is WriteRemote that also delivers imm on the peer's
// Notifications() (it uses one of the peer's receive buffers, like a message).
func (c *Conn) WriteRemoteImm(ctx context.Context, local buffer.Buf, remote RemoteBuf, offset uint64, imm uint32) error {
	if c.tcp != nil {
		return c.tcp.OpError("write remote", ErrNotRDMA)
	}
	return c.wrap("write remote", c.writeRemote(ctx, local, remote, offset, imm, true, false, 0))
}

// ReadRemote fills local from the peer's exported buffer at offset.
func (c *Conn) ReadRemote(ctx context.Context, local buffer.Buf, remote RemoteBuf, offset uint64) error {
	if c.tcp != nil {
		return c.tcp.OpError("read remote", ErrNotRDMA)
	}
	return c.wrap("read remote", c.readRemote(ctx, local, remote, offset, false, 0))
}

// PostWriteRemote starts WriteRemote and returns; its end arrives on
// Completions() with id. The connection holds its own reference to local
// until then, so the caller may Release it at once, but its bytes must stay
// untouched until the completion arrives.
func (c *Conn) PostWriteRemote(local buffer.Buf, remote RemoteBuf, offset, id uint64) error {
	if c.tcp != nil {
		return c.tcp.OpError("write remote", ErrNotRDMA)
	}
	return c.wrap("write remote", c.writeRemote(context.Background(), local, remote, offset, 0, false, true, id))
}

// PostWriteRemoteImm starts WriteRemoteImm and returns once it is posted;
// its end arrives on Completions() (or RecvCompletion) with id, as for
// PostWriteRemote. It waits, bounded by ctx, only for a credit (the peer's
// receive buffer its notification takes), as PostSend does. A request
// answered by the peer's own write with an immediate needs no wait for the
// request's end before waiting for the answer (RecvNotification).
func (c *Conn) PostWriteRemoteImm(ctx context.Context, local buffer.Buf, remote RemoteBuf, offset uint64, imm uint32, id uint64) error {
	if c.tcp != nil {
		return c.tcp.OpError("write remote", ErrNotRDMA)
	}
	return c.wrap("write remote", c.writeRemote(ctx, local, remote, offset, imm, true, true, id))
}

// PostReadRemote starts ReadRemote; its end arrives on Completions() with id.
func (c *Conn) PostReadRemote(local buffer.Buf, remote RemoteBuf, offset, id uint64) error {
	if c.tcp != nil {
		return c.tcp.OpError("read remote", ErrNotRDMA)
	}
	return c.wrap("read remote", c.readRemote(context.Background(), local, remote, offset, true, id))
}

// CompareAndSwap compares the 8-byte word at offset in the peer's export
// with compare and, if equal, replaces it with swap, atomically in the
// peer's NIC; it returns the word's value before (equal to compare when
// the swap took place). It waits, like ReadRemote, for the NIC's answer
// (bounded by ctx and the write deadline).
//
// offset must be a multiple of 8 inside the descriptor's range, and the
// export must have been given RemoteAtomic; a misaligned or out-of-range
// offset is refused here (ErrRemoteAccess) before anything is posted, and
// the connection is unharmed. A descriptor the peer's NIC refuses (no
// RemoteAtomic, another connection's, a closed export) fails with
// ErrRemoteAccess and, as RC requires, ends the connection. Where either
// device has no atomics, or the peer runs a release without them, the
// call fails at once with an error wrapping errors.ErrUnsupported; on a
// TCP-backed connection it returns ErrNotRDMA.
func (c *Conn) CompareAndSwap(ctx context.Context, remote RemoteBuf, offset, compare, swap uint64) (uint64, error) {
	if c.tcp != nil {
		return 0, c.tcp.OpError("compare and swap", ErrNotRDMA)
	}
	old, err := c.compareAndSwap(ctx, remote, offset, compare, swap, false, 0)
	return old, c.wrap("compare and swap", err)
}

// FetchAdd adds add to the 8-byte word at offset in the peer's export,
// atomically in the peer's NIC (wrapping modulo 2^64), and returns the
// word's value before. Its rules are CompareAndSwap's.
func (c *Conn) FetchAdd(ctx context.Context, remote RemoteBuf, offset, add uint64) (uint64, error) {
	if c.tcp != nil {
		return 0, c.tcp.OpError("fetch and add", ErrNotRDMA)
	}
	old, err := c.fetchAdd(ctx, remote, offset, add, false, 0)
	return old, c.wrap("fetch and add", err)
}

// PostCompareAndSwap starts CompareAndSwap and returns once it is posted;
// its end arrives on Completions() (or RecvCompletion) with id, the old
// value in OpCompletion.Value. More atomics and READs may be posted than
// the connection's READ depth (Config.ReadDepth): the NIC holds the extra
// ones until answers return; none fails for it.
func (c *Conn) PostCompareAndSwap(remote RemoteBuf, offset, compare, swap, id uint64) error {
	if c.tcp != nil {
		return c.tcp.OpError("compare and swap", ErrNotRDMA)
	}
	_, err := c.compareAndSwap(context.Background(), remote, offset, compare, swap, true, id)
	return c.wrap("compare and swap", err)
}

// PostFetchAdd starts FetchAdd; its end arrives on Completions() (or
// RecvCompletion) with id, the old value in OpCompletion.Value.
func (c *Conn) PostFetchAdd(remote RemoteBuf, offset, add, id uint64) error {
	if c.tcp != nil {
		return c.tcp.OpError("fetch and add", ErrNotRDMA)
	}
	_, err := c.fetchAdd(context.Background(), remote, offset, add, true, id)
	return c.wrap("fetch and add", err)
}

// Export is a buffer the peer may access (Conn.Export).
type Export struct {
	remote   RemoteBuf
	exported // the registration and window behind it (onesided.go); none without RDMA (engine_stub.go)
}

// Remote is the descriptor to hand to the peer.
func (e *Export) Remote() RemoteBuf { return e.remote }

// Close ends remote access and releases the Export's reference to the Buf.
func (e *Export) Close() error { return e.revoke() }

// Notification is a WriteRemoteImm the peer completed into our memory.
// Release it when handled: it holds a receive buffer (and the peer's credit).
type Notification struct {
	Imm uint32 // the peer's immediate value
	Len int    // bytes the peer wrote
	buf buffer.Buf
}

// Release returns the notification's receive buffer to the connection.
func (n Notification) Release() error { return n.buf.Release() }
