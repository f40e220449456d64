package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func validHello() Hello {
	return Hello{Version: Version, Minor: Minor, Credits: 16, RecvBufSize: 64 << 10, MaxMsgSize: 1 << 20, Features: Supported}
}

func TestHelloRoundTrip(t *testing.T) {
	for _, h := range []Hello{
		validHello(),
		{Version: Version, Credits: 1, RecvBufSize: MinBufSize},
		{Version: Version, Minor: 0xff, Credits: 0xffff, RecvBufSize: MaxBufSize, MaxMsgSize: ^uint32(0), KeepaliveMS: ^uint32(0), Features: ^Features(0)},
	} {
		b := h.AppendTo(nil)
		if len(b) != HelloLen {
			t.Fatalf("%+v: encoded %d bytes, want %d", h, len(b), HelloLen)
		}
		got, err := ParseHello(b)
		if err != nil || got != h {
			t.Fatalf("round trip %+v: got %+v, %v", h, got, err)
		}
	}
}

func TestHelloLayout(t *testing.T) {
	h := Hello{Version: 1, Minor: 2, Credits: 0x0304, RecvBufSize: 0x05060708, MaxMsgSize: 0x090a0b0c, KeepaliveMS: 0x0d0e0f10, Features: 0x11121314}
	want := []byte{'G', 'R', 'D', 'M', 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}
	if got := h.AppendTo([]byte{0xaa}); !bytes.Equal(got, append([]byte{0xaa}, want...)) {
		t.Fatalf("layout: got % x, want aa % x", got, want)
	}
}

func TestHelloPadding(t *testing.T) {
	h := validHello()
	b := h.AppendTo(nil)
	padded := append(b, make([]byte, maxConnectPrivateData-len(b))...)
	for _, in := range [][]byte{padded, append(b, make([]byte, maxAcceptPrivateData-len(b))...), append(b, 0xde, 0xad)} {
		if got, err := ParseHello(in); err != nil || got != h {
			t.Fatalf("padded %d bytes: got %+v, %v", len(in), got, err)
		}
	}
}

func helloBytes(mod func(b []byte)) []byte {
	h := validHello()
	b := h.AppendTo(nil)
	mod(b)
	return b
}

const mustMatch = ": the major versions must match (run releases of one major version on both sides)"

func TestParseHelloErrors(t *testing.T) {
	good := helloBytes(func([]byte) {})
	for _, tc := range []struct {
		name string
		in   []byte
		is   error
		msg  string
	}{
		{"nil", nil, ErrNotOurs, "not a verbline handshake (0 bytes, too short for magic)"},
		{"short", []byte("GRD"), ErrNotOurs, "not a verbline handshake (3 bytes, too short for magic)"},
		{"zeros", make([]byte, 56), ErrNotOurs, "not a verbline handshake (magic 0x00000000)"},
		{"foreign", []byte("HTTP/1.1 200 OK\r\n\r\n garbage garbage"), ErrNotOurs, "not a verbline handshake (magic 0x48545450)"},
		{"magic only", good[:4], ErrMalformed, "handshake truncated: 4 bytes, need 24"},
		{"truncated", good[:23], ErrMalformed, "handshake truncated: 23 bytes, need 24"},
		{"version 2", helloBytes(func(b []byte) { b[4], b[5] = 2, 3 }), ErrVersion, "peer speaks verbline wire protocol 2.3, this side 1.4" + mustMatch},
		{"version 2 short", helloBytes(func(b []byte) { b[4], b[5] = 2, 0 })[:8], ErrVersion, "peer speaks verbline wire protocol 2.0, this side 1.4" + mustMatch},
		{"version 2 no minor", helloBytes(func(b []byte) { b[4] = 2 })[:5], ErrVersion, "peer speaks verbline wire protocol 2, this side 1.4" + mustMatch},
		{"version 0", helloBytes(func(b []byte) { b[4], b[5] = 0, 9 }), ErrVersion, "peer speaks verbline wire protocol 0.9, this side 1.4" + mustMatch},
		{"credits 0", helloBytes(func(b []byte) { b[6], b[7] = 0, 0 }), ErrMalformed, "handshake credits 0: must be at least 1"},
		{"buf small", helloBytes(func(b []byte) { binary.BigEndian.PutUint32(b[8:], 63) }), ErrMalformed, "handshake receive buffer size 63 out of range [64, 1<<30]"},
		{"buf zero", helloBytes(func(b []byte) { binary.BigEndian.PutUint32(b[8:], 0) }), ErrMalformed, "handshake receive buffer size 0 out of range [64, 1<<30]"},
		{"buf big", helloBytes(func(b []byte) { binary.BigEndian.PutUint32(b[8:], 1<<30+1) }), ErrMalformed, "handshake receive buffer size 1073741825 out of range [64, 1<<30]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := ParseHello(tc.in)
			if !errors.Is(err, tc.is) {
				t.Fatalf("err = %v, want errors.Is %v", err, tc.is)
			}
			if err.Error() != tc.msg {
				t.Fatalf("err = %q, want %q", err, tc.msg)
			}
			if h != (Hello{}) {
				t.Fatalf("non-zero Hello %+v with error", h)
			}
			for _, other := range []error{ErrNotOurs, ErrVersion, ErrMalformed} {
				if other != tc.is && errors.Is(err, other) {
					t.Fatalf("err %v also matches %v", err, other)
				}
			}
		})
	}
}

