//go:build linux && cgo

package rdma

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/wire"
)

// heldAnnouncements makes every incoming large message wait unread, its
// window bound, and returns the channel its announcements arrive on.
func heldAnnouncements(t *testing.T) <-chan wire.Rendezvous {
	t.Helper()
	got := make(chan wire.Rendezvous, 16)
	holdRendezvous = func(d wire.Rendezvous) bool {
		select {
		case got <- d:
		default:
		}
		return true
	}
	t.Cleanup(func() { holdRendezvous = nil })
	return got
}

// eachLendMode runs f with large messages lent through memory windows,
// where the test device has them, and through registrations of exactly
// the message (forceNoWindows, as on a device without windows).
func eachLendMode(t *testing.T, f func(t *testing.T)) {
	if testDeviceCaps(t).MemoryWindows {
		t.Run("windows", f)
	}
	t.Run("registrations", func(t *testing.T) {
		defer forceNoWindows.Store(forceNoWindows.Swap(true))
		f(t)
	})
}

// resumeHeld lets s read the large messages held by holdRendezvous.
func resumeHeld(s *Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.rdv.inLen {
		idx := s.rdv.inbox[(s.rdv.inHead+i)%len(s.rdv.inbox)]
		if s.rdv.in[idx].state == rvWaitPool {
			s.rdv.in[idx].state = rvNeedBuf
		}
	}
	s.pumpRendezvousLocked()
}

// sendHeldLarge posts a large message of n patterned bytes from c and
// returns its announcement as the receiver saw it.
func sendHeldLarge(t *testing.T, ctx context.Context, c *Conn, got <-chan wire.Rendezvous, n int, id uint64) ([]byte, wire.Rendezvous) {
	t.Helper()
	b, err := c.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i*7 + 1)
	}
	copy(b.Bytes(), want)
	if err := c.PostSend(ctx, b, id); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-got:
		return want, d
	case <-ctx.Done():
		t.Fatal("no announcement reached the receiver")
		return nil, wire.Rendezvous{}
	}
}

// TestRendezvousReachesOnlyTheMessage: the key a receiver gets for a large
// message reads exactly the announced bytes. Inside the range it reads the
// message; the byte after it (the rest of the message's own pool buffer,
// inside the arena every connection on the device shares) and the bytes
// before it are refused by the sender's NIC, on Soft-RoCE too, where a
// window's accesses are bounded by the MR it is bound over.
// Both ways of lending are checked (eachLendMode).
func TestRendezvousReachesOnlyTheMessage(t *testing.T) { eachLendMode(t, reachesOnlyTheMessage) }

func reachesOnlyTheMessage(t *testing.T) {
	got := heldAnnouncements(t)
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(20*time.Second))
	defer cancel()
	for _, probe := range []struct {
		name string
		at   func(d wire.Region) uint64
	}{
		{"after the message", func(d wire.Region) uint64 { return d.Addr + uint64(d.Len) }},
		{"before the message", func(d wire.Region) uint64 { return d.Addr - 64 }},
	} {
		t.Run(probe.name, func(t *testing.T) {
			c, s, ln := connPair(t, nil)
			defer ln.Close()
			defer c.Close()
			defer s.Close()
			// Shorter than its size class, so the buffer's own tail lies
			// beyond the announced range.
			n := c.peerBufSize + 1000
			// A buffer of the same class first, so the message's lies
			// inside its arena, not at its start.
			spacer, err := c.Alloc(n)
			if err != nil {
				t.Fatal(err)
			}
			defer spacer.Release()
			want, d := sendHeldLarge(t, ctx, c, got, n, 1)
			if int(d.Region.Len) != n {
				t.Fatalf("announced %d bytes, sent %d", d.Region.Len, n)
			}
			local, err := s.Alloc(64)
			if err != nil {
				t.Fatal(err)
			}
			defer local.Release()
			// The key is live: the start of the message reads.
			if err := s.ReadRemote(ctx, local, RemoteBuf(d.Region), 0); err != nil {
				t.Fatalf("reading the announced range: %v", err)
			}
			if !bytes.Equal(local.Bytes(), want[:64]) {
				t.Fatal("the announced range read other bytes than the message's")
			}
			forged := RemoteBuf{Addr: probe.at(d.Region), Len: 64, RKey: d.Region.RKey}
			err = s.ReadRemote(ctx, local, forged, 0)
			expectAccessRefused(t, s, err, fmt.Sprintf("reading 64 bytes %s with its key", probe.name))
			if !bytes.Equal(local.Bytes(), want[:64]) {
				t.Fatalf("reading 64 bytes %s with its key changed the local buffer: bytes outside the message arrived", probe.name)
			}
		})
	}
}

