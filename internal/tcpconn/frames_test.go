package tcpconn

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/errs"
	"github.com/verbline/rdma/internal/tcpframe"
)

// The writer's CloseWrite and Close marks travel in outFrame.typ beside
// the wire's frame types: a peer's frame of a mark's type is refused.
func TestFrameMarksRefused(t *testing.T) {
	lim := tcpframe.Limits{MaxMessage: 1000, MaxChunk: 100}
	var b [tcpframe.HeaderLen]byte
	for _, typ := range []byte{frameFIN, frameStop} {
		tcpframe.PutHeader(&b, typ, 0)
		if _, _, err := tcpframe.ParseHeader(&b, lim); !errors.Is(err, errs.ErrProtocol) {
			t.Errorf("type %d length 0: err %v, want ErrProtocol", typ, err)
		}
	}
}

// wantFrames decodes in as the wire format says (the reference for the
// reader): the messages and the stream bytes of the frames before the
// first violation, and whether in ends cleanly at a frame boundary.
func wantFrames(in []byte, lim tcpframe.Limits) (msgs [][]byte, stream []byte, clean bool) {
	var hdr [tcpframe.HeaderLen]byte
	for len(in) > 0 {
		if len(in) < tcpframe.HeaderLen {
			return msgs, stream, false
		}
		copy(hdr[:], in)
		typ, n, err := tcpframe.ParseHeader(&hdr, lim)
		if err != nil || len(in)-tcpframe.HeaderLen < n {
			return msgs, stream, false
		}
		p := in[tcpframe.HeaderLen : tcpframe.HeaderLen+n]
		if typ == tcpframe.TypeMessage {
			msgs = append(msgs, p)
		} else {
			stream = append(stream, p...)
		}
		in = in[tcpframe.HeaderLen+n:]
	}
	return msgs, stream, true
}

// FuzzTCPFrames feeds arbitrary bytes, as a peer's frames after the hello,
// through the reader a TCP-backed connection uses (readLoop, tcpframe.Reader,
// the receive budget and the message hand-over), over a net.Pipe, and
// takes what it delivers with Recv and readStream: no panic; the messages
// and the stream bytes are exactly those of the well-formed frames before
// the first violation; the end is io.EOF after a clean end, else an error
// matching ErrProtocol; what the received frames hold stays within the
// budget plus one frame, and every buffer goes back to the pool.
func FuzzTCPFrames(f *testing.F) {
	addFrameSeeds(f)
	lim := tcpframe.Limits{MaxMessage: 300, MaxChunk: 100}
	pool, err := buffer.NewPool(nil, buffer.Options{MaxBytes: 64 << 20})
	if err != nil {
		f.Fatal(err)
	}
	o := testOptions(pool)
	o.RecvBuffers, o.BufferSize = 4, 64
	largest, err := pool.Get(lim.MaxMessage)
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
		c := makeConn[completion, note](z, &o, lim, newCompletion, tcpframe.Hello{MaxMessage: 300, MaxChunk: 100})
		defer c.cancel()
		go c.readLoop()
		go c.deliverLoop()
		msgs, stream, merr, serr := takeFrames(t, c, maxBuf)
		for _, err := range []error{merr, serr} {
			if clean && err != io.EOF || !clean && !errors.Is(err, errs.ErrProtocol) {
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

// addFrameSeeds adds well-formed frames, cut ones, and headers above the
// limits or of unknown types.
func addFrameSeeds(f *testing.F) {
	var b [tcpframe.HeaderLen]byte
	var seed []byte
	for _, fr := range []struct {
		typ byte
		n   int
	}{{tcpframe.TypeStream, 3}, {tcpframe.TypeMessage, 0}, {tcpframe.TypeMessage, 5}, {tcpframe.TypeMessage, 300}, {tcpframe.TypeStream, 100}, {tcpframe.TypeMessage, 257}} {
		tcpframe.PutHeader(&b, fr.typ, fr.n)
		seed = append(append(seed, b[:]...), bytes.Repeat([]byte{byte(fr.n)}, fr.n)...)
	}
	f.Add(seed)
	f.Add(seed[:7])
	f.Add(seed[:len(seed)-1])
	f.Add([]byte{tcpframe.TypeMessage, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{tcpframe.TypeMessage, 0, 0, 1, 0x2d}) // one byte above the limit
	f.Add([]byte{tcpframe.TypeStream, 0, 0, 0, 0})
	f.Add([]byte{9, 0, 0, 0, 1, 0})
	many := bytes.Repeat(append(frameHeaderOf(tcpframe.TypeMessage, 0), frameHeaderOf(tcpframe.TypeStream, 1)[:]...), 50)
	f.Add(append(many, 0))
}

// takeFrames takes c's messages (Recv) and stream (readStream, at once)
// to their ends, and checks the bounds meanwhile. Counted in c: the budget
// and the frame that crossed it (maxBuf at most). In the pool: that, the
// frame being read (two buffers while it grows), the message being checked
// and the stream chunk being copied.
func takeFrames(t *testing.T, c *Conn[completion, note], maxBuf int64) (msgs [][]byte, stream []byte, merr, serr error) {
	bound := c.recvBudget + maxBuf
	poolBound := bound + 4*maxBuf
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
	for {
		if h := c.held.Load(); h > bound {
			t.Fatalf("received frames hold %d bytes; the bound is %d", h, bound)
		}
		if u := c.pool.Stats().InUseBytes; u > poolBound {
			t.Fatalf("the pool has %d bytes in use; the bound is %d", u, poolBound)
		}
		m, err := c.Recv(context.Background())
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
	return msgs, stream, merr, serr
}

// frameHeaderOf is a frame header announcing n bytes of type typ.
func frameHeaderOf(typ byte, n int) []byte {
	var h [tcpframe.HeaderLen]byte
	tcpframe.PutHeader(&h, typ, n)
	return h[:]
}

// completion and note stand for the root package's OpCompletion and
// Notification.
type completion struct {
	id  uint64
	err error
}

type note struct{}

func newCompletion(id uint64, err error) completion { return completion{id, err} }

// testOptions are the root package's defaults (Config.withDefaults) over pool.
func testOptions(pool *buffer.Pool) Options {
	return Options{RecvBuffers: 64, SendBuffers: 64, BufferSize: 32 << 10, KeepAlive: 15 * time.Second,
		HandshakeTimeout: 5 * time.Second, CloseTimeout: 5 * time.Second, Pool: pool}
}
