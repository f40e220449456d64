// Package errs holds the sentinel errors that internal packages return and
// the root package exports under the same names: one value each, so
// errors.Is matches whichever package wrapped it. Their documentation is
// the root package's (errors.go).
package errs

import "errors"

var (
	// ErrHandshake: the peer does not speak this library's protocol, or refused ours.
	ErrHandshake = errors.New("rdma handshake failed")
	// ErrProtocol: the peer broke the wire protocol.
	ErrProtocol = errors.New("rdma protocol violation by peer")
)
