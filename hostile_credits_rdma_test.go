//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"io"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// rawControl posts n zero-length messages of kind with value val that
// spend no credit, one after the other as fast as each completes, as a
// hostile peer could: the credit updates and probes a peer with the
// control reserve sends without a grant, and done answers. Each after the
// first waits for the previous one's completion (as a well-behaved peer
// does), so none meets a receiver without a posted receive and none is
// delayed by an RNR NAK. (The first does not wait for the library's own
// sends: an unsignaled one stays counted until a later signaled send
// completes.)
func rawControl(t *testing.T, c *Conn, kind wire.Kind, val uint32, n int) {
	t.Helper()
	deadline := time.Now().Add(rdmatest.Scale(5 * time.Second))
	for sent := 0; sent < n; {
		c.mu.Lock()
		if c.qpDown {
			c.mu.Unlock()
			return // the receiver has ended the connection already
		}
		if sent > 0 && c.sqUsedLocked() > 0 {
			c.mu.Unlock()
			if time.Now().After(deadline) {
				t.Fatalf("a send did not complete after %d of %d messages", sent, n)
			}
			runtime.Gosched()
			continue
		}
		err := c.postLocked(verbs.SendWR{Opcode: verbs.OpSendWithImm, Imm: wire.EncodeImm(kind, val)}, wrSendCtl, 0, true)
		c.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		sent++
	}
}

// expectProtocolError waits until s has ended its connection, checks that
// its reader sees ErrProtocol mentioning want, that the offending peer is
// told (its reader sees the connection reset, ECONNRESET, within the same
// wait; left untold, its read would only reach the deadline, or a
// transport timeout once its sends ran out of retries), and that c2 and
// s2, another connection on the same device, still carry data both ways.
func expectProtocolError(t *testing.T, s, peer, c2, s2 *Conn, want string) {
	t.Helper()
	wait := rdmatest.Scale(2 * time.Second)
	deadline := time.Now().Add(wait)
	for {
		s.mu.Lock()
		failed := s.stream.rerr != nil
		s.mu.Unlock()
		if failed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the receiver accepted it: no error within %v", wait)
		}
		time.Sleep(time.Millisecond)
	}
	_, err := io.ReadAll(s)
	if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), want) {
		t.Fatalf("receiver's read: %v, want ErrProtocol mentioning %q", err, want)
	}
	t.Logf("receiver: %v", err)
	peer.SetReadDeadline(time.Now().Add(wait))
	if _, err := io.ReadAll(peer); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the offending peer's read: %v, want the connection reset (ECONNRESET)", err)
	}
	echoOnce(t, c2, s2)
	echoOnce(t, s2, c2)
}

// TestHostileCreditGrant: a peer that grants more credits than any
// receive window holds (the most the immediate data carries, 2^24-1), in
// a credit update, a probe or a data message, ends its connection with
// ErrProtocol; another connection on the device keeps working.
func TestHostileCreditGrant(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind wire.Kind
	}{
		{"credit update", wire.KindCredit},
		{"probe", wire.KindKeepalive},
		{"data message", wire.KindData},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s, ln := connPair(t, nil)
			defer ln.Close()
			defer s.Close()
			defer c.Close()
			c2, s2, ln2 := connPair(t, nil)
			defer ln2.Close()
			defer s2.Close()
			defer c2.Close()
			if tc.kind == wire.KindData {
				rawSend(t, c, tc.kind, wire.MaxImmCredits, nil)
			} else {
				rawControl(t, c, tc.kind, wire.MaxImmCredits, 1)
			}
			expectProtocolError(t, s, c, c2, s2, "credits")
		})
	}
}

// TestHostileControlAllowance: control messages that spend no credit
// beyond what the protocol allows a peer end its connection with
// ErrProtocol: a credit update that returns no credit, probes sent
// back to back (far more often than the keepalive's shortest interval),
// and a done answer for a rendezvous already answered. Another
// connection on the device keeps working.
func TestHostileControlAllowance(t *testing.T) {
	t.Run("credit update returning nothing", func(t *testing.T) {
		c, s, ln := connPair(t, nil)
		defer ln.Close()
		defer s.Close()
		defer c.Close()
		c2, s2, ln2 := connPair(t, nil)
		defer ln2.Close()
		defer s2.Close()
		defer c2.Close()
		rawControl(t, c, wire.KindCredit, 0, 1)
		expectProtocolError(t, s, c, c2, s2, "credit update")
	})
	t.Run("probe flood", func(t *testing.T) {
		c, s, ln := connPair(t, nil)
		defer ln.Close()
		defer s.Close()
		defer c.Close()
		c2, s2, ln2 := connPair(t, nil)
		defer ln2.Close()
		defer s2.Close()
		defer c2.Close()
		rawControl(t, c, wire.KindKeepalive, 0, 200)
		expectProtocolError(t, s, c, c2, s2, "probes")
	})
	t.Run("second done answer", func(t *testing.T) {
		cfg := &Config{BufferSize: 4096}
		c, s, ln := connPair(t, cfg)
		defer ln.Close()
		defer s.Close()
		defer c.Close()
		c2, s2, ln2 := connPair(t, cfg)
		defer ln2.Close()
		defer s2.Close()
		defer c2.Close()
		ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(10*time.Second))
		defer cancel()
		m, err := c.Alloc(100000)
		if err != nil {
			t.Fatal(err)
		}
		c.mu.Lock()
		c.initSendSlotsLocked()
		id := c.msgs.free[len(c.msgs.free)-1] // the send slot Send takes, which is the rendezvous id
		c.mu.Unlock()
		if err := c.Send(ctx, m); err != nil {
			t.Fatal(err)
		}
		r, err := s.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r.Release()
		// The message was read and answered: a second answer is one more
		// than the rendezvous allows.
		rawControl(t, s, wire.KindRendezvousDone, uint32(id), 1)
		expectProtocolError(t, c, s, c2, s2, "not outstanding")
	})
}
