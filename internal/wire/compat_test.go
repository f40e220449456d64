package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// Compatibility across versions (docs/protocol.md, "Versions and compatibility").
// Protocol 1.0 is the Hello before the minor version and the features had
// bytes of their own: byte 5 was "flags (reserved, 0)" and bytes 20..23
// "reserved (0)", both ignored on receipt, and a 1.0 peer sent zeros there.

// hello10 is what a 1.0 peer sends (64 credits of 32 KiB, 4 MiB messages),
// as its encoder wrote it.
var hello10 = []byte{
	'G', 'R', 'D', 'M', // magic
	1, 0, // version 1, flags 0
	0x00, 0x40, // credits 64
	0x00, 0x00, 0x80, 0x00, // receive buffers of 32 KiB
	0x00, 0x40, 0x00, 0x00, // max message 4 MiB
	0, 0, 0, 0, // keepalive 0
	0, 0, 0, 0, // reserved 0
}

// helloV10 and parseHello10 are the 1.0 decoder, verbatim but for the
// names: what peers already deployed run on the bytes this version sends.
type helloV10 struct {
	Version     uint8
	Flags       uint8
	Credits     uint16
	RecvBufSize uint32
	MaxMsgSize  uint32
	KeepaliveMS uint32
	Reserved    uint32
}

func parseHello10(b []byte) (helloV10, error) {
	if err := checkMagic(b, "handshake"); err != nil {
		return helloV10{}, err
	}
	if len(b) > 4 && b[4] != 1 {
		return helloV10{}, errorf(ErrVersion, "peer speaks handshake version %d, this side %d", b[4], 1)
	}
	if len(b) < HelloLen {
		return helloV10{}, errorf(ErrMalformed, "handshake truncated: %d bytes, need %d", len(b), HelloLen)
	}
	h := helloV10{
		Version:     b[4],
		Flags:       b[5],
		Credits:     binary.BigEndian.Uint16(b[6:]),
		RecvBufSize: binary.BigEndian.Uint32(b[8:]),
		MaxMsgSize:  binary.BigEndian.Uint32(b[12:]),
		KeepaliveMS: binary.BigEndian.Uint32(b[16:]),
		Reserved:    binary.BigEndian.Uint32(b[20:]),
	}
	if h.Credits == 0 {
		return helloV10{}, errorf(ErrMalformed, "handshake credits 0: must be at least 1")
	}
	if h.RecvBufSize < MinBufSize || h.RecvBufSize > MaxBufSize {
		return helloV10{}, errorf(ErrMalformed, "handshake receive buffer size %d out of range [64, 1<<30]", h.RecvBufSize)
	}
	return h, nil
}

// An older peer (1.0) has no minor version and no features: it reads as
// minor 0 with no features, padded to the private-data maximum or not, and
// the connection uses no optional feature.
func TestHelloFromOlderPeer(t *testing.T) {
	for _, in := range [][]byte{hello10, append(bytes.Clone(hello10), make([]byte, maxConnectPrivateData-HelloLen)...),
		append(bytes.Clone(hello10), make([]byte, maxAcceptPrivateData-HelloLen)...)} {
		h, err := ParseHello(in)
		if err != nil {
			t.Fatalf("1.0 Hello of %d bytes refused: %v", len(in), err)
		}
		want := Hello{Version: 1, Minor: 0, Credits: 64, RecvBufSize: 32 << 10, MaxMsgSize: 4 << 20}
		if h != want {
			t.Fatalf("1.0 Hello read as %+v, want %+v", h, want)
		}
		if f := Negotiate(Supported, h.Features); f != 0 {
			t.Fatalf("negotiated %v with a 1.0 peer, want none", f)
		}
	}
}

// A 1.0 peer accepts this version's Hello, and a Hello of any later 1.x
// minor with any features and an extension, reading the fields it knows
// as this version wrote them.
func TestOlderPeerAcceptsThisHello(t *testing.T) {
	ours := validHello()
	newer := validHello()
	newer.Minor, newer.Features, newer.KeepaliveMS = 0xfe, ^Features(0), 30000
	for name, in := range map[string][]byte{
		"this version": ours.AppendTo(nil),
		"later minor":  append(newer.AppendTo(nil), bytes.Repeat([]byte{0xa5}, MaxHelloExtension)...),
	} {
		old, err := parseHello10(in)
		if err != nil {
			t.Fatalf("%s: a 1.0 peer refuses it: %v", name, err)
		}
		if old.Credits != ours.Credits || old.RecvBufSize != ours.RecvBufSize || old.MaxMsgSize != ours.MaxMsgSize {
			t.Fatalf("%s: a 1.0 peer reads %+v", name, old)
		}
	}
}

