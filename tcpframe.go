package rdma

// The TCP fallback's wire format (fallback.go): a hello exchange, then
// frames that carry the stream and the message view over one TCP
// connection. Version 1.0; every integer is big-endian.
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

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
	"unicode/utf8"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/wire"
)

const (
	tcpMagic        = 0x564c5446 // "VLTF"
	tcpMajor        = 1
	tcpMinor        = 0
	tcpHelloLen     = 16
	tcpKindHello    = 0
	tcpKindReject   = 1
	maxRejectReason = 512

	frameHeaderLen = 5
	frameStream    = 1
	frameMessage   = 2
)

// tcpHello is one side's hello (or a listener's reject).
type tcpHello struct {
	Major, Minor uint8
	Reject       bool
	MaxMessage   uint32 // the largest message the sender accepts
	MaxChunk     uint32 // the largest stream frame the sender accepts
	Reason       string // a reject's reason
}

// appendTo encodes h.
func (h *tcpHello) appendTo(b []byte) []byte {
	var kind byte = tcpKindHello
	if h.Reject {
		kind = tcpKindReject
	}
	b = binary.BigEndian.AppendUint32(b, tcpMagic)
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

// errNotFallbackPeer: the TCP peer did not start with the fallback magic.
var errNotFallbackPeer = errors.New("the TCP peer is not a verbline fallback peer (no \"VLTF\" hello: " +
	"a plain TCP service, or a listener without ListenConfig.Fallback, on that port?)")

// writeTCPReject refuses a fallback connection: a reject hello with this
// side's version and reason, best effort (the caller closes nc next).
func writeTCPReject(w io.Writer, reason string) {
	w.Write((&tcpHello{Major: tcpMajor, Minor: tcpMinor, Reject: true, Reason: reason}).appendTo(nil))
}

// readTCPHello reads and checks one hello (with a reject's reason) from r.
// It reads at most tcpHelloLen+2+maxRejectReason bytes and allocates at
// most the reason.
func readTCPHello(r io.Reader) (tcpHello, error) {
	var b [tcpHelloLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return tcpHello{}, fmt.Errorf("%w: the peer closed the connection during the hello", ErrHandshake)
		}
		return tcpHello{}, err
	}
	if binary.BigEndian.Uint32(b[0:]) != tcpMagic {
		return tcpHello{}, fmt.Errorf("%w: %w", ErrHandshake, errNotFallbackPeer)
	}
	h := tcpHello{Major: b[4], Minor: b[5],
		MaxMessage: binary.BigEndian.Uint32(b[8:]), MaxChunk: binary.BigEndian.Uint32(b[12:])}
	switch b[6] {
	case tcpKindHello:
		if h.Major != tcpMajor {
			return h, fmt.Errorf("%w: the peer speaks TCP fallback protocol %d.%d, this side %d.%d",
				ErrHandshake, h.Major, h.Minor, tcpMajor, tcpMinor)
		}
		if h.MaxMessage == 0 || h.MaxChunk == 0 {
			return h, fmt.Errorf("%w: the peer's hello has a zero limit (max message %d, max chunk %d)",
				ErrHandshake, h.MaxMessage, h.MaxChunk)
		}
	case tcpKindReject:
		h.Reject = true
		var l [2]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return h, fmt.Errorf("%w: listener refused the connection (its reason was cut off: %w)", ErrHandshake, err)
		}
		n := int(binary.BigEndian.Uint16(l[:]))
		if n > maxRejectReason {
			return h, fmt.Errorf("%w: listener refused the connection (reason of %d bytes, limit %d)", ErrHandshake, n, maxRejectReason)
		}
		reason := make([]byte, n)
		if _, err := io.ReadFull(r, reason); err != nil {
			return h, fmt.Errorf("%w: listener refused the connection (its reason was cut off: %w)", ErrHandshake, err)
		}
		h.Reason = wire.Sanitize(reason) // the peer's text: safe to log, as an RDMA reject's
	default:
		return h, fmt.Errorf("%w: unknown hello kind %d from the TCP peer", ErrHandshake, b[6])
	}
	return h, nil
}

// frameLimits are what this side accepts (its hello's limits).
type frameLimits struct {
	maxMessage, maxChunk int
}

// putFrameHeader encodes a frame header into b.
func putFrameHeader(b *[frameHeaderLen]byte, typ byte, n int) {
	b[0] = typ
	binary.BigEndian.PutUint32(b[1:], uint32(n))
}

// parseFrameHeader decodes and checks a frame header against lim: the
// payload length it returns is within lim, so the caller may allocate it.
func parseFrameHeader(b *[frameHeaderLen]byte, lim frameLimits) (typ byte, n int, err error) {
	typ = b[0]
	u := binary.BigEndian.Uint32(b[1:])
	switch typ {
	case frameStream:
		if u == 0 || u > uint32(lim.maxChunk) {
			return typ, 0, fmt.Errorf("%w: stream frame of %d bytes (this side accepts 1..%d)", ErrProtocol, u, lim.maxChunk)
		}
	case frameMessage:
		if u > uint32(lim.maxMessage) {
			return typ, 0, fmt.Errorf("%w: message of %d bytes (this side's MaxMessageSize is %d)", ErrProtocol, u, lim.maxMessage)
		}
	default:
		return typ, 0, fmt.Errorf("%w: unknown frame type %d", ErrProtocol, typ)
	}
	return typ, int(u), nil
}

