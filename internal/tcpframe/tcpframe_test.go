package tcpframe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/verbline/rdma/internal/errs"
)

func TestTCPHelloRoundTrip(t *testing.T) {
	for _, h := range []Hello{
		{Major: Major, Minor: Minor, MaxMessage: 4 << 20, MaxChunk: 32 << 10},
		{Major: Major, Minor: 9, MaxMessage: 1, MaxChunk: 1},
		{Major: Major, Reject: true, Reason: "not on the list"},
		{Major: Major, Reject: true, Reason: ""},
	} {
		b := h.AppendTo(nil)
		got, err := ReadHello(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%+v: %v", h, err)
		}
		if got != h {
			t.Errorf("round trip: got %+v, want %+v", got, h)
		}
	}
	long := Hello{Major: Major, Reject: true, Reason: strings.Repeat("x", 2*maxRejectReason)}
	got, err := ReadHello(bytes.NewReader(long.AppendTo(nil)))
	if err != nil || len(got.Reason) != maxRejectReason {
		t.Errorf("a long reason is cut to %d bytes: got %d, %v", maxRejectReason, len(got.Reason), err)
	}
}

func TestTCPHelloRefused(t *testing.T) {
	good := (&Hello{Major: Major, MaxMessage: 100, MaxChunk: 100}).AppendTo(nil)
	mutate := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	for _, c := range []struct {
		name string
		in   []byte
		want error
	}{
		{"http", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), ErrNotFallbackPeer},
		{"major", mutate(func(b []byte) { b[4] = 2 }), errs.ErrHandshake},
		{"kind", mutate(func(b []byte) { b[6] = 7 }), errs.ErrHandshake},
		{"zero limit", mutate(func(b []byte) { binary.BigEndian.PutUint32(b[8:], 0) }), errs.ErrHandshake},
		{"short", good[:10], errs.ErrHandshake},
		{"empty", nil, errs.ErrHandshake},
		{"reject without reason", mutate(func(b []byte) { b[6] = kindReject }), errs.ErrHandshake},
		{"reject reason too long", append(mutate(func(b []byte) { b[6] = kindReject }), 0xff, 0xff), errs.ErrHandshake},
	} {
		_, err := ReadHello(bytes.NewReader(c.in))
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

// hostileReason carries control characters, a terminal escape sequence, a
// bidi override and invalid UTF-8.
const hostileReason = "go away\r\n\x1b[2J\x1b]0;owned\x07\x00 \u202egnp.exe \xff end"

// hostileReasonClean is hostileReason as the dialer may show it.
const hostileReasonClean = "go away???[2J?]0;owned?? ?gnp.exe ? end"

// A reject's reason is read sanitized, as the RDMA path's is
// (wire.Sanitize): no control character, terminal escape or bidi override
// of the peer's choosing reaches a log or a terminal.
func TestTCPHelloRejectSanitized(t *testing.T) {
	b := binary.BigEndian.AppendUint32(nil, magic)
	b = append(b, Major, Minor, kindReject, 0)
	b = append(b, make([]byte, 8)...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(hostileReason)))
	b = append(b, hostileReason...)
	h, err := ReadHello(bytes.NewReader(b))
	if err != nil || !h.Reject {
		t.Fatalf("reject: %+v, %v", h, err)
	}
	if h.Reason != hostileReasonClean {
		t.Errorf("reason %q, want %q", h.Reason, hostileReasonClean)
	}
}

// A reason longer than maxRejectReason is cut on a character's start, so
// the dialer sees no '?' for half a character.
func TestTCPHelloRejectCutOnRune(t *testing.T) {
	long := strings.Repeat("é", maxRejectReason) // 2 bytes each; maxRejectReason is even, so start at 1
	h := Hello{Major: Major, Reject: true, Reason: "x" + long}
	got, err := ReadHello(bytes.NewReader(h.AppendTo(nil)))
	if err != nil || len(got.Reason) > maxRejectReason || len(got.Reason) < maxRejectReason-1 ||
		strings.Contains(got.Reason, "?") || !utf8.ValidString(got.Reason) {
		t.Fatalf("cut reason: %d bytes %q..., %v", len(got.Reason), got.Reason[max(0, len(got.Reason)-8):], err)
	}
}

func TestFrameHeaderLimits(t *testing.T) {
	lim := Limits{MaxMessage: 1000, MaxChunk: 100}
	var b [HeaderLen]byte
	for _, c := range []struct {
		typ byte
		n   int
		ok  bool
	}{
		{TypeStream, 1, true}, {TypeStream, 100, true}, {TypeStream, 0, false}, {TypeStream, 101, false},
		{TypeMessage, 0, true}, {TypeMessage, 1000, true}, {TypeMessage, 1001, false},
		{TypeMessage, 1 << 31, false}, {3, 1, false}, {0, 0, false},
	} {
		PutHeader(&b, c.typ, c.n)
		typ, n, err := ParseHeader(&b, lim)
		if c.ok != (err == nil) {
			t.Errorf("type %d length %d: err %v, want ok=%v", c.typ, c.n, err, c.ok)
		}
		if err == nil && (typ != c.typ || n != c.n) {
			t.Errorf("type %d length %d: decoded %d %d", c.typ, c.n, typ, n)
		}
		if err != nil && !errors.Is(err, errs.ErrProtocol) {
			t.Errorf("type %d length %d: %v is not ErrProtocol", c.typ, c.n, err)
		}
	}
	// The end of the stream: io.EOF between frames, a protocol error inside one.
	if _, _, err := readHeader(bytes.NewReader(nil), &b, lim); err != io.EOF {
		t.Errorf("empty: %v, want io.EOF", err)
	}
	if _, _, err := readHeader(bytes.NewReader([]byte{TypeStream, 0}), &b, lim); !errors.Is(err, errs.ErrProtocol) {
		t.Errorf("half a header: %v, want ErrProtocol", err)
	}
	if err := readPayload(bytes.NewReader([]byte{1, 2}), make([]byte, 3)); !errors.Is(err, errs.ErrProtocol) {
		t.Errorf("short payload: %v, want ErrProtocol", err)
	}
}

func FuzzTCPHello(f *testing.F) {
	f.Add((&Hello{Major: Major, MaxMessage: 100, MaxChunk: 10}).AppendTo(nil))
	f.Add((&Hello{Major: Major, Reject: true, Reason: "no"}).AppendTo(nil))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		h, err := ReadHello(bytes.NewReader(in))
		if err != nil {
			if !errors.Is(err, errs.ErrHandshake) {
				t.Fatalf("%v is not ErrHandshake", err)
			}
			return
		}
		if len(h.Reason) > maxRejectReason || !h.Reject && (h.Major != Major || h.MaxMessage == 0 || h.MaxChunk == 0) {
			t.Fatalf("accepted %+v", h)
		}
		// What was accepted encodes back to the bytes read (but the
		// reserved byte, which is ignored).
		got := h.AppendTo(nil)
		read := append([]byte(nil), in[:len(got)]...)
		read[7] = 0
		if !h.Reject && !bytes.Equal(got, read) {
			t.Fatalf("re-encoded %x, read %x", got, read)
		}
	})
}
