package rdma

import (
	"errors"

	"github.com/verbline/rdma/internal/errs"
)

// The sentinels callers test with errors.Is. Errors from a Conn arrive
// wrapped in a *net.OpError; the sentinel says what happened, the wrapped
// chain keeps the cause (an errno, a work completion's status).
//
// Where the fix is on the user's machine (ErrMemlock, ErrNoDevice,
// ErrNotRDMAAddress), the error also carries a hint for this machine (the
// memlock limit and what is pinned, the module or device file missing,
// the netdevs and IPs that have RDMA), made when the error is:
// github.com/cockroachdb/errors' FlattenHints(err) or GetAllHints(err)
// read it through any wrapping (internal/hints makes it). Error() says
// the fix in one line either way.
//
// The sentinels themselves are the standard library's errors.New: they
// are compared by identity, and cockroachdb/errors' New would attach a
// stack taken during package initialization, which its %+v would print
// under every error wrapping them as if it were where they failed.
// ErrNoDevice, ErrNotRDMAAddress, ErrHandshake, ErrMemlock, ErrProtocol,
// ErrMessageTooLarge, ErrCompletionsFull and ErrDatagramTooLarge
// (packet.go) are internal/errs' values, so that what the internal
// packages wrap (the rdma_cm set-up, the hints, the TCP fallback's framing
// and connection, the UD endpoint) matches them too; so is the
// close-timeout error both transports return (errs.CloseTimeout).

// Errors callers can test with errors.Is.
var (
	// ErrNoDevice: the machine has no RDMA device (or rdma_ucm is not loaded),
	// or the program was built without RDMA (without cgo, or not for Linux).
	ErrNoDevice = errs.ErrNoDevice
	// ErrNotRDMAAddress: the address is not on an RDMA-capable network device.
	ErrNotRDMAAddress = errs.ErrNotRDMAAddress
	// ErrHandshake: the peer does not speak this library's protocol, or refused ours.
	ErrHandshake = errs.ErrHandshake
	// ErrMemlock: registering buffers failed because the locked-memory limit is too low.
	ErrMemlock = errs.ErrMemlock
)

// ErrProtocol: the peer broke the wire protocol; the connection is closed.
var ErrProtocol = errs.ErrProtocol

// ErrMessageTooLarge: a message is larger than the peer accepts (its Config.MaxMessageSize).
var ErrMessageTooLarge = errs.ErrMessageTooLarge

// ErrCompletionsFull: an asynchronous operation was not posted because its
// completion might not fit Completions(), which the poller must never block on.
var ErrCompletionsFull = errs.ErrCompletionsFull

// ErrRemoteAccess: the remote side refused a one-sided access (outside the
// exported range, without the right, or after the export ended).
var ErrRemoteAccess = errors.New("remote access refused (outside the exported range, not permitted, or export closed)")

// errInvalidWrite is WriteTo's answer (io.Copy's too) to an io.Writer that
// reports more bytes written than it was given, or fewer than none.
var errInvalidWrite = errors.New("invalid write result")
