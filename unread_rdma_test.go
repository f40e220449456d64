//go:build linux && cgo

package rdma

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
)

// growWindow streams small messages from c to s, read as they arrive, until
// s's receive window reaches want (the window grows only while the reader
// keeps up), so that the peer has the credits to announce many large
// messages at once.
func growWindow(t *testing.T, c, s *Conn, want int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(30*time.Second))
	defer cancel()
	for sent := 0; ; sent += 64 {
		s.mu.Lock()
		w := s.win.size
		s.mu.Unlock()
		if w >= want {
			return
		}
		if sent >= 20000 {
			t.Fatalf("receive window %d after %d messages, want %d", w, sent, want)
		}
		errc := make(chan error, 1)
		go func() {
			for range 64 {
				b, err := c.Alloc(64)
				if err == nil {
					err = c.Send(ctx, b)
				}
				if err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		for range 64 {
			m, err := s.Recv(ctx)
			if err != nil {
				t.Fatal(err)
			}
			m.Release()
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

// sendSame sends count messages from c that are all the same buffer of
// size bytes (retained once per Send), as a peer amplifying what it makes
// the receiver hold would: each message costs it no memory of its own.
func sendSame(ctx context.Context, c *Conn, size, count int) (want []byte, done <-chan error) {
	b, err := c.Alloc(size)
	errc := make(chan error, 1)
	if err != nil {
		errc <- err
		return nil, errc
	}
	want = make([]byte, size)
	for i := range want {
		want[i] = byte(i*13 + 5)
	}
	copy(b.Bytes(), want)
	go func() {
		defer b.Release()
		for range count {
			if err := b.Retain(); err != nil {
				errc <- err
				return
			}
			if err := c.Send(ctx, b); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	return want, errc
}

// settledHeld waits until what s holds in large messages stops changing for
// a while, and returns it.
func settledHeld(s *Conn) int64 {
	var last int64 = -1
	for stable := 0; stable < 20; time.Sleep(rdmatest.Scale(10 * time.Millisecond)) {
		s.mu.Lock()
		h := s.rdv.held
		s.mu.Unlock()
		if h == last {
			stable++
		} else {
			stable, last = 0, h
		}
	}
	return last
}

// readSame receives count messages on s and checks each is want.
func readSame(t *testing.T, ctx context.Context, s *Conn, want []byte, count int) {
	t.Helper()
	for i := range count {
		m, err := s.Recv(ctx)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if !bytes.Equal(m.Bytes(), want) {
			t.Fatalf("message %d arrived changed", i)
		}
		m.Release()
	}
}

// TestUnreadConnectionBound: a peer with credits for many large messages,
// all announcing the same buffer of its own, makes a receiver that reads
// nothing hold at most MaxUnreadBytes of them; the rest wait (the sender's
// Sends stall, no error), and once the application reads, every message
// arrives intact and in order.
func TestUnreadConnectionBound(t *testing.T) {
	const bound, size, count = 2 << 20, 512 << 10, 16
	cfg := &Config{MaxUnreadBytes: bound}
	c, s, ln := connPair(t, cfg)
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	growWindow(t, c, s, count+2)
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(30*time.Second))
	defer cancel()
	want, done := sendSame(ctx, c, size, count)
	held := settledHeld(s)
	s.mu.Lock()
	waiting := s.rdv.stalled
	s.mu.Unlock()
	t.Logf("%d messages of %d KiB announced from one buffer: the reader holds %d KiB (bound %d KiB), %d wait",
		count, size>>10, held>>10, bound>>10, waiting)
	if held > bound {
		t.Fatalf("the reader holds %d bytes of unread large messages, bound %d", held, bound)
	}
	if waiting == 0 {
		t.Fatal("no announcement waits: the peer's messages were not past the bound")
	}
	readSame(t, ctx, s, want, count)
	if err := <-done; err != nil {
		t.Fatalf("sender: %v", err)
	}
}

// TestUnreadDeviceBound: several connections on one device, each peer
// announcing large messages that the application does not read, hold
// together at most half the device's pool (PoolMaxBytes / 2), whatever
// each connection's MaxUnreadBytes allows, plus at most one message each
// (a connection holding none always gets one, so that every connection
// makes progress); another connection can still allocate, send and
// receive, a large message too; and an application that then reads the
// connections one after another gets every message, although each
// connection's next message finds the budget taken by the ones it reads
// later.
func TestUnreadDeviceBound(t *testing.T) {
	waitNoDevice(t)
	const poolMax, size, count, conns = 48 << 20, 1 << 20, 12, 4
	// MaxUnreadBytes: 16 MiB each, 48 MiB in all. Both ends of every
	// connection are in this process, on one pool: the senders' buffers
	// and ten connections' rings share the half the readers leave. Small
	// receive buffers keep the rings (grown to 14 credits each) to one
	// arena, so that the other half's room is what the test shows.
	cfg := &Config{PoolMaxBytes: poolMax, BufferSize: 4096}
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(60*time.Second))
	defer cancel()
	type pair struct {
		c, s *Conn
		want []byte
		done <-chan error
	}
	var pairs []pair
	defer func() {
		for _, p := range pairs {
			p.c.Close()
			p.s.Close()
		}
	}()
	for i := range conns {
		var c, s *Conn
		var ln *Listener
		if i == 0 {
			c, s, ln = connPair(t, cfg)
		} else {
			c, s, ln = dialPair(t, cfg)
		}
		defer ln.Close()
		pairs = append(pairs, pair{c: c, s: s})
		growWindow(t, c, s, count+2)
	}
	dev := pairs[0].s.dev
	if dev.Unread.Max() != poolMax/2 {
		t.Fatalf("the device's unread bound is %d, want half its PoolMaxBytes (%d)", dev.Unread.Max(), poolMax/2)
	}
	for i := range pairs {
		pairs[i].want, pairs[i].done = sendSame(ctx, pairs[i].c, size, count)
	}
	var total int64
	for _, p := range pairs {
		total += settledHeld(p.s)
	}
	t.Logf("%d connections, each announced %d x %d KiB: the readers hold %d MiB together (device bound %d MiB)",
		conns, count, size>>10, total>>20, dev.Unread.Max()>>20)
	bound := dev.Unread.Max() + conns*size
	if got := dev.Unread.InUse(); total > bound || got > bound {
		t.Fatalf("the readers hold %d bytes (device charge %d), bound %d + one %d-byte message per connection",
			total, got, dev.Unread.Max(), size)
	}
	if total < dev.Unread.Max() {
		t.Fatalf("the readers hold %d bytes: the announcements did not reach the device bound %d", total, dev.Unread.Max())
	}
	// The rest of the pool serves another connection, and the budget's
	// exception lets it receive a large message.
	c5, s5, ln5 := dialPair(t, cfg)
	defer ln5.Close()
	defer c5.Close()
	defer s5.Close()
	if s5.dev != dev {
		t.Fatal("the fifth connection is on another device")
	}
	big, err := c5.Alloc(4 << 20)
	if err != nil {
		t.Fatalf("another connection's Alloc while the readers hold their bound: %v", err)
	}
	big.Release()
	echoOnce(t, c5, s5)
	echoOnce(t, s5, c5)
	want5, done5 := sendSame(ctx, c5, size, 1)
	readSame(t, ctx, s5, want5, 1)
	if err := <-done5; err != nil {
		t.Fatalf("fifth connection's sender: %v", err)
	}
	// Read one connection after another.
	for _, p := range pairs {
		readSame(t, ctx, p.s, p.want, count)
		if err := <-p.done; err != nil {
			t.Fatalf("sender: %v", err)
		}
	}
}
