//go:build linux && cgo

package rdma

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/cmsetup"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/wire"
)

// Rolling upgrades (docs/protocol.md, "Versions and
// compatibility"): a connection comes up and carries data between this
// version and a peer that announces an older minor version (1.0, which had
// neither the minor version nor the features in its Hello), or a later
// minor version with features this side does not know and fields in the
// Hello's extension area; a peer of another major version is refused, on
// either side, with an error naming both versions.
//
// The peers here are real connections whose half of the handshake is
// replaced: what a peer of another version announces, on this version's
// data path (which is all two peers of one major version use once the
// unknown features have dropped out of the intersection).

// peerHello returns a helloFunc announcing the connection's own Hello
// changed by mod, followed by ext (a later minor's extension fields).
func peerHello(mod func(*wire.Hello), ext []byte) helloFunc {
	return func(c *Conn) []byte {
		h, err := wire.ParseHello(c.hello())
		if err != nil {
			panic(err) // our own Hello
		}
		mod(&h)
		return append(h.AppendTo(nil), ext...)
	}
}

// The peers' announcements. A 1.0 peer wrote zeros where 1.1 has the
// minor version and the features. Where this side needs trailers (a
// device without immediate data, or RDMA_TEST_TRAILERS) no older peer can
// talk to it (TestTrailersRefusedWithoutThem): there older keeps the
// trailer bits, so the tests still check every other feature's fallback.
var (
	older = peerHello(func(h *wire.Hello) {
		keep := h.Features & wire.FeatureTrailersRequired
		if keep != 0 {
			keep |= wire.FeatureTrailers
		}
		h.Minor, h.Features = 0, keep
	}, nil)
	// newer announces every feature bit, a keepalive interval and
	// extension bytes: from a connect request, as many as fit its 56 bytes.
	newer = func(extLen int) helloFunc {
		return peerHello(func(h *wire.Hello) { h.Minor, h.Features, h.KeepaliveMS = 200, ^wire.Features(0), 15000 },
			bytes.Repeat([]byte{0xee}, extLen))
	}
	otherMajor = peerHello(func(h *wire.Hello) { h.Version, h.Minor = wire.Version+1, 5 }, nil)
)

// TestHandshakeCompatDial: dialers of an older and a newer minor version
// connect to this version's Listener and exchange data both ways; one of
// another major version is refused with a reason naming both versions, and
// the listener goes on accepting.
func TestHandshakeCompatDial(t *testing.T) {
	for _, tc := range []struct {
		name  string
		hello helloFunc
	}{
		{"older 1.0", older},
		{"newer minor, unknown features", newer(wire.MaxHelloExtension)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkLeaksAtEnd(t)
			ln := listenTest(t, nil)
			defer ln.Close()
			accepted := acceptAsync(ln)
			c, err := dialTest(ln.Addr().String(), tc.hello)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			s := <-accepted
			if s == nil {
				c.Close()
				t.Fatal("listener accepted nothing")
			}
			exchange(t, c, s)
		})
	}

	t.Run("other major", func(t *testing.T) {
		checkLeaksAtEnd(t)
		ln := listenTest(t, nil)
		defer ln.Close()
		c, err := dialTest(ln.Addr().String(), otherMajor)
		if err == nil {
			c.Close()
			t.Fatal("a dialer of major version 2 was accepted")
		}
		want := fmt.Sprintf("dialer speaks verbline wire protocol 2.5, this listener %d.%d: the major versions must match", wire.Version, wire.Minor)
		if !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "(version)") {
			t.Fatalf("dialer's error %q, want ErrHandshake with %q (version)", err, want)
		}
		t.Log(err)
		// The listening side sees it too: one failed handshake, whose
		// error names the dialer's version.
		var st ListenerStats
		for end := time.Now().Add(rdmatest.Scale(5 * time.Second)); ; time.Sleep(time.Millisecond) {
			if st = ln.Stats(); st.Failed == 1 || time.Now().After(end) {
				break
			}
		}
		if st.Failed != 1 || st.Accepted != 0 || st.LastFailure == nil || !strings.Contains(st.LastFailure.Error(), "2.5") {
			t.Fatalf("listener stats %+v: want one failed handshake naming version 2.5", st)
		}
		// The listener is unharmed: this version's dialer gets in.
		accepted := acceptAsync(ln)
		c, err = dialTest(ln.Addr().String(), (*Conn).hello)
		if err != nil {
			t.Fatalf("dial after the refusal: %v", err)
		}
		s := <-accepted
		if s == nil {
			c.Close()
			t.Fatal("listener accepted nothing")
		}
		exchange(t, c, s)
	})
}