func TestRejectCodeString(t *testing.T) {
	for c, want := range map[RejectCode]string{
		RejectMalformed: "malformed", RejectVersion: "version", RejectOverloaded: "overloaded",
		RejectShutdown: "shutdown", RejectResources: "resources", RejectPolicy: "policy", RejectIncompatible: "incompatible", 0: "RejectCode(0)", 200: "RejectCode(200)",
	} {
		if got := c.String(); got != want {
			t.Errorf("RejectCode(%d).String() = %q, want %q", uint8(c), got, want)
		}
	}
}

func TestRejectRoundTrip(t *testing.T) {
	for _, r := range []Reject{
		{Code: RejectOverloaded},
		{Code: RejectVersion, Version: Version, Reason: "dialer speaks verbline wire protocol 2.0, this listener 1.1"},
		{Code: RejectResources, Version: 0, Reason: "kein Speicher für Puffer — später"}, // a 1.0 reject
		{Code: 99, Version: 0xff, Reason: strings.Repeat("x", MaxRejectReason)},
	} {
		b := r.AppendTo(nil)
		if len(b) > maxRejectPrivateData {
			t.Fatalf("%+v: %d bytes exceeds %d", r, len(b), maxRejectPrivateData)
		}
		got, err := ParseReject(b)
		if err != nil || got != r {
			t.Fatalf("round trip %+v: got %+v, %v", r, got, err)
		}
		// Padded to the private-data maximum.
		got, err = ParseReject(append(b, make([]byte, maxRejectPrivateData-len(b))...))
		if err != nil || got != r {
			t.Fatalf("padded %+v: got %+v, %v", r, got, err)
		}
	}
}

func TestRejectLayout(t *testing.T) {
	r := Reject{Code: RejectShutdown, Version: 1, Reason: "bye"}
	want := []byte{'G', 'R', 'D', 'M', 4, 1, 0, 3, 'b', 'y', 'e'}
	if got := r.AppendTo(nil); !bytes.Equal(got, want) {
		t.Fatalf("got % x, want % x", got, want)
	}
}

func TestRejectTruncation(t *testing.T) {
	for _, tc := range []struct {
		reason string
		want   int // encoded reason length
	}{
		{strings.Repeat("a", MaxRejectReason+50), MaxRejectReason},
		{strings.Repeat("a", MaxRejectReason-1) + "é", MaxRejectReason - 1},  // 2-byte rune straddles the limit
		{strings.Repeat("a", MaxRejectReason-2) + "€x", MaxRejectReason - 2}, // 3-byte rune
		{strings.Repeat("a", MaxRejectReason-1) + "😀", MaxRejectReason - 1},  // 4-byte rune
		{strings.Repeat("a", MaxRejectReason-4) + "😀x", MaxRejectReason},     // rune ends exactly at the limit
		{strings.Repeat("\x80", 300), MaxRejectReason - 3},                   // invalid UTF-8: bounded back-off
	} {
		r := Reject{Code: RejectMalformed, Reason: tc.reason}
		b := r.AppendTo(nil)
		if n := int(binary.BigEndian.Uint16(b[6:])); n != tc.want || len(b) != 8+n {
			t.Fatalf("reason of %d bytes: encoded length %d (total %d), want %d", len(tc.reason), n, len(b), tc.want)
		}
		if got := string(b[8:]); !strings.HasPrefix(tc.reason, got) {
			t.Fatalf("encoded reason is not a prefix")
		}
		if utf8.ValidString(tc.reason) && !utf8.Valid(b[8:]) {
			t.Fatalf("truncation split a rune: %q", b[8:])
		}
		if _, err := ParseReject(b); err != nil {
			t.Fatalf("truncated reject does not parse: %v", err)
		}
	}
}

