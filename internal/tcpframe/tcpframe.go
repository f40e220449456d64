// Package tcpframe is the TCP fallback's wire format (internal/tcpconn,
// the root package's fallback.go): a hello exchange, then frames that
// carry the stream and the message view over one TCP connection. Version
// 1.0; every integer is big-endian.
//
// Hello (16 bytes), the dialer's first and then the listener's answer:
//
//	off size field
//	  0    4 magic "VLTF" (0x564c5446): anything else is not a verbline fallback peer
//	  4    1 major version, 1: must equal the receiver's (else it is refused)
//	  5    1 minor version, 0: accepted whatever it is
//	  6    1 kind: 0 hello, 1 reject (the listener's refusal)
//	  7    1 reserved, 0
//	  8    4 max message: the largest message the sender accepts (hello: >= 1)
//	 12    4 max chunk: the largest stream frame the sender accepts (hello: >= 1)
//
// A reject (kind 1) has zero limits and is followed by a 2-byte reason
// length (at most maxRejectReason) and the reason in UTF-8; the listener
// closes the connection after it. The dialer replaces invalid UTF-8 and
// characters that are not printable in the reason with '?'.
//
// Frames (5-byte header, then the payload):
//
//	off size field
//	  0    1 type: 1 stream data, 2 message
//	  1    4 payload length: stream data 1..the receiver's max chunk,
//	         a message 0..the receiver's max message
//
// The end of the stream and of the messages is TCP's own (the sender's
// CloseWrite or Close: a FIN after its last frame); a connection that ends
// inside a frame, a sender that pauses inside a frame for longer than the
// receiver's Config.HandshakeTimeout, an unknown type or a length above
// the receiver's limit is a protocol error, and the receiver closes the
// connection.
package tcpframe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/verbline/rdma/internal/errs"
	"github.com/verbline/rdma/internal/wire"
)

// The hello's constants.
const (
	magic           = 0x564c5446 // "VLTF"
	Major           = 1          // the major version this side speaks
	Minor           = 0          // the minor version this side speaks
	helloLen        = 16
	kindHello       = 0
	kindReject      = 1
	maxRejectReason = 512
)

// The frame header's length and the frame types.
const (
	HeaderLen   = 5
	TypeStream  = 1 // stream data
	TypeMessage = 2 // one message
)

// Hello is one side's hello (or a listener's reject).
type Hello struct {
	Major, Minor uint8
	Reject       bool
	MaxMessage   uint32 // the largest message the sender accepts
	MaxChunk     uint32 // the largest stream frame the sender accepts
	Reason       string // a reject's reason
}

// AppendTo appends h's encoding to b.
func (h *Hello) AppendTo(b []byte) []byte {
	var kind byte = kindHello
	if h.Reject {
		kind = kindReject
	}
	b = binary.BigEndian.AppendUint32(b, magic)
	b = append(b, h.Major, h.Minor, kind, 0)
	b = binary.BigEndian.AppendUint32(b, h.MaxMessage)
	b = binary.BigEndian.AppendUint32(b, h.MaxChunk)
	if h.Reject {
		r := h.Reason
		if len(r) > maxRejectReason {
			n := maxRejectReason // cut on a character's start
			for i := 0; i < utf8.UTFMax-1 && n > 0 && !utf8.RuneStart(r[n]); i++ {
				n--
			}
			r = r[:n]
		}
		b = binary.BigEndian.AppendUint16(b, uint16(len(r)))
		b = append(b, r...)
	}
	return b
}

// ErrNotFallbackPeer: the TCP peer did not start with the fallback magic.
var ErrNotFallbackPeer = errors.New("the TCP peer is not a verbline fallback peer (no \"VLTF\" hello: " +
	"a plain TCP service, or a listener without ListenConfig.Fallback, on that port?)")

// WriteReject refuses a fallback connection: a reject hello with this
// side's version and reason, best effort (the caller closes the
// connection next).
func WriteReject(w io.Writer, reason string) {
	w.Write((&Hello{Major: Major, Minor: Minor, Reject: true, Reason: reason}).AppendTo(nil))
}

