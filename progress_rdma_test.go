//go:build linux && cgo

package rdma

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
)

// TestParkWakeStress guards the caller-driven completion design against
// lost wake-ups: several connections on one shared CQ, ping-ponging with a
// spin budget so small that most waits park (and, in event mode, all of
// them), one streaming faster than its credits allow (Write parks for
// credit), while a channel consumer selects on Messages() on the same CQ.
// A lost wake-up hangs a round trip; the test fails on its deadline.
func TestParkWakeStress(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"tiny spin", Config{PollSpin: time.Nanosecond, RecvBuffers: 8, SendBuffers: 8}},
		{"event mode", Config{PollMode: PollEvent, RecvBuffers: 8, SendBuffers: 8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			c0, s0, ln := connPair(t, &cfg)
			defer ln.Close()
			type pair struct{ c, s *Conn }
			pairs := []pair{{c0, s0}}
			for i := 0; i < 4; i++ {
				c, s := dialAgain(t, ln, &cfg)
				pairs = append(pairs, pair{c, s})
			}
			defer func() {
				for _, p := range pairs {
					p.c.Close()
					p.s.Close()
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(60*time.Second))
			defer cancel()
			const rounds = 300
			var wg sync.WaitGroup
			errc := make(chan error, 16)
			for i, p := range pairs[:3] { // stream ping-pong: Read parks, Write may wait for credit
				wg.Add(2)
				go func() {
					defer wg.Done()
					io.Copy(p.s, p.s)
				}()
				go func() {
					defer wg.Done()
					buf := make([]byte, 64+i)
					for r := 0; r < rounds; r++ {
						if _, err := p.c.Write(buf); err != nil {
							errc <- err
							return
						}
						if _, err := io.ReadFull(p.c, buf); err != nil {
							errc <- err
							return
						}
					}
					p.c.CloseWrite()
				}()
			}
			// A stream one way: the writer outruns its 8 credits, so
			// Write parks for credit while the reader parks for data.
			bulk := pairs[4]
			wg.Add(2)
			go func() {
				defer wg.Done()
				buf := make([]byte, 3000)
				for r := 0; r < rounds; r++ {
					fill(buf, r)
					if _, err := bulk.c.Write(buf); err != nil {
						errc <- err
						return
					}
				}
				bulk.c.CloseWrite()
			}()
			go func() {
				defer wg.Done()
				got, err := io.ReadAll(bulk.s)
				if err != nil {
					errc <- err
					return
				}
				if len(got) != rounds*3000 {
					errc <- fmt.Errorf("stream: %d bytes arrived, want %d", len(got), rounds*3000)
					return
				}
				want := make([]byte, 3000)
				for r := 0; r < rounds; r++ {
					fill(want, r)
					if !bytes.Equal(got[r*3000:(r+1)*3000], want) {
						errc <- fmt.Errorf("stream: write %d arrived changed", r)
						return
					}
				}
			}()
			// A consumer that only selects on Messages(): no caller drives
			// the CQ for it, the poller must.
			p := pairs[3]
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := 0; r < rounds; r++ {
					b, err := p.c.Alloc(100)
					if err != nil {
						errc <- err
						return
					}
					if err := p.c.Send(ctx, b); err != nil {
						errc <- err
						return
					}
					select {
					case m, ok := <-p.s.Messages():
						if !ok {
							errc <- fmt.Errorf("Messages closed after %d", r)
							return
						}
						m.Release()
					case <-ctx.Done():
						errc <- fmt.Errorf("message %d never delivered to a channel consumer", r)
						return
					}
				}
			}()
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-ctx.Done():
				t.Fatal("round trips hung: a wake-up was lost")
			}
			close(errc)
			for err := range errc {
				t.Fatal(err)
			}
			st := pairs[0].c.Stats()
			t.Logf("%s: parks %d, poller wake-ups %d, caller polls %d", tc.name, st.Parks, st.PollerWakeups, st.InlinePolls)
			if st.Parks == 0 {
				t.Fatal("no wait parked: the test did not exercise the park path")
			}
			stalls := bulk.c.counts.creditStalls.Load()
			t.Logf("%s: stream writer: credit stalls %d", tc.name, stalls)
			if stalls == 0 {
				t.Fatal("the stream's writer never waited for credit: the test did not exercise Write's wait")
			}
		})
	}
}

// TestCompletionsWithoutCaller: a completion that arrives after every
// caller stopped waiting is still handled, without a call into the
// library. Here the sender's rendezvous ends that way: its Send returned
// when the peer took the announcement, and the peer's done answer (which
// revokes the window and gives the buffer back to the pool) comes after the
// receiver's last Recv, which drove the shared CQ. The poller must not
// sleep with the CQ unarmed and no look scheduled: the buffer would stay
// out, and another connection waiting for the pool would wait for ever.
func TestCompletionsWithoutCaller(t *testing.T) {
	waitNoDevice(t)
	c, s, ln := connPair(t, &Config{RecvBuffers: 8, SendBuffers: 8, BufferSize: 4096})
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(30*time.Second))
	defer cancel()
	for round := 0; round < 20; round++ {
		// Callers drive the CQ: the receiver's Recv polls it.
		for i := 0; i < 5; i++ {
			if err := c.Send(ctx, mustAlloc(t, c, 64)); err != nil {
				t.Fatal(err)
			}
			m, err := s.Recv(ctx)
			if err != nil {
				t.Fatal(err)
			}
			m.Release()
		}
		b := mustAlloc(t, c, 1<<20)
		fill(b.Bytes(), round)
		if err := c.Send(ctx, b); err != nil {
			t.Fatal(err)
		}
		m, err := s.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		checkFill(t, m.Bytes(), round, 1<<20)
		m.Release()
		// Nobody calls into c or s now: the done answer and the window's
		// invalidation must still be handled, and the buffer freed.
		deadline := time.Now().Add(rdmatest.Scale(time.Second))
		for b.Valid() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if b.Valid() {
			c.mu.Lock()
			out := c.rdv.out
			c.mu.Unlock()
			t.Fatalf("round %d: the sender's 1 MiB buffer is still lent (%d rendezvous out) %v after the receiver released the message; "+
				"nobody handled the completions that end it", round, out, rdmatest.Scale(time.Second))
		}
	}
}