func TestRejectSanitize(t *testing.T) {
	for in, want := range map[string]string{
		"plain text ok":              "plain text ok",
		"line\nbreak\ttab\r\x00":     "line?break?tab??",
		"esc \x1b[31mred\x1b[0m":     "esc ?[31mred?[0m",
		"bad \xff\xfe utf8":          "bad ?? utf8",
		"bidi \u202egnp.exe":         "bidi ?gnp.exe",
		"del\x7f":                    "del?",
		"ünïcödé ✓":                  "ünïcödé ✓",
		"nbsp\u00a0zwsp\u200b":       "nbsp?zwsp?",
		"truncated rune \xe2\x82":    "truncated rune ??",
		"replacement char \ufffd ok": "replacement char \ufffd ok",
	} {
		b := binary.BigEndian.AppendUint32(nil, Magic)
		b = append(b, byte(RejectMalformed), 0)
		b = binary.BigEndian.AppendUint16(b, uint16(len(in)))
		b = append(b, in...)
		got, err := ParseReject(b)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if got.Reason != want {
			t.Errorf("sanitize %q = %q, want %q", in, got.Reason, want)
		}
	}
}

func TestParseRejectErrors(t *testing.T) {
	hdr := func(code byte, n uint16) []byte {
		b := binary.BigEndian.AppendUint32(nil, Magic)
		b = append(b, code, 0)
		return binary.BigEndian.AppendUint16(b, n)
	}
	for _, tc := range []struct {
		name string
		in   []byte
		is   error
		msg  string
	}{
		{"kernel empty", nil, ErrNotOurs, "not a verbline reject (0 bytes, too short for magic)"},
		{"kernel zeros", make([]byte, 148), ErrNotOurs, "not a verbline reject (magic 0x00000000)"},
		{"foreign", []byte("nope, go away"), ErrNotOurs, "not a verbline reject (magic 0x6e6f7065)"},
		{"header truncated", hdr(1, 0)[:7], ErrMalformed, "reject truncated: 7 bytes, need 8"},
		{"reason beyond buffer", append(hdr(1, 10), "short"...), ErrMalformed, "reject reason length 10 beyond the 5 bytes present"},
		{"reason too long", append(hdr(1, 0xffff), make([]byte, 200)...), ErrMalformed, "reject reason length 65535 exceeds 140"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseReject(tc.in)
			if !errors.Is(err, tc.is) || err.Error() != tc.msg {
				t.Fatalf("err = %v, want %q (errors.Is %v)", err, tc.msg, tc.is)
			}
			if r != (Reject{}) {
				t.Fatalf("non-zero Reject %+v with error", r)
			}
		})
	}
}

func TestKindString(t *testing.T) {
	for k, want := range map[Kind]string{KindData: "data", KindCredit: "credit", KindFIN: "fin", KindKeepalive: "keepalive", KindMessage: "message", KindRendezvous: "rendezvous", KindRendezvousDone: "rendezvous-done", KindNotify: "notify", 8: "Kind(8)", 255: "Kind(255)"} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", uint8(k), got, want)
		}
	}
}