// ReadHello reads and checks one hello (with a reject's reason) from r.
// It reads at most helloLen+2+maxRejectReason bytes and allocates at
// most the reason. Its errors match errs.ErrHandshake, but r's own.
func ReadHello(r io.Reader) (Hello, error) {
	var b [helloLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return Hello{}, fmt.Errorf("%w: the peer closed the connection during the hello", errs.ErrHandshake)
		}
		return Hello{}, err
	}
	if binary.BigEndian.Uint32(b[0:]) != magic {
		return Hello{}, fmt.Errorf("%w: %w", errs.ErrHandshake, ErrNotFallbackPeer)
	}
	h := Hello{Major: b[4], Minor: b[5],
		MaxMessage: binary.BigEndian.Uint32(b[8:]), MaxChunk: binary.BigEndian.Uint32(b[12:])}
	switch b[6] {
	case kindHello:
		if h.Major != Major {
			return h, fmt.Errorf("%w: the peer speaks TCP fallback protocol %d.%d, this side %d.%d",
				errs.ErrHandshake, h.Major, h.Minor, Major, Minor)
		}
		if h.MaxMessage == 0 || h.MaxChunk == 0 {
			return h, fmt.Errorf("%w: the peer's hello has a zero limit (max message %d, max chunk %d)",
				errs.ErrHandshake, h.MaxMessage, h.MaxChunk)
		}
	case kindReject:
		h.Reject = true
		var l [2]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return h, fmt.Errorf("%w: listener refused the connection (its reason was cut off: %w)", errs.ErrHandshake, err)
		}
		n := int(binary.BigEndian.Uint16(l[:]))
		if n > maxRejectReason {
			return h, fmt.Errorf("%w: listener refused the connection (reason of %d bytes, limit %d)", errs.ErrHandshake, n, maxRejectReason)
		}
		reason := make([]byte, n)
		if _, err := io.ReadFull(r, reason); err != nil {
			return h, fmt.Errorf("%w: listener refused the connection (its reason was cut off: %w)", errs.ErrHandshake, err)
		}
		h.Reason = wire.Sanitize(reason) // the peer's text: safe to log, as an RDMA reject's
	default:
		return h, fmt.Errorf("%w: unknown hello kind %d from the TCP peer", errs.ErrHandshake, b[6])
	}
	return h, nil
}

// Limits are what a side accepts (its hello's limits).
type Limits struct {
	MaxMessage, MaxChunk int
}

// Hello is the hello that announces lim, in this side's version.
func (lim Limits) Hello() Hello {
	return Hello{Major: Major, Minor: Minor, MaxMessage: uint32(lim.MaxMessage), MaxChunk: uint32(lim.MaxChunk)}
}

// PutHeader encodes a frame header into b. The writer calls it for every
// frame: it must stay inlinable (scripts/check-inlining).
func PutHeader(b *[HeaderLen]byte, typ byte, n int) {
	b[0] = typ
	binary.BigEndian.PutUint32(b[1:], uint32(n))
}

// ParseHeader decodes and checks a frame header against lim: the payload
// length it returns is within lim, so the caller may allocate it. Its
// errors match errs.ErrProtocol.
func ParseHeader(b *[HeaderLen]byte, lim Limits) (typ byte, n int, err error) {
	typ = b[0]
	u := binary.BigEndian.Uint32(b[1:])
	switch typ {
	case TypeStream:
		if u == 0 || u > uint32(lim.MaxChunk) {
			return typ, 0, fmt.Errorf("%w: stream frame of %d bytes (this side accepts 1..%d)", errs.ErrProtocol, u, lim.MaxChunk)
		}
	case TypeMessage:
		if u > uint32(lim.MaxMessage) {
			return typ, 0, fmt.Errorf("%w: message of %d bytes (this side's MaxMessageSize is %d)", errs.ErrProtocol, u, lim.MaxMessage)
		}
	default:
		return typ, 0, fmt.Errorf("%w: unknown frame type %d", errs.ErrProtocol, typ)
	}
	return typ, int(u), nil
}

// readHeader reads the next frame header from r. At a frame boundary the
// end of r is io.EOF (the peer's end of stream); inside a header it is a
// protocol error.
func readHeader(r io.Reader, b *[HeaderLen]byte, lim Limits) (typ byte, n int, err error) {
	if _, err := io.ReadFull(r, b[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, 0, fmt.Errorf("%w: the connection ended inside a frame header", errs.ErrProtocol)
		}
		return 0, 0, err
	}
	return ParseHeader(b, lim)
}

// readPayload fills p from r; the end of r here is a protocol error.
func readPayload(r io.Reader, p []byte) error {
	if _, err := io.ReadFull(r, p); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: the connection ended inside a %d-byte frame", errs.ErrProtocol, len(p))
		}
		return err
	}
	return nil
}