// TestRendezvousKeyDiesWhenDone: once the receiver has read a large message
// and the sender has its completion, the message's key reads nothing.
// Both ways of lending are checked (eachLendMode).
func TestRendezvousKeyDiesWhenDone(t *testing.T) { eachLendMode(t, keyDiesWhenDone) }

func keyDiesWhenDone(t *testing.T) {
	got := heldAnnouncements(t)
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(20*time.Second))
	defer cancel()
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	want, d := sendHeldLarge(t, ctx, c, got, 2*c.peerBufSize, 7)
	resumeHeld(s)
	m, err := s.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.Bytes(), want) {
		t.Fatal("the large message arrived changed")
	}
	m.Release()
	// The sender's completion comes after its window was revoked.
	oc, err := c.RecvCompletion(ctx)
	if err != nil || oc.ID != 7 || oc.Err != nil {
		t.Fatalf("sender's completion: %+v, %v", oc, err)
	}
	local, err := s.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Release()
	err = s.ReadRemote(ctx, local, RemoteBuf(d.Region), 0)
	expectAccessRefused(t, s, err, "reading a finished message with its key")
}

// expectAccessRefused checks that an access the peer's device must refuse
// was: ErrRemoteAccess, or, where sends complete locally (iWARP), the
// connection's end, since the peer's device terminates it (a READ cut short
// reports the connection's failure).
func expectAccessRefused(t *testing.T, c *Conn, err error, what string) {
	t.Helper()
	switch {
	case errors.Is(err, ErrRemoteAccess):
	case err != nil && c.dev.Caps.SendsCompleteLocally:
		t.Logf("%s: the peer's device ended the connection (%v)", what, err)
		return
	default:
		t.Fatalf("%s: %v, want ErrRemoteAccess", what, err)
	}
	t.Logf("%s: %v", what, err)
}

// expectWriteRefused is expectAccessRefused for a one-sided write, which
// on iWARP may complete (once TCP took it) before the peer's device
// refuses it: then the refusal shows as the connection's end.
func expectWriteRefused(t *testing.T, c *Conn, err error, what string) {
	t.Helper()
	if err != nil || !c.dev.Caps.SendsCompleteLocally {
		expectAccessRefused(t, c, err, what)
		return
	}
	waitFor(t, what+": the peer's device to end the connection", func() bool {
		info, err := c.QPInfo()
		return err == nil && info.State == "ERR"
	})
	t.Logf("%s: completed locally, then the peer's device ended the connection", what)
}

// TestRendezvousKeyDiesWithConnection: a sender that closes while its large
// message is lent revokes the key, and new connections over the same device
// whose QPs are the closed ones', from the QP pool, cannot use it from
// either end.
func TestRendezvousKeyDiesWithConnection(t *testing.T) {
	got := heldAnnouncements(t)
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(30*time.Second))
	defer cancel()
	c, s, ln := connPair(t, &Config{CloseTimeout: rdmatest.Scale(300 * time.Millisecond)})
	defer ln.Close()
	dev := c.dev
	_, d := sendHeldLarge(t, ctx, c, got, 2*c.peerBufSize, 1)
	holdRendezvous = nil
	for _, end := range []string{"dialer", "acceptor"} {
		c.Close() // the message is lent: Close revokes its window
		s.Close()
		// Both QPs go to the pool at their TIMEWAIT_EXIT; the next pair
		// takes them (where the CM connects QPs, none is pooled: the next
		// pair's are new).
		pooled := !dev.Caps.CMConnectsQP
		for pooled && dev.QPs.Len() < 2 {
			if ctx.Err() != nil {
				t.Fatalf("the closed connection's QPs never reached the pool (%d there)", dev.QPs.Len())
			}
			time.Sleep(10 * time.Millisecond)
		}
		var ln2 *Listener
		c, s, ln2 = dialPair(t, nil)
		defer ln2.Close()
		if pooled && (!c.ep.reused || !s.ep.reused) {
			t.Fatalf("new connection's QPs not from the pool (dialer %v, acceptor %v)", c.ep.reused, s.ep.reused)
		}
		reader := s // reads from the dialer's QP
		if end == "acceptor" {
			reader = c
		}
		local, err := reader.Alloc(64)
		if err != nil {
			t.Fatal(err)
		}
		err = reader.ReadRemote(ctx, local, RemoteBuf(d.Region), 0)
		local.Release()
		expectAccessRefused(t, reader, err, "reading a closed connection's lent message through the "+end+"'s QP")
	}
	c.Close()
	s.Close()
}
