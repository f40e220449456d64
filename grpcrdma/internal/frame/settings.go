package frame

import "encoding/binary"

// SettingsLen is the length of a SETTINGS payload of this version; a longer
// one comes from a later minor version, whose extra bytes are ignored.
const SettingsLen = 28

// Settings is the payload of the SETTINGS frame each side sends first.
//
//	off size field
//	  0    1 major version: must equal the receiver's
//	  1    1 minor version: informational
//	  2    2 reserved, 0
//	  4    4 features the sender supports (bitmask; none defined in 1.0)
//	  8    4 stream window: message bytes the sender accepts unread per stream
//	 12    4 max concurrent streams the sender serves (0 for a client)
//	 16    4 max header block the sender accepts
//	 20    4 max message the sender accepts (advisory; the call fails with
//	         ResourceExhausted at the receiver if exceeded)
//	 24    4 connection window: message bytes the sender accepts unread
//	         over all its streams
type Settings struct {
	Major, Minor   uint8
	Features       uint32
	StreamWindow   uint32
	MaxStreams     uint32
	MaxBlock       uint32
	MaxRecvMessage uint32
	ConnWindow     uint32
}

// Smallest values a peer may announce: below them a call could not move.
const (
	MinStreamWindow = 1024
	MinConnWindow   = 1024
	MinBlock        = 1024
)

// Append appends s's encoding.
func (s Settings) Append(b []byte) []byte {
	b = append(b, s.Major, s.Minor, 0, 0)
	b = binary.BigEndian.AppendUint32(b, s.Features)
	b = binary.BigEndian.AppendUint32(b, s.StreamWindow)
	b = binary.BigEndian.AppendUint32(b, s.MaxStreams)
	b = binary.BigEndian.AppendUint32(b, s.MaxBlock)
	b = binary.BigEndian.AppendUint32(b, s.MaxRecvMessage)
	return binary.BigEndian.AppendUint32(b, s.ConnWindow)
}

// ParseSettings decodes a SETTINGS payload. A different major version is
// reported as an error; so are limits too small to make progress.
func ParseSettings(p []byte) (Settings, error) {
	if len(p) < SettingsLen {
		return Settings{}, malformed("SETTINGS payload of %d bytes, want at least %d", len(p), SettingsLen)
	}
	s := Settings{
		Major:          p[0],
		Minor:          p[1],
		Features:       binary.BigEndian.Uint32(p[4:]),
		StreamWindow:   binary.BigEndian.Uint32(p[8:]),
		MaxStreams:     binary.BigEndian.Uint32(p[12:]),
		MaxBlock:       binary.BigEndian.Uint32(p[16:]),
		MaxRecvMessage: binary.BigEndian.Uint32(p[20:]),
		ConnWindow:     binary.BigEndian.Uint32(p[24:]),
	}
	if s.Major != Major {
		return Settings{}, malformed("peer speaks grpcrdma protocol %d.%d, this side %d.%d", s.Major, s.Minor, Major, Minor)
	}
	if s.StreamWindow < MinStreamWindow || s.ConnWindow < MinConnWindow || s.MaxBlock < MinBlock {
		return Settings{}, malformed("SETTINGS: stream window %d, connection window %d or max header block %d below the minimum (%d, %d, %d)",
			s.StreamWindow, s.ConnWindow, s.MaxBlock, MinStreamWindow, MinConnWindow, MinBlock)
	}
	return s, nil
}
