//go:build linux && cgo

package rdma

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// Trailers (trailer.go) are what a device without immediate data (iWARP)
// uses; these tests force them on the test device, whatever it has, so the
// path runs everywhere. On a device without immediate data every test of
// the suite runs over them anyway.

// trailerPair is a connected pair whose sides both required trailers.
func trailerPair(t *testing.T, cfg *Config) (client, server *Conn, ln *Listener) {
	t.Helper()
	defer forceTrailers.Store(forceTrailers.Swap(true))
	c, s, ln := connPair(t, cfg)
	for _, side := range []*Conn{c, s} {
		side.mu.Lock()
		on, room := side.trailers, side.peerBufSize
		side.mu.Unlock()
		if !on {
			t.Fatal("the connection does not use trailers")
		}
		if want := side.ep.bufSize - wire.TrailerLen; room != want { // both sides' buffers are alike here
			t.Fatalf("payload room %d, want the buffer less the trailer, %d", room, want)
		}
	}
	return c, s, ln
}

// TestTrailersStream: the stream carries bytes both ways over trailers,
// in chunks of the peer's buffer less the trailer, with credit updates and
// end of stream as trailer-only messages.
func TestTrailersStream(t *testing.T) {
	cfg := &Config{BufferSize: 4096}
	c, s, ln := trailerPair(t, cfg)
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	go func() {
		io.Copy(s, s)
		s.CloseWrite()
	}()
	data := make([]byte, 3<<20+17) // many chunks, the last one short
	rand.Read(data)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.CloseWrite()
		}
		errc <- err
	}()
	c.SetReadDeadline(time.Now().Add(rdmatest.Scale(60 * time.Second)))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("echoed %d bytes differ from the %d sent", len(got), len(data))
	}
	// Every chunk was at most the peer's buffer less the trailer.
	if st := c.Stats(); st.SendWRs < uint64(len(data)/(cfg.BufferSize-wire.TrailerLen)) {
		t.Fatalf("%d sends for %d bytes in %d-byte chunks", st.SendWRs, len(data), cfg.BufferSize-wire.TrailerLen)
	}
}

// TestTrailersMessages: messages keep their bytes and boundaries over
// trailers at the sizes where the trailer changes what happens: empty,
// inline and just past it, the largest that fits a receive (the buffer
// less the trailer) and one byte more, and a large one (both by
// rendezvous: through a memory window, or on a device without windows a
// registration of exactly the message).
func TestTrailersMessages(t *testing.T) {
	cfg := &Config{BufferSize: 4096}
	c, s, ln := trailerPair(t, cfg)
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(30*time.Second))
	defer cancel()
	room := cfg.BufferSize - wire.TrailerLen
	sizes := []int{0, 1, c.inlineMax, c.inlineMax + 1, room - 1, room, room + 1, 256 << 10}
	for _, n := range sizes {
		b, err := c.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		rand.Read(b.Bytes())
		want := bytes.Clone(b.Bytes())
		if err = c.Send(ctx, b); err != nil {
			t.Fatalf("send %d bytes: %v", n, err)
		}
		m, err := s.Recv(ctx)
		if err != nil {
			t.Fatalf("recv %d bytes: %v", n, err)
		}
		if !bytes.Equal(m.Bytes(), want) {
			t.Fatalf("message of %d bytes arrived as %d bytes, or changed", n, m.Len())
		}
		m.Release()
	}
	if got := c.MaxMessageSize(); got <= room {
		t.Fatalf("MaxMessageSize %d: large messages are not enabled (a receive holds %d)", got, room)
	}
}

