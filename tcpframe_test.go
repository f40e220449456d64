package rdma

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestTCPHelloRoundTrip(t *testing.T) {
	for _, h := range []tcpHello{
		{Major: tcpMajor, Minor: tcpMinor, MaxMessage: 4 << 20, MaxChunk: 32 << 10},
		{Major: tcpMajor, Minor: 9, MaxMessage: 1, MaxChunk: 1},
		{Major: tcpMajor, Reject: true, Reason: "not on the list"},
		{Major: tcpMajor, Reject: true, Reason: ""},
	} {
		b := h.appendTo(nil)
		got, err := readTCPHello(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%+v: %v", h, err)
		}
		if got != h {
			t.Errorf("round trip: got %+v, want %+v", got, h)
		}
	}
	long := tcpHello{Major: tcpMajor, Reject: true, Reason: strings.Repeat("x", 2*maxRejectReason)}
	got, err := readTCPHello(bytes.NewReader(long.appendTo(nil)))
	if err != nil || len(got.Reason) != maxRejectReason {
		t.Errorf("a long reason is cut to %d bytes: got %d, %v", maxRejectReason, len(got.Reason), err)
	}
}

func TestTCPHelloRefused(t *testing.T) {
	good := (&tcpHello{Major: tcpMajor, MaxMessage: 100, MaxChunk: 100}).appendTo(nil)
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
		{"http", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), errNotFallbackPeer},
		{"major", mutate(func(b []byte) { b[4] = 2 }), ErrHandshake},
		{"kind", mutate(func(b []byte) { b[6] = 7 }), ErrHandshake},
		{"zero limit", mutate(func(b []byte) { binary.BigEndian.PutUint32(b[8:], 0) }), ErrHandshake},
		{"short", good[:10], ErrHandshake},
		{"empty", nil, ErrHandshake},
		{"reject without reason", mutate(func(b []byte) { b[6] = tcpKindReject }), ErrHandshake},
		{"reject reason too long", append(mutate(func(b []byte) { b[6] = tcpKindReject }), 0xff, 0xff), ErrHandshake},
	} {
		_, err := readTCPHello(bytes.NewReader(c.in))
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

func TestFrameHeaderLimits(t *testing.T) {
	lim := frameLimits{maxMessage: 1000, maxChunk: 100}
	var b [frameHeaderLen]byte
	for _, c := range []struct {
		typ byte
		n   int
		ok  bool
	}{
		{frameStream, 1, true}, {frameStream, 100, true}, {frameStream, 0, false}, {frameStream, 101, false},
		{frameMessage, 0, true}, {frameMessage, 1000, true}, {frameMessage, 1001, false},
		{frameMessage, 1 << 31, false}, {3, 1, false}, {0, 0, false}, {frameFIN, 0, false}, {frameStop, 0, false},
	} {
		putFrameHeader(&b, c.typ, c.n)
		typ, n, err := parseFrameHeader(&b, lim)
		if c.ok != (err == nil) {
			t.Errorf("type %d length %d: err %v, want ok=%v", c.typ, c.n, err, c.ok)
		}
		if err == nil && (typ != c.typ || n != c.n) {
			t.Errorf("type %d length %d: decoded %d %d", c.typ, c.n, typ, n)
		}
		if err != nil && !errors.Is(err, ErrProtocol) {
			t.Errorf("type %d length %d: %v is not ErrProtocol", c.typ, c.n, err)
		}
	}
	// The end of the stream: io.EOF between frames, a protocol error inside one.
	if _, _, err := readFrameHeader(bytes.NewReader(nil), &b, lim); err != io.EOF {
		t.Errorf("empty: %v, want io.EOF", err)
	}
	if _, _, err := readFrameHeader(bytes.NewReader([]byte{frameStream, 0}), &b, lim); !errors.Is(err, ErrProtocol) {
		t.Errorf("half a header: %v, want ErrProtocol", err)
	}
	if err := readFramePayload(bytes.NewReader([]byte{1, 2}), make([]byte, 3)); !errors.Is(err, ErrProtocol) {
		t.Errorf("short payload: %v, want ErrProtocol", err)
	}
}

// decodeFrames runs the reader's decoding (readLoop's, without the
// connection) over in: every frame it accepts is within lim.
func decodeFrames(t testing.TB, in []byte, lim frameLimits) (frames int, err error) {
	r := bytes.NewReader(in)
	var hdr [frameHeaderLen]byte
	for {
		typ, n, err := readFrameHeader(r, &hdr, lim)
		if err != nil {
			return frames, err
		}
		if typ == frameStream && (n < 1 || n > lim.maxChunk) || typ == frameMessage && n > lim.maxMessage ||
			typ != frameStream && typ != frameMessage {
			t.Fatalf("accepted frame type %d of %d bytes beyond %+v", typ, n, lim)
		}
		if n > r.Len() { // what readLoop would allocate is bounded by lim, not by the input
			if err := readFramePayload(r, make([]byte, n)); !errors.Is(err, ErrProtocol) {
				t.Fatalf("a frame cut short: %v, want ErrProtocol", err)
			}
			return frames, ErrProtocol
		}
		if err := readFramePayload(r, make([]byte, n)); err != nil {
			return frames, err
		}
		frames++
	}
}

func FuzzTCPFrames(f *testing.F) {
	var b [frameHeaderLen]byte
	var seed []byte
	for _, fr := range []struct {
		typ byte
		n   int
	}{{frameStream, 3}, {frameMessage, 0}, {frameMessage, 5}} {
		putFrameHeader(&b, fr.typ, fr.n)
		seed = append(append(seed, b[:]...), make([]byte, fr.n)...)
	}
	f.Add(seed)
	f.Add(seed[:7])
	f.Add([]byte{frameMessage, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{9, 0, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		_, err := decodeFrames(t, in, frameLimits{maxMessage: 64, maxChunk: 16})
		if err != io.EOF && !errors.Is(err, ErrProtocol) {
			t.Fatalf("decoding ended with %v: want io.EOF or ErrProtocol", err)
		}
	})
}

func FuzzTCPHello(f *testing.F) {
	f.Add((&tcpHello{Major: tcpMajor, MaxMessage: 100, MaxChunk: 10}).appendTo(nil))
	f.Add((&tcpHello{Major: tcpMajor, Reject: true, Reason: "no"}).appendTo(nil))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		h, err := readTCPHello(bytes.NewReader(in))
		if err != nil {
			if !errors.Is(err, ErrHandshake) {
				t.Fatalf("%v is not ErrHandshake", err)
			}
			return
		}
		if len(h.Reason) > maxRejectReason || !h.Reject && (h.Major != tcpMajor || h.MaxMessage == 0 || h.MaxChunk == 0) {
			t.Fatalf("accepted %+v", h)
		}
		// What was accepted encodes back to the bytes read (but the
		// reserved byte, which is ignored).
		got := h.appendTo(nil)
		read := append([]byte(nil), in[:len(got)]...)
		read[7] = 0
		if !h.Reject && !bytes.Equal(got, read) {
			t.Fatalf("re-encoded %x, read %x", got, read)
		}
	})
}
