package rdma

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/verbline/rdma/buffer"
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

// wantFrames decodes in as the wire format says (the reference for the
// reader): the messages and the stream bytes of the frames before the
// first violation, and whether in ends cleanly at a frame boundary.
func wantFrames(in []byte, lim frameLimits) (msgs [][]byte, stream []byte, clean bool) {
	var hdr [frameHeaderLen]byte
	for len(in) > 0 {
		if len(in) < frameHeaderLen {
			return msgs, stream, false
		}
		copy(hdr[:], in)
		typ, n, err := parseFrameHeader(&hdr, lim)
		if err != nil || len(in)-frameHeaderLen < n {
			return msgs, stream, false
		}
		p := in[frameHeaderLen : frameHeaderLen+n]
		if typ == frameMessage {
			msgs = append(msgs, p)
		} else {
			stream = append(stream, p...)
		}
		in = in[frameHeaderLen+n:]
	}
	return msgs, stream, true
}

// FuzzTCPFrames feeds arbitrary bytes, as a peer's frames after the hello,
// through the reader a TCP-backed connection uses (readLoop, frameReader,
// the receive budget and the message hand-over), over a net.Pipe, and
// takes what it delivers with recv and readStream: no panic; the messages
// and the stream bytes are exactly those of the well-formed frames before
// the first violation; the end is io.EOF after a clean end, else an error
// matching ErrProtocol; what the received frames hold stays within the
// budget plus one frame, and every buffer goes back to the pool.
func FuzzTCPFrames(f *testing.F) {
	var b [frameHeaderLen]byte
	var seed []byte
	for _, fr := range []struct {
		typ byte
		n   int
	}{{frameStream, 3}, {frameMessage, 0}, {frameMessage, 5}, {frameMessage, 300}, {frameStream, 100}, {frameMessage, 257}} {
		putFrameHeader(&b, fr.typ, fr.n)
		seed = append(append(seed, b[:]...), bytes.Repeat([]byte{byte(fr.n)}, fr.n)...)
	}
	f.Add(seed)
	f.Add(seed[:7])
	f.Add(seed[:len(seed)-1])
	f.Add([]byte{frameMessage, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{frameMessage, 0, 0, 1, 0x2d}) // one byte above the limit
	f.Add([]byte{frameStream, 0, 0, 0, 0})
	f.Add([]byte{9, 0, 0, 0, 1, 0})
	many := bytes.Repeat(append(frameHeaderOf(frameMessage, 0), frameHeaderOf(frameStream, 1)[:]...), 50)
	f.Add(append(many, 0))
	lim := frameLimits{maxMessage: 300, maxChunk: 100}
	cfg := (&Config{RecvBuffers: 4, BufferSize: 64, HandshakeTimeout: 5 * time.Second}).withDefaults()
	pool, err := buffer.NewPool(nil, buffer.Options{MaxBytes: 64 << 20})
	if err != nil {
		f.Fatal(err)
	}
	largest, err := pool.Get(lim.maxMessage)
	if err != nil {
		f.Fatal(err)
	}
	maxBuf := int64(largest.Cap()) // the buffer of the largest frame
	largest.Release()
	f.Fuzz(func(t *testing.T, in []byte) {
		wantMsgs, wantStream, clean := wantFrames(in, lim)
		a, z := net.Pipe()
		defer a.Close()
		go func() {
			a.Write(in)
			a.Close()
		}()
		c := makeTCPConn(z, &cfg, pool, lim, tcpHello{MaxMessage: 300, MaxChunk: 100})
		// Counted: the budget and the frame that crossed it. In the pool:
		// that, the frame being read (two buffers while it grows), the
		// message being checked and the stream chunk being copied.
		defer c.cancel()
		bound := c.recvBudget + maxBuf
		poolBound := bound + 4*maxBuf
		go c.readLoop()
		go c.deliverLoop()
		var stream []byte
		var serr error
		sdone := make(chan struct{})
		go func() {
			defer close(sdone)
			buf := make([]byte, 7)
			for {
				n, err := c.readStream(buf)
				stream = append(stream, buf[:n]...)
				if err != nil {
					serr = err
					return
				}
			}
		}()
		var msgs [][]byte
		var merr error
		for {
			if h := c.held.Load(); h > bound {
				t.Fatalf("received frames hold %d bytes; the bound is %d", h, bound)
			}
			if u := pool.Stats().InUseBytes; u > poolBound {
				t.Fatalf("the pool has %d bytes in use; the bound is %d", u, poolBound)
			}
			m, err := c.recv(context.Background())
			if err != nil {
				merr = err
				break
			}
			msgs = append(msgs, append([]byte(nil), m.Bytes()...))
			m.Release()
		}
		<-sdone
		<-c.drained
		<-c.delivered
		for _, err := range []error{merr, serr} {
			if clean && err != io.EOF || !clean && !errors.Is(err, ErrProtocol) {
				t.Fatalf("the reader ended with %v; want io.EOF after a clean end (%v), else ErrProtocol", err, clean)
			}
		}
		if len(msgs) != len(wantMsgs) {
			t.Fatalf("%d messages; want %d", len(msgs), len(wantMsgs))
		}
		for i := range msgs {
			if !bytes.Equal(msgs[i], wantMsgs[i]) {
				t.Fatalf("message %d: %x; want %x", i, msgs[i], wantMsgs[i])
			}
		}
		if !bytes.Equal(stream, wantStream) {
			t.Fatalf("stream %x; want %x", stream, wantStream)
		}
		if h, u := c.held.Load(), pool.Stats().InUseBytes; h != 0 || u != 0 {
			t.Fatalf("after the end: %d bytes counted held, %d bytes of the pool in use", h, u)
		}
	})
}

// frameHeaderOf is a frame header announcing n bytes of type typ.
func frameHeaderOf(typ byte, n int) []byte {
	var h [frameHeaderLen]byte
	putFrameHeader(&h, typ, n)
	return h[:]
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
