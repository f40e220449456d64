// Package errs holds the sentinel errors that internal packages return and
// the root package exports under the same names: one value each, so
// errors.Is matches whichever package wrapped it. Their documentation is
// the root package's (errors.go). It also holds the errors the root
// package and internal packages both return without exporting them.
package errs

import (
	"errors"
	"os"
)

var (
	// ErrNoDevice: the machine has no RDMA device (or rdma_ucm is not loaded),
	// or the program was built without RDMA (without cgo, or not for Linux).
	ErrNoDevice = errors.New("no RDMA device: install an RDMA NIC driver, or add Soft-RoCE " +
		"(modprobe -a rdma_rxe rdma_ucm; rdma link add rxe0 type rxe netdev <netdev>)")
	// ErrNotRDMAAddress: the address is not on an RDMA-capable network device.
	ErrNotRDMAAddress = errors.New("address is not on an RDMA-capable network device " +
		"(use an IP of a netdev that `rdma link show` lists)")
	// ErrHandshake: the peer does not speak this library's protocol, or refused ours.
	ErrHandshake = errors.New("rdma handshake failed")
	// ErrMemlock: registering buffers failed because the locked-memory limit is too low.
	ErrMemlock = errors.New("cannot register RDMA buffers: the locked-memory limit is too low " +
		"(raise it: `ulimit -l unlimited`, or LimitMEMLOCK=infinity for a systemd service)")
	// ErrProtocol: the peer broke the wire protocol.
	ErrProtocol = errors.New("rdma protocol violation by peer")
	// ErrMessageTooLarge: a message is larger than the peer accepts (its Config.MaxMessageSize).
	ErrMessageTooLarge = errors.New("message larger than the peer accepts " +
		"(see Conn.MaxMessageSize; raise the peer's Config.MaxMessageSize, or move bulk data with Export and WriteRemote)")
	// ErrCompletionsFull: an asynchronous operation was not posted because its
	// completion might not fit Completions(), which the poller must never block on.
	ErrCompletionsFull = errors.New("Completions() is full: receive the completions of earlier " +
		"PostSend, PostWriteRemote and PostReadRemote calls before posting more")
	// ErrDatagramTooLarge: a datagram is larger than one packet of the path
	// carries, or than the receiving PacketConn accepts.
	ErrDatagramTooLarge = errors.New("datagram larger than the path MTU allows " +
		"(see PacketConn.MaxDatagramSize: the port's active MTU minus the 24-byte datagram header; " +
		"split the payload, or use a Conn, whose messages have no such limit)")
)

// CloseTimeout is Close's (or CloseWrite's) error when Config.CloseTimeout
// ran out before what was written reached the peer, on either transport
// (the RDMA engine and internal/tcpconn). It is a timeout, and matches
// os.ErrDeadlineExceeded.
type CloseTimeout struct{ What string }

func (e *CloseTimeout) Error() string {
	return "timed out after Config.CloseTimeout: " + e.What + " (the peer stopped reading; the connection was closed anyway)"
}
func (e *CloseTimeout) Timeout() bool        { return true }
func (e *CloseTimeout) Is(target error) bool { return target == os.ErrDeadlineExceeded }

// DeviceFailed is the error of a device that can no longer be used. It
// matches ErrNoDevice (there is no usable device) but says what happened;
// Cause, if any, is the failure that showed it (errors.Unwrap reaches it).
type DeviceFailed struct {
	Msg   string
	Cause error
}

func (e *DeviceFailed) Error() string {
	if e.Cause != nil {
		return e.Msg + ": " + e.Cause.Error()
	}
	return e.Msg
}
func (e *DeviceFailed) Unwrap() error        { return e.Cause }
func (e *DeviceFailed) Is(target error) bool { return target == ErrNoDevice }