func TestImm(t *testing.T) {
	for _, tc := range []struct {
		k       Kind
		credits uint32
		imm     uint32
		back    uint32 // credits after decode (clamped)
	}{
		{KindData, 0, 0x00000000, 0},
		{KindData, 7, 0x00000007, 7},
		{KindCredit, 300, 0x0100012c, 300},
		{KindFIN, 0, 0x02000000, 0},
		{KindKeepalive, MaxImmCredits, 0x03ffffff, MaxImmCredits},
		{KindData, MaxImmCredits + 1, 0x00ffffff, MaxImmCredits}, // clamped, kind untouched
		{KindCredit, ^uint32(0), 0x01ffffff, MaxImmCredits},      // clamped
		{KindRendezvousDone, 42, 0x0600002a, 42},                 // a rendezvous id, not credits
	} {
		imm := EncodeImm(tc.k, tc.credits)
		if imm != tc.imm {
			t.Fatalf("EncodeImm(%v, %d) = %#08x, want %#08x", tc.k, tc.credits, imm, tc.imm)
		}
		k, c, err := DecodeImm(imm)
		if err != nil || k != tc.k || c != tc.back {
			t.Fatalf("DecodeImm(%#08x) = %v, %d, %v; want %v, %d", imm, k, c, err, tc.k, tc.back)
		}
	}
}

func TestDecodeImmUnknownKind(t *testing.T) {
	for imm, want := range map[uint32]string{
		0x08000000: "unknown message kind 8",
		0x08000001: "unknown message kind 8",
		0xff123456: "unknown message kind 255",
	} {
		k, c, err := DecodeImm(imm)
		if !errors.Is(err, ErrMalformed) || err.Error() != want || k != 0 || c != 0 {
			t.Fatalf("DecodeImm(%#08x) = %v, %d, %v; want ErrMalformed %q", imm, k, c, err, want)
		}
	}
}

func FuzzParseHello(f *testing.F) {
	h := validHello()
	good := h.AppendTo(nil)
	f.Add(good)
	f.Add(append(good, make([]byte, 32)...))
	f.Add(good[:10])
	f.Add([]byte{})
	f.Add(make([]byte, 56))
	f.Add(helloBytes(func(b []byte) { b[4] = 2 }))
	f.Add(helloBytes(func(b []byte) { b[4] = 2 })[:5])
	f.Add(append(helloBytes(func(b []byte) { b[5] = 0xfe; binary.BigEndian.PutUint32(b[20:], 0xffffffff) }), 1, 2, 3, 4))
	f.Add(hello10) // a 1.0 peer's
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHello(b)
		// Peers of 1.0 and of 1.1 accept exactly the same Hellos, and read
		// the fields they share the same way.
		old, oldErr := parseHello10(b)
		if (err == nil) != (oldErr == nil) {
			t.Fatalf("1.1 decoder: %v; 1.0 decoder: %v", err, oldErr)
		}
		if err == nil && (old.Version != h.Version || old.Credits != h.Credits || old.RecvBufSize != h.RecvBufSize ||
			old.MaxMsgSize != h.MaxMsgSize || old.KeepaliveMS != h.KeepaliveMS) {
			t.Fatalf("1.1 decoder read %+v, 1.0 decoder %+v", h, old)
		}
		if err != nil {
			if !errors.Is(err, ErrNotOurs) && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrMalformed) {
				t.Fatalf("unclassified error %v", err)
			}
			var ve *VersionError
			if errors.As(err, &ve) != errors.Is(err, ErrVersion) || (ve != nil && (ve.Major == Version || ve.Major != b[4])) {
				t.Fatalf("version error %v (%+v) for % x", err, ve, b)
			}
			return
		}
		enc := h.AppendTo(nil)
		if !bytes.Equal(enc, b[:HelloLen]) {
			t.Fatalf("re-encoding differs: % x vs % x", enc, b[:HelloLen])
		}
		h2, err := ParseHello(enc)
		if err != nil || h2 != h {
			t.Fatalf("re-parse: %+v, %v; want %+v", h2, err, h)
		}
	})
}

