//go:build linux && cgo

package rdma

import (
	"context"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
)

// TestFirstMessageMissed: where the connecting side must send first
// (iWARP), a listener that does not notice the dialer's first message
// still accepts, long before its HandshakeTimeout, because the dialer
// sends it again until the listener answers (reprobe). Soft-iWARP leaves
// a message unread that reaches the listener during its accept; the test
// makes the listener miss the first message on any device
// (missFirstMessages), and makes connections follow the rule where the
// device does not (forceActiveSendsFirst). Without the repeat the accept
// fails at HandshakeTimeout; without the listener's answer the dialer
// would go on probing, which the test sees in its send count.
func TestFirstMessageMissed(t *testing.T) {
	defer forceActiveSendsFirst.Store(forceActiveSendsFirst.Swap(true))
	missFirstMessages.Store(1)
	defer missFirstMessages.Store(0)
	checkLeaksAtEnd(t)
	cfg := &Config{HandshakeTimeout: rdmatest.Scale(10 * time.Second)}
	ln := listenTest(t, cfg)
	defer ln.Close()
	accepted := make(chan *Conn, 1)
	go func() {
		s, err := ln.AcceptRDMA()
		if err == nil {
			accepted <- s
		}
	}()
	start := time.Now()
	d := Dialer{Config: *cfg, Timeout: cfg.HandshakeTimeout}
	nc, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := nc.(*Conn)
	defer c.Close()
	var s *Conn
	select {
	case s = <-accepted:
	case <-time.After(cfg.HandshakeTimeout / 2):
		// The listener gives up at HandshakeTimeout and resets the
		// connection, which its dialer believes established.
		t.Fatalf("no connection accepted %v after the dial began (HandshakeTimeout %v): the listener "+
			"waits for a message the dialer did not send again", time.Since(start), cfg.HandshakeTimeout)
	}
	defer s.Close()
	t.Logf("accepted %v after the dial began", time.Since(start))
	if n := missFirstMessages.Load(); n != 0 {
		t.Fatalf("the listener noticed the dialer's first message (%d misses left): the case did not run", n)
	}

	// The dialer stops probing once the listener's answer arrived: the
	// probes went at 0 and after confirmAfter, and the next would go at
	// 3, 7, 15 and 31 confirmAfter.
	time.Sleep(8 * confirmAfter)
	before := c.ep.qp.PostCounts().SendWRs
	time.Sleep(24 * confirmAfter)
	if after := c.ep.qp.PostCounts().SendWRs; after != before {
		t.Fatalf("the dialer posted %d sends while idle after the handshake: it went on probing", after-before)
	}

	exchange(t, c, s) // the connection carries data both ways, and closes
}