// A peer of a later minor version, announcing features this side does not
// know and fields in the extension area, is accepted; the connection falls
// back to the features both support.
func TestHelloFromNewerPeer(t *testing.T) {
	newer := Hello{Version: Version, Minor: 200, Credits: 128, RecvBufSize: 8192, MaxMsgSize: 1 << 20,
		KeepaliveMS: 15000, Features: Supported | 0xfff00000}
	ext := bytes.Repeat([]byte{0xee}, MaxHelloExtension) // a later minor's fields
	in := append(newer.AppendTo(nil), ext...)
	if len(in) != maxConnectPrivateData {
		t.Fatalf("test Hello is %d bytes, want the connect limit %d", len(in), maxConnectPrivateData)
	}
	h, err := ParseHello(in)
	if err != nil {
		t.Fatalf("newer peer refused: %v", err)
	}
	if h != newer {
		t.Fatalf("read %+v, want %+v", h, newer)
	}
	if f := Negotiate(Supported, h.Features); f != Supported {
		t.Fatalf("negotiated %v, want what this side supports (%v)", f, Supported)
	}
	if got := Negotiate(Supported, Features(0xfff00000)); got != 0 {
		t.Fatalf("unknown features alone negotiated to %v", got)
	}
}

// A peer of another major version is refused with an error naming both
// versions, whatever else its Hello holds.
func TestHelloOtherMajor(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		peer string
	}{
		{helloBytes(func(b []byte) { b[4], b[5] = 2, 0 }), "2.0"},
		{helloBytes(func(b []byte) { b[4], b[5] = 2, 7; b[6], b[7] = 0, 0 }), "2.7"}, // its layout may differ: no other check
		{[]byte{'G', 'R', 'D', 'M', 0}, "0"},
		{helloBytes(func(b []byte) { b[4], b[5] = 255, 255 }), "255.255"},
	} {
		_, err := ParseHello(tc.in)
		var ve *VersionError
		if !errors.As(err, &ve) || !errors.Is(err, ErrVersion) {
			t.Fatalf("% x: error %v, want a *VersionError matching ErrVersion", tc.in, err)
		}
		if ve.PeerVersion() != tc.peer {
			t.Fatalf("% x: peer version %q, want %q", tc.in, ve.PeerVersion(), tc.peer)
		}
		if msg := err.Error(); !strings.Contains(msg, " "+tc.peer+",") || !strings.Contains(msg, fmt.Sprintf("this side %d.%d", Version, Minor)) {
			t.Fatalf("% x: error %q does not name both versions", tc.in, msg)
		}
	}
}

func TestNegotiate(t *testing.T) {
	for _, tc := range []struct{ a, b, want Features }{
		{0, 0, 0},
		{0b1011, 0b0110, 0b0010},
		{^Features(0), 0b101, 0b101},
		{0b101, ^Features(0), 0b101},
		{1 << 31, 1 << 30, 0},
	} {
		if got := Negotiate(tc.a, tc.b); got != tc.want || Negotiate(tc.b, tc.a) != got {
			t.Errorf("Negotiate(%#x, %#x) = %#x, want %#x (either way round)", uint32(tc.a), uint32(tc.b), uint32(got), uint32(tc.want))
		}
	}
}

func TestFeaturesString(t *testing.T) {
	for f, want := range map[Features]string{
		0:                "none",
		1:                "control-reserve",
		1 << 1:           "atomics",
		1 << 2:           "trailers",
		1 << 3:           "trailers-required",
		1 << 4:           "bit 4",
		1<<31 | 1<<5 | 1: "control-reserve|bit 5|bit 31",
	} {
		if got := f.String(); got != want {
			t.Errorf("Features(%#x).String() = %q, want %q", uint32(f), got, want)
		}
	}
}

// A reject from a 1.0 peer (byte 5 reserved, 0) parses with the version
// unknown; this version's reject carries its major version in that byte,
// which a 1.0 parser ignores.
func TestRejectVersionByte(t *testing.T) {
	old := []byte{'G', 'R', 'D', 'M', byte(RejectVersion), 0, 0, 2, 'n', 'o'}
	r, err := ParseReject(old)
	if err != nil || r != (Reject{Code: RejectVersion, Reason: "no"}) {
		t.Fatalf("1.0 reject read as %+v, %v", r, err)
	}
	b := (&Reject{Code: RejectVersion, Version: Version, Reason: "no"}).AppendTo(nil)
	if b[5] != Version {
		t.Fatalf("reject version byte %d, want %d", b[5], Version)
	}
	if !bytes.Equal(b[:5], old[:5]) || !bytes.Equal(b[6:], old[6:]) {
		t.Fatalf("reject layout changed beyond byte 5: % x vs % x", b, old)
	}
}