// TestHandshakeCompatListen: rdma.Dial against listeners of an older and a
// newer minor version connects and exchanges data both ways; against one
// of another major version it fails with wire.ErrVersion naming both
// versions, and the listener sees the dialer's version reject (where the CM
// connects the QPs itself, iWARP, the dialer's disconnect).
func TestHandshakeCompatListen(t *testing.T) {
	for _, tc := range []struct {
		name  string
		hello helloFunc
	}{
		{"older 1.0", older},
		// An accept carries up to 196 bytes: the extension fills them.
		{"newer minor, unknown features", newer(196 - wire.HelloLen)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkLeaksAtEnd(t)
			addr, accepted := rawListen(t, tc.hello)
			c, err := Dial("rdma", addr)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			r := <-accepted
			if r.err != nil {
				c.Close()
				t.Fatalf("raw listener: %v", r.err)
			}
			exchange(t, c, r.c)
		})
	}

	t.Run("other major", func(t *testing.T) {
		checkLeaksAtEnd(t)
		addr, accepted := rawListen(t, otherMajor)
		c, err := Dial("rdma", addr)
		if err == nil {
			c.Close()
			t.Fatal("Dial accepted a listener of major version 2")
		}
		if !errors.Is(err, ErrHandshake) || !errors.Is(err, wire.ErrVersion) ||
			!strings.Contains(err.Error(), fmt.Sprintf("peer speaks verbline wire protocol 2.5, this side %d.%d", wire.Version, wire.Minor)) {
			t.Fatalf("dial error %q, want ErrHandshake and wire.ErrVersion naming 2.5 and %d.%d", err, wire.Version, wire.Minor)
		}
		t.Log(err)
		r := <-accepted
		if r.err == nil {
			r.c.Close()
			t.Fatal("the listener's side came up although the dialer refused it")
		}
		if c := testDeviceCaps(t); c.CMConnectsQP {
			// The CM connected the QPs before the dialer read the answer
			// (iWARP): it can only disconnect, which ends the listener's
			// wait for its first message.
			if !errors.Is(r.err, ErrHandshake) || !strings.Contains(r.err.Error(), "the dialer disconnected before sending anything") {
				t.Fatalf("listener's side: %q, want ErrHandshake saying the dialer disconnected", r.err)
			}
			t.Logf("listener's side (the CM connects QPs on %s): %v", rdmatest.Require(t).Device, r.err)
			return
		}
		want := fmt.Sprintf("listener speaks verbline wire protocol 2.5, this dialer %d.%d", wire.Version, wire.Minor)
		if !strings.Contains(r.err.Error(), want) || !strings.Contains(r.err.Error(), "(version)") {
			t.Fatalf("listener's side: %q, want the dialer's reject %q (version)", r.err, want)
		}
	})
}

// TestHandshakeAgreed: the Hello handed to setPeer carries only the
// features both sides support, whatever the peer announced, and the
// trailers mark where either side requires them; a side that requires
// them from a peer that does not speak them is refused.
func TestHandshakeAgreed(t *testing.T) {
	withImm := wire.Supported &^ wire.FeatureTrailersRequired
	for _, tc := range []struct {
		ours, peer, want wire.Features
		err              error
	}{
		{withImm, 0, 0, nil},
		{withImm, 1 << 31, 0, nil},
		{withImm, withImm, withImm, nil},
		{withImm, ^wire.Features(0), wire.Supported, nil}, // the peer requires trailers and speaks them
		{wire.Supported, withImm, wire.Supported, nil},    // this side requires them
		{wire.Supported, wire.FeatureControlReserve, 0, wire.ErrNoTrailers},
		{withImm, wire.FeatureTrailersRequired, 0, wire.ErrNoTrailers},
	} {
		peer := wire.Hello{Version: wire.Version, Minor: 9, Credits: 4, RecvBufSize: 4096, Features: tc.peer}
		got, err := agreed((&wire.Hello{Version: wire.Version, Minor: wire.Minor, Credits: 1, RecvBufSize: 64, Features: tc.ours}).AppendTo(nil), peer)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("ours %v, peer %v: error %v, want %v", tc.ours, tc.peer, err, tc.err)
			}
			continue
		}
		if err != nil || got.Features != tc.want {
			t.Errorf("ours %v, peer %v: agreed %v (%v), want %v", tc.ours, tc.peer, got.Features, err, tc.want)
		}
		if got.Features = peer.Features; got != peer {
			t.Errorf("agreed changed more than the features: %+v from %+v", got, peer)
		}
	}
}

