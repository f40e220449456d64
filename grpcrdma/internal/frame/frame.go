// Package frame encodes and decodes the bytes grpcrdma peers exchange: every
// library message of a grpcrdma connection is one frame (a 12-byte header,
// then a payload), and a stream frame's payload starts with a header block
// of metadata and status fields. docs/grpcrdma-protocol.md is the
// specification; this package is its only encoder and decoder.
//
// Every decoder takes untrusted peer bytes: it never panics, never
// allocates more than the input's length, and returns an error wrapping
// ErrMalformed.
package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Protocol version spoken by this implementation.
const (
	Major = 1
	Minor = 0
)

// HeaderLen is the length of every frame's header.
const HeaderLen = 12

// Type is a frame's type (byte 0 of the header).
type Type uint8

// Frame types.
const (
	TypeSettings Type = 1 // stream 0: the sender's version, features and limits
	TypeStream   Type = 2 // a call's headers, message, end and status, as its flags say
	TypeCancel   Type = 3 // the sender abandons a call; Value is a gRPC code
	TypeWindow   Type = 4 // Value more message bytes may be sent on the stream (stream 0: on the connection)
	TypeGoAway   Type = 5 // stream 0: no stream above Value will be served
)

func (t Type) String() string {
	switch t {
	case TypeSettings:
		return "SETTINGS"
	case TypeStream:
		return "STREAM"
	case TypeCancel:
		return "CANCEL"
	case TypeWindow:
		return "WINDOW"
	case TypeGoAway:
		return "GOAWAY"
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Flags of a STREAM frame (byte 1 of the header). Other types carry none.
const (
	FlagHeaders uint8 = 1 << 0 // the block holds the call's headers (request or response)
	FlagMessage uint8 = 1 << 1 // a message follows the block, to the end of the frame
	FlagEnd     uint8 = 1 << 2 // the client sends nothing more on this stream (half-close)
	FlagStatus  uint8 = 1 << 3 // the block holds the status and trailers: the server's last frame

	flagsKnown = FlagHeaders | FlagMessage | FlagEnd | FlagStatus
)

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("grpcrdma: malformed frame")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

// Header is a frame's fixed header.
//
//	off size field
//	  0    1 type
//	  1    1 flags
//	  2    2 reserved, 0
//	  4    4 stream id (0 for SETTINGS and GOAWAY)
//	  8    4 value: STREAM: the header block's length; CANCEL: a gRPC code;
//	         WINDOW: the increment (stream 0: the connection's); GOAWAY: the last stream id served;
//	         SETTINGS: 0
type Header struct {
	Type   Type
	Flags  uint8
	Stream uint32
	Value  uint32
}

// Put writes h into b[:HeaderLen].
func (h Header) Put(b []byte) {
	_ = b[HeaderLen-1]
	b[0] = byte(h.Type)
	b[1] = h.Flags
	b[2], b[3] = 0, 0
	binary.BigEndian.PutUint32(b[4:], h.Stream)
	binary.BigEndian.PutUint32(b[8:], h.Value)
}

// Frame is a decoded frame: its header and, for a STREAM frame, the header
// block and the message, both slices of the input.
type Frame struct {
	Header
	Block   []byte // STREAM: the header block (Value bytes)
	Message []byte // STREAM with FlagMessage: the message; other types: the payload
}

// Limits bound what Parse accepts.
type Limits struct {
	MaxBlock int // largest header block
}

// Parse decodes one frame from b (one received library message). The
// slices of the result alias b. It checks what can be checked without the
// connection's state: lengths, flags, stream ids per type.
func Parse(b []byte, lim Limits) (Frame, error) {
	if len(b) < HeaderLen {
		return Frame{}, malformed("%d bytes, shorter than a frame header", len(b))
	}
	f := Frame{Header: Header{
		Type:   Type(b[0]),
		Flags:  b[1],
		Stream: binary.BigEndian.Uint32(b[4:]),
		Value:  binary.BigEndian.Uint32(b[8:]),
	}}
	if b[2] != 0 || b[3] != 0 {
		return Frame{}, malformed("%v frame: reserved bytes not zero", f.Type)
	}
	p := b[HeaderLen:]
	switch f.Type {
	case TypeStream:
		if f.Stream == 0 {
			return Frame{}, malformed("STREAM frame on stream 0")
		}
		if f.Flags&^flagsKnown != 0 {
			return Frame{}, malformed("STREAM frame: unknown flags %#x", f.Flags)
		}
		if f.Flags == 0 {
			return Frame{}, malformed("STREAM frame with no flag")
		}
		if uint64(f.Value) > uint64(len(p)) {
			return Frame{}, malformed("STREAM frame: header block of %d bytes in a payload of %d", f.Value, len(p))
		}
		if int64(f.Value) > int64(lim.MaxBlock) {
			return Frame{}, malformed("STREAM frame: header block of %d bytes, above the limit of %d", f.Value, lim.MaxBlock)
		}
		if f.Value > 0 && f.Flags&(FlagHeaders|FlagStatus) == 0 {
			return Frame{}, malformed("STREAM frame: a header block without FlagHeaders or FlagStatus")
		}
		f.Block = p[:f.Value]
		rest := p[f.Value:]
		if f.Flags&FlagMessage != 0 {
			f.Message = rest
		} else if len(rest) != 0 {
			return Frame{}, malformed("STREAM frame: %d bytes after the block without FlagMessage", len(rest))
		}
		return f, nil
	case TypeSettings, TypeGoAway:
		if f.Stream != 0 {
			return Frame{}, malformed("%v frame on stream %d, want 0", f.Type, f.Stream)
		}
	case TypeCancel, TypeWindow:
		if f.Type == TypeCancel && f.Stream == 0 {
			return Frame{}, malformed("CANCEL frame on stream 0")
		}
		if f.Type == TypeWindow && f.Value == 0 {
			return Frame{}, malformed("WINDOW frame with increment 0")
		}
	default:
		return Frame{}, malformed("unknown frame type %d", b[0])
	}
	if f.Flags != 0 {
		return Frame{}, malformed("%v frame with flags %#x", f.Type, f.Flags)
	}
	if f.Type != TypeSettings && f.Type != TypeCancel && f.Type != TypeGoAway && len(p) != 0 {
		return Frame{}, malformed("%v frame with a payload of %d bytes", f.Type, len(p))
	}
	f.Message = p
	return f, nil
}