func FuzzParseReject(f *testing.F) {
	for _, r := range []Reject{{Code: RejectOverloaded, Reason: "too many connections"}, {Code: RejectShutdown}, {Code: 7, Reason: "ünï\x01\xff"}} {
		f.Add(r.AppendTo(nil))
	}
	f.Add([]byte{})
	f.Add(make([]byte, 148))
	f.Add([]byte("GRDM\x01\x00\x00\x50short"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseReject(b)
		if err != nil {
			if !errors.Is(err, ErrNotOurs) && !errors.Is(err, ErrMalformed) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if !utf8.ValidString(r.Reason) || len(r.Reason) > MaxRejectReason {
			t.Fatalf("unsafe reason %q", r.Reason)
		}
		enc := r.AppendTo(nil)
		r2, err := ParseReject(enc)
		if err != nil || r2 != r {
			t.Fatalf("re-parse: %+v, %v; want %+v", r2, err, r)
		}
	})
}

func FuzzDecodeImm(f *testing.F) {
	for _, imm := range []uint32{0, 1, 0x01000010, 0x02000000, 0x03ffffff, 0x04000000, 0xffffffff} {
		f.Add(imm)
	}
	f.Fuzz(func(t *testing.T, imm uint32) {
		k, c, err := DecodeImm(imm)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if enc := EncodeImm(k, c); enc != imm {
			t.Fatalf("re-encode %v %d = %#08x, want %#08x", k, c, enc, imm)
		}
	})
}

func TestRegionRoundTrip(t *testing.T) {
	r := Region{Addr: 0x7f0000001000, Len: 4096, RKey: 0x1234}
	b := r.AppendTo(nil)
	if len(b) != RegionLen {
		t.Fatalf("encoded %d bytes", len(b))
	}
	got, err := ParseRegion(append(b, 0, 0, 0))
	if err != nil || got != r {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	if _, err := ParseRegion(b[:15]); !errors.Is(err, ErrMalformed) {
		t.Fatalf("truncated: %v", err)
	}
	wrap := Region{Addr: ^uint64(0) - 10, Len: 100}
	if _, err := ParseRegion(wrap.AppendTo(nil)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("wrapping region: %v", err)
	}
}

func FuzzParseRegion(f *testing.F) {
	f.Add(Region{Addr: 4096, Len: 16, RKey: 7}.AppendTo(nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRegion(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		again, err := ParseRegion(r.AppendTo(nil))
		if err != nil || again != r {
			t.Fatalf("re-encoded region %+v parsed as %+v, %v", r, again, err)
		}
	})
}

func TestRendezvousRoundTrip(t *testing.T) {
	r := Rendezvous{ID: 5, Region: Region{Addr: 1 << 40, Len: 1 << 20, RKey: 0xabcd01}}
	b := r.AppendTo(nil)
	if len(b) != RendezvousLen {
		t.Fatalf("encoded %d bytes, want %d", len(b), RendezvousLen)
	}
	got, err := ParseRendezvous(append(b, 0, 0)) // trailing padding is ignored
	if err != nil || got != r {
		t.Fatalf("parsed %+v, %v; want %+v", got, err, r)
	}
	for name, bad := range map[string][]byte{
		"truncated": b[:RendezvousLen-1],
		"empty":     Rendezvous{ID: 1, Region: Region{Addr: 4096}}.AppendTo(nil),
		"wide id":   Rendezvous{ID: 1 << 24, Region: Region{Addr: 4096, Len: 1}}.AppendTo(nil),
		"wraps":     Rendezvous{ID: 1, Region: Region{Addr: ^uint64(0) - 1, Len: 4}}.AppendTo(nil),
	} {
		if _, err := ParseRendezvous(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: error %v, want ErrMalformed", name, err)
		}
	}
}

func FuzzParseRendezvous(f *testing.F) {
	f.Add(Rendezvous{ID: 3, Region: Region{Addr: 4096, Len: 1 << 20, RKey: 9}}.AppendTo(nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRendezvous(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		if r.Region.Len == 0 || r.ID > MaxImmCredits {
			t.Fatalf("accepted %+v", r)
		}
		again, err := ParseRendezvous(r.AppendTo(nil))
		if err != nil || again != r {
			t.Fatalf("re-encoded %+v parsed as %+v, %v", r, again, err)
		}
	})
}

// A trailer is the immediate data's 32 bits at the end of the payload:
// SplitTrailer gives back the payload's length and the header.
func TestTrailer(t *testing.T) {
	msg := append([]byte("payload"), make([]byte, TrailerLen)...)
	PutTrailer(msg[len(msg)-TrailerLen:], EncodeImm(KindMessage, 9))
	if want := []byte{'p', 'a', 'y', 'l', 'o', 'a', 'd', 0x04, 0, 0, 9}; !bytes.Equal(msg, want) {
		t.Fatalf("encoded % x, want % x", msg, want)
	}
	n, imm, err := SplitTrailer(msg)
	if err != nil || n != 7 || imm != EncodeImm(KindMessage, 9) {
		t.Fatalf("SplitTrailer = %d, %#x, %v; want 7, %#x", n, imm, err, EncodeImm(KindMessage, 9))
	}
	if n, imm, err := SplitTrailer(msg[len(msg)-TrailerLen:]); err != nil || n != 0 || imm != EncodeImm(KindMessage, 9) {
		t.Fatalf("a bare trailer: %d, %#x, %v", n, imm, err)
	}
	for _, short := range [][]byte{nil, {1}, {1, 2, 3}} {
		if _, _, err := SplitTrailer(short); !errors.Is(err, ErrMalformed) {
			t.Fatalf("SplitTrailer(% x) error %v, want ErrMalformed", short, err)
		}
	}
}

// ConnTrailers: a side's need decides, and both must speak trailers.
func TestConnTrailers(t *testing.T) {
	if n := len(ErrNoTrailers.Error()); n > MaxRejectReason {
		t.Fatalf("ErrNoTrailers is %d bytes, more than a reject's reason holds (%d)", n, MaxRejectReason)
	}
	const (
		none     = Features(0)
		can      = FeatureControlReserve | FeatureTrailers
		needs    = can | FeatureTrailersRequired
		needsOld = FeatureTrailersRequired // a side that needs them but does not announce them: malformed, refused
	)
	for _, tc := range []struct {
		ours, theirs Features
		want         bool
		err          error
	}{
		{none, none, false, nil},
		{can, can, false, nil},  // both have immediates
		{can, none, false, nil}, // an older peer, no need
		{needs, can, true, nil}, // this side needs them
		{can, needs, true, nil}, // the peer does
		{needs, needs, true, nil},
		{needs, none, false, ErrNoTrailers}, // an older peer cannot serve this side's device
		{none, needs, false, ErrNoTrailers},
		{can, needsOld, false, ErrNoTrailers},
	} {
		got, err := ConnTrailers(tc.ours, tc.theirs)
		if got != tc.want || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Errorf("ConnTrailers(%v, %v) = %v, %v; want %v, %v", tc.ours, tc.theirs, got, err, tc.want, tc.err)
		}
	}
}

func TestNotifyRoundTrip(t *testing.T) {
	n := Notify{Imm: 0xdeadbeef, Len: 1 << 20}
	b := n.AppendTo(nil)
	if want := []byte{0xde, 0xad, 0xbe, 0xef, 0, 0x10, 0, 0}; !bytes.Equal(b, want) {
		t.Fatalf("encoded % x, want % x", b, want)
	}
	got, err := ParseNotify(b)
	if err != nil || got != n {
		t.Fatalf("ParseNotify = %+v, %v; want %+v", got, err, n)
	}
	for _, bad := range [][]byte{nil, b[:7], append(b, 0)} {
		if _, err := ParseNotify(bad); !errors.Is(err, ErrMalformed) {
			t.Fatalf("ParseNotify(% x) error %v, want ErrMalformed", bad, err)
		}
	}
}

// FuzzSplitTrailer and FuzzParseNotify take a peer's bytes: never a
// panic, and what parses encodes back to the same bytes.
func FuzzSplitTrailer(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 2, 3})
	f.Add([]byte{'x', 4, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		n, imm, err := SplitTrailer(b)
		if err != nil {
			if len(b) >= TrailerLen || !errors.Is(err, ErrMalformed) {
				t.Fatalf("SplitTrailer(% x): %v", b, err)
			}
			return
		}
		if n != len(b)-TrailerLen {
			t.Fatalf("payload %d of %d bytes", n, len(b))
		}
		tr := make([]byte, TrailerLen)
		PutTrailer(tr, imm)
		if !bytes.Equal(tr, b[n:]) {
			t.Fatalf("trailer % x read as %#x", b[n:], imm)
		}
	})
}

func FuzzParseNotify(f *testing.F) {
	f.Add(Notify{Imm: 7, Len: 64}.AppendTo(nil))
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := ParseNotify(b)
		if err != nil {
			if len(b) == NotifyLen || !errors.Is(err, ErrMalformed) {
				t.Fatalf("ParseNotify(% x): %v", b, err)
			}
			return
		}
		if !bytes.Equal(n.AppendTo(nil), b) {
			t.Fatalf("% x parsed as %+v, which encodes differently", b, n)
		}
	})
}