func dialTest(addr string, hello helloFunc) (*Conn, error) {
	cfg := (&Config{}).withDefaults()
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(10*time.Second))
	defer cancel()
	return dialHello(ctx, &cfg, netip.AddrPort{}, netip.MustParseAddrPort(addr), hello)
}

// acceptAsync delivers the listener's next connection (nil if Accept failed).
func acceptAsync(ln *Listener) <-chan *Conn {
	ch := make(chan *Conn, 1)
	go func() {
		c, _ := ln.AcceptRDMA()
		ch <- c
	}()
	return ch
}

type acceptResult struct {
	c   *Conn
	err error
}

// rawListen listens with rdma_cm directly on the test device and answers the
// first connection request with hello (the Listener's own handshake, but for
// what it announces). The listening id is gone when the test ends.
func rawListen(t *testing.T, hello helloFunc) (string, <-chan acceptResult) {
	t.Helper()
	env := rdmatest.Require(t)
	ch, id, err := cmsetup.NewChannelID()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { undo(nil, id, ch) })
	if err := id.BindAddr(netip.AddrPortFrom(netip.MustParseAddr(env.Addr), 0)); err != nil {
		t.Fatal(err)
	}
	if err := id.Listen(4); err != nil {
		t.Fatal(err)
	}
	out := make(chan acceptResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(10*time.Second))
		defer cancel()
		ev, err := cmsetup.Expect(ctx, ch, rdmacm.EventConnectRequest, "waiting for a connection request")
		if err != nil {
			out <- acceptResult{err: err}
			return
		}
		cfg := (&Config{}).withDefaults()
		c, err := acceptHello(ctx, &cfg, ev, hello)
		out <- acceptResult{c, err}
	}()
	return id.LocalAddr().String(), out
}

// exchange checks that a and b carry data both ways: the stream (more than
// the credits' worth, so credits must come back), a message, and a message
// larger than a receive buffer (rendezvous) where the device can lend one;
// then end of stream and close from both sides.
func exchange(t *testing.T, a, b *Conn) {
	t.Helper()
	defer a.Close()
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(60*time.Second))
	defer cancel()
	a.SetDeadline(time.Now().Add(rdmatest.Scale(60 * time.Second)))
	b.SetDeadline(time.Now().Add(rdmatest.Scale(60 * time.Second)))

	for _, dir := range []struct {
		name     string
		from, to *Conn
	}{{"a->b", a, b}, {"b->a", b, a}} {
		data := make([]byte, 3<<20) // 96 chunks of 32 KiB against 64 credits
		rand.New(rand.NewSource(int64(len(dir.name)))).Read(data)
		errc := make(chan error, 1)
		go func() {
			_, err := dir.from.Write(data)
			errc <- err
		}()
		got := make([]byte, len(data))
		if _, err := io.ReadFull(dir.to, got); err != nil {
			t.Logf("writer: %s", dir.from.debugState())
			t.Logf("reader: %s", dir.to.debugState())
			t.Fatalf("%s stream: %v", dir.name, err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("%s stream write: %v", dir.name, err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("%s stream: bytes differ", dir.name)
		}

		sizes := []int{1000}
		if dir.from.MaxMessageSize() > dir.from.cfg.BufferSize {
			sizes = append(sizes, 1<<20) // rendezvous: announce, READ, done
		}
		for i, n := range sizes {
			m, err := dir.from.Alloc(n)
			if err != nil {
				t.Fatal(err)
			}
			fill(m.Bytes(), i)
			if err := dir.from.Send(ctx, m); err != nil {
				t.Fatalf("%s send %d bytes: %v", dir.name, n, err)
			}
			r, err := dir.to.Recv(ctx)
			if err != nil {
				t.Fatalf("%s recv %d bytes: %v", dir.name, n, err)
			}
			checkFill(t, r.Bytes(), i, n)
			r.Release()
		}
		t.Logf("%s: 3 MiB stream and messages of %v bytes", dir.name, sizes)
	}

	// End of stream: a half-closes, b reads EOF and can still write.
	if err := a.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after the peer's CloseWrite: %d, %v; want EOF", n, err)
	}
	if _, err := b.Write([]byte("still open")); err != nil {
		t.Fatalf("write after the peer's CloseWrite: %v", err)
	}
	buf := make([]byte, len("still open"))
	if _, err := io.ReadFull(a, buf); err != nil || string(buf) != "still open" {
		t.Fatalf("read after CloseWrite: %q, %v", buf, err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Read(buf); err != io.EOF && !errors.Is(err, net.ErrClosed) {
		t.Fatalf("after the peer's Close: %v, want EOF", err)
	}
}