// readFrameHeader reads the next frame header from r. At a frame boundary
// the end of r is io.EOF (the peer's end of stream); inside a header it is
// a protocol error.
func readFrameHeader(r io.Reader, b *[frameHeaderLen]byte, lim frameLimits) (typ byte, n int, err error) {
	if _, err := io.ReadFull(r, b[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, 0, fmt.Errorf("%w: the connection ended inside a frame header", ErrProtocol)
		}
		return 0, 0, err
	}
	return parseFrameHeader(b, lim)
}

// readFramePayload fills p from r; the end of r here is a protocol error.
func readFramePayload(r io.Reader, p []byte) error {
	if _, err := io.ReadFull(r, p); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: the connection ended inside a %d-byte frame", ErrProtocol, len(p))
		}
		return err
	}
	return nil
}

// frameCommitFirst is the most a frame's header alone makes the reader
// take from the pool: a larger payload's buffer grows as its bytes arrive
// (frameReader.next).
const frameCommitFirst = 64 << 10

// frameConn is what frameReader reads from: a connection with a read
// deadline (a *net.TCPConn).
type frameConn interface {
	io.Reader
	SetReadDeadline(time.Time) error
}

// frameSource is the connection readLoop reads frames from, which it
// closes when the peer breaks the protocol (a *net.TCPConn).
type frameSource interface {
	frameConn
	io.Closer
}

// frameReader reads frames from a connection, with two bounds on what a
// peer can make this side hold:
//
//   - Memory follows the payload: a frame's buffer starts at
//     frameCommitFirst bytes at most and is replaced by one four times as
//     large (the pool's next size class) each time the payload received
//     fills it, so a frame holds at most four times what arrived of it
//     (and frameCommitFirst for its header alone).
//   - Time: once a frame's first byte has arrived, each read until its end
//     must bring bytes within stall; a peer that pauses longer inside a
//     frame is in violation (ErrProtocol, matching os.ErrDeadlineExceeded).
//     Between frames there is no bound (keepalive watches an idle peer).
type frameReader struct {
	c     frameConn
	lim   frameLimits
	stall time.Duration
	get   func(n int) (buffer.Buf, error) // a buffer of n bytes, waiting for room
	armed bool                            // a read deadline is set
	hdr   [frameHeaderLen]byte
}

// arm sets the read deadline stall from now.
func (fr *frameReader) arm() {
	fr.c.SetReadDeadline(time.Now().Add(fr.stall))
	fr.armed = true
}

// stalled is the error of a peer that paused inside a frame of n bytes
// after got of them (n < 0: inside its header).
func (fr *frameReader) stalled(n, got int) error {
	what := "a frame header"
	if n >= 0 {
		what = fmt.Sprintf("a %d-byte frame after %d bytes of it", n, got)
	}
	return fmt.Errorf("%w: the peer stopped sending inside %s for %v (Config.HandshakeTimeout): %w",
		ErrProtocol, what, fr.stall, os.ErrDeadlineExceeded)
}

// next reads the next frame: its type and its payload in a buffer from
// get, the caller's to release. At a frame boundary the end of the
// connection is io.EOF.
func (fr *frameReader) next() (typ byte, b buffer.Buf, err error) {
	// The header's first bytes, without deadline (a deadline left armed by
	// the frame before is dropped when it passes with nothing read).
	got := 0
	for got == 0 {
		got, err = fr.c.Read(fr.hdr[:])
		if got == 0 && err != nil {
			if fr.armed && errors.Is(err, os.ErrDeadlineExceeded) {
				fr.c.SetReadDeadline(time.Time{})
				fr.armed = false
				continue
			}
			return 0, buffer.Buf{}, err
		}
	}
	if got < frameHeaderLen {
		fr.arm()
		if _, err := io.ReadFull(fr.c, fr.hdr[got:]); err != nil {
			switch {
			case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
				err = fmt.Errorf("%w: the connection ended inside a frame header", ErrProtocol)
			case errors.Is(err, os.ErrDeadlineExceeded):
				err = fr.stalled(-1, 0)
			}
			return 0, buffer.Buf{}, err
		}
	}
	typ, n, err := parseFrameHeader(&fr.hdr, fr.lim)
	if err != nil {
		return typ, buffer.Buf{}, err
	}
	b, err = fr.get(min(n, frameCommitFirst))
	if err != nil {
		return typ, buffer.Buf{}, err
	}
	got = 0
	for got < n {
		if got == b.Len() { // full: move to a buffer four times as large
			nb, err := fr.get(min(n, 4*got))
			if err != nil {
				b.Release()
				return typ, buffer.Buf{}, err
			}
			copy(nb.Bytes(), b.Bytes())
			b.Release()
			b = nb
		}
		fr.arm() // after get, which may have waited
		k, err := fr.c.Read(b.Bytes()[got:])
		got += k
		if err != nil && got < n {
			b.Release()
			switch {
			case err == io.EOF:
				err = fmt.Errorf("%w: the connection ended inside a %d-byte frame", ErrProtocol, n)
			case errors.Is(err, os.ErrDeadlineExceeded):
				err = fr.stalled(n, got)
			}
			return typ, buffer.Buf{}, err
		}
	}
	return typ, b, nil
}