// TestTrailersWriteRemoteImm: a write with immediate becomes a write and a
// notify; the exporter's Notification carries the value and the length,
// and the written bytes are there when it arrives (blocking and posted).
func TestTrailersWriteRemoteImm(t *testing.T) {
	c, s, ln := trailerPair(t, nil)
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(30*time.Second))
	defer cancel()
	target, err := s.Alloc(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Release()
	exp, err := s.Export(target, RemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Close()
	local, err := c.Alloc(48 << 10)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Release()
	for round, async := range []bool{false, true, false} {
		rand.Read(local.Bytes())
		imm, off := uint32(0xabc000+round), uint64(round*1024)
		if async {
			err = c.PostWriteRemoteImm(ctx, local, exp.Remote(), off, imm, 7)
			if err == nil {
				var done OpCompletion
				if done, err = c.RecvCompletion(ctx); err == nil && (done.ID != 7 || done.Err != nil) {
					t.Fatalf("completion %+v", done)
				}
			}
		} else {
			err = c.WriteRemoteImm(ctx, local, exp.Remote(), off, imm)
		}
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		note, err := s.RecvNotification(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if note.Imm != imm || note.Len != local.Len() {
			t.Fatalf("round %d: notification imm %#x len %d, want %#x %d", round, note.Imm, note.Len, imm, local.Len())
		}
		if !bytes.Equal(target.Bytes()[off:off+uint64(local.Len())], local.Bytes()) {
			t.Fatalf("round %d: the written bytes are not there when the notification arrives", round)
		}
		note.Release()
	}
}

// TestTrailersMalformed: on a connection with trailers, a send too short
// for its trailer ends the connection with ErrProtocol; other connections
// go on. (A notify on a connection without trailers cannot be sent on a
// device without immediate data: TestClassifyNotify checks its refusal.)
func TestTrailersMalformed(t *testing.T) {
	c, s, ln := trailerPair(t, nil)
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	c2, s2, ln2 := trailerPair(t, nil)
	defer ln2.Close()
	defer c2.Close()
	defer s2.Close()
	// Two bytes, no trailer: posted below the library's send path, as
	// a hostile peer would.
	c.mu.Lock()
	sb := c.ep.send[0]
	wr := verbs.SendWR{Addr: sb.Addr(), Len: 2, LKey: sb.LKey(), Opcode: verbs.OpSend}
	c.sqPushLocked(&wr, wrSendCtl, 0, true) // a plain SEND: no trailer added
	c.sendq.ctlWR[0] = wr
	err := c.ep.qp.PostSend(c.sendq.ctlWR[:])
	c.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	expectProtocolError(t, s, c, c2, s2, "no room for its 4-byte trailer")
}

// TestTrailersRefusedWithoutThem: a side that needs trailers and a peer
// that does not announce them (a release older than protocol 1.4) cannot
// talk: the dial fails naming the reason, whichever side needs them. (The
// peer here is this version announcing what an older one would, so it
// refuses too, in its own half of the handshake: the listener's reject
// reaches the dialer first in both cases. TestHandshakeAgreed covers the
// decision on each side.)
func TestTrailersRefusedWithoutThem(t *testing.T) {
	noTrailers := peerHello(func(h *wire.Hello) {
		h.Minor, h.Features = 3, h.Features&^(wire.FeatureTrailers|wire.FeatureTrailersRequired)
	}, nil)
	defer forceTrailers.Store(forceTrailers.Swap(true))
	t.Run("older dialer", func(t *testing.T) {
		ln := listenTest(t, nil)
		defer ln.Close()
		acc := acceptAsync(ln)
		_, err := dialTest(ln.Addr().String(), noTrailers)
		if !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), wire.ErrNoTrailers.Error()+" (incompatible)") {
			t.Fatalf("dial: %v, want ErrHandshake with the listener's incompatible reject", err)
		}
		t.Logf("dialer: %v", err)
		ln.Close()
		if c := <-acc; c != nil {
			c.Close()
			t.Fatal("the listener accepted a dialer without trailers")
		}
	})
	t.Run("older listener", func(t *testing.T) {
		addr, acc := rawListen(t, noTrailers)
		_, err := dialTest(addr, (*Conn).hello)
		if !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), wire.ErrNoTrailers.Error()) {
			t.Fatalf("dial: %v, want ErrHandshake naming the missing trailers", err)
		}
		t.Logf("dialer: %v", err)
		if r := <-acc; r.err == nil {
			r.c.Close()
			t.Fatal("the listener's side came up")
		}
	})
}
