package rdma

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/tcpframe"
)

// waitStats polls ln.Stats until ok accepts them or the bound passes (a
// handshake's outcome is counted on its own goroutine, after its dialer
// already has its answer).
func waitStats(t *testing.T, ln *Listener, what string, ok func(ListenerStats) bool) ListenerStats {
	t.Helper()
	end := time.Now().Add(rdmatest.Scale(10 * time.Second))
	for {
		st := ln.Stats()
		if ok(st) {
			return st
		}
		if time.Now().After(end) {
			t.Fatalf("listener stats %+v: want %s", st, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A fallback listener (TCP alone on loopback) counts each outcome once:
// an accepted dialer, a dialer that is not a fallback peer (failed, with
// its address and the reason kept), one its Admit hook refuses, and one
// that finds Accept's queue full.
func TestListenerStatsFallback(t *testing.T) {
	g0 := rdmatest.Goroutines()
	var refuse atomic.Bool
	ln := fallbackListen(t, ListenConfig{
		Config: Config{Backlog: 1},
		Admit: func(netip.AddrPort) error {
			if refuse.Load() {
				return errors.New("not on the guest list")
			}
			return nil
		},
	})
	defer ln.Close()
	if st := ln.Stats(); st != (ListenerStats{}) {
		t.Fatalf("a new listener's stats: %+v, want zeros", st)
	}

	// Accepted: queued for Accept (and so filling the backlog of one).
	c, err := fallbackDialTCP(ln)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitStats(t, ln, "Accepted 1", func(st ListenerStats) bool { return st.Accepted == 1 })

	// Refused: Accept's queue is full.
	if _, err := fallbackDialTCP(ln); !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), "backlog") {
		t.Fatalf("dial with Accept's queue full: %v, want ErrHandshake naming the backlog", err)
	}
	waitStats(t, ln, "Refused 1", func(st ListenerStats) bool { return st.Refused == 1 })
	sc, err := ln.AcceptRDMA()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()

	// Refused: the Admit hook says no.
	refuse.Store(true)
	if _, err := fallbackDialTCP(ln); !errors.Is(err, ErrHandshake) {
		t.Fatalf("dial Admit refuses: %v, want ErrHandshake", err)
	}
	waitStats(t, ln, "Refused 2", func(st ListenerStats) bool { return st.Refused == 2 })
	refuse.Store(false)

	// Failed: a plain TCP client that speaks another protocol.
	before := time.Now()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	local := nc.LocalAddr().String()
	nc.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	st := waitStats(t, ln, "Failed 1", func(st ListenerStats) bool { return st.Failed == 1 })
	nc.Close()
	if st.LastFailure == nil || !strings.Contains(st.LastFailure.Error(), local) ||
		!errors.Is(st.LastFailure, tcpframe.ErrNotFallbackPeer) {
		t.Errorf("LastFailure %v: want the dialer's address %s and ErrNotFallbackPeer", st.LastFailure, local)
	}
	if st.LastFailureAt.Before(before) {
		t.Errorf("LastFailureAt %v, before the failing dial began (%v)", st.LastFailureAt, before)
	}
	want := ListenerStats{Accepted: 1, Refused: 2, Failed: 1}
	st.LastFailure, st.LastFailureAt = nil, time.Time{}
	if st != want {
		t.Errorf("stats %+v, want %+v", st, want)
	}
	sc.Close()
	c.Close()
	ln.Close()
	checkFallbackClean(t, g0)
}
