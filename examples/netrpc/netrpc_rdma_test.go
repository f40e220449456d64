package main

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"math/rand/v2"
	"net"
	"net/rpc"
	"sync"
	"testing"
	"time"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/rdmatest/baseline"
)

// TestNetRPC serves net/rpc on an rdma.Listener to two clients over RDMA
// connections: 1600 small calls from 8 goroutines in flight at once, and
// among them large arguments and replies (256 KiB to 4 MiB, digested by the
// server and echoed back, checked byte for byte); a call to a missing method
// fails without breaking its client. Then the clients' Close, the
// listener's Close, and no RDMA object or goroutine left.
func TestNetRPC(t *testing.T) {
	env := rdmatest.Require(t)
	baseRes, baseG := baseline.Take(t, env)

	ln, err := rdma.Listen("rdma", net.JoinHostPort(env.Addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { serve(newServer(), ln); close(served) }()

	const clients, workers, perWorker = 2, 4, 200
	cs := make([]*rpc.Client, clients)
	for i := range cs {
		if cs[i], err = dial(ln.Addr().String()); err != nil {
			t.Fatal(err)
		}
	}

	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var small, large, largeBytes int
	for k := range clients * workers {
		c := cs[k%clients]
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(k), 34))
			src := rand.NewChaCha8([32]byte{byte(k)})
			for i := range perWorker {
				switch i {
				case 50: // a large argument, digested by the server
					big := make([]byte, 1<<20+r.IntN(3<<20))
					src.Read(big)
					var sum [sha256.Size]byte
					if err := c.Call("Blob.Digest", big, &sum); err != nil {
						t.Errorf("worker %d: Blob.Digest of %d bytes: %v", k, len(big), err)
						return
					}
					if sum != sha256.Sum256(big) {
						t.Errorf("worker %d: Blob.Digest of %d bytes: the server's digest differs", k, len(big))
						return
					}
					mu.Lock()
					large, largeBytes = large+1, largeBytes+len(big)
					mu.Unlock()
					continue
				case 150: // a large argument and reply
					big := make([]byte, 256<<10+r.IntN(1<<20))
					src.Read(big)
					var back []byte
					if err := c.Call("Blob.Echo", big, &back); err != nil {
						t.Errorf("worker %d: Blob.Echo of %d bytes: %v", k, len(big), err)
						return
					}
					if !bytes.Equal(back, big) {
						t.Errorf("worker %d: Blob.Echo of %d bytes: %d bytes back, differing", k, len(big), len(back))
						return
					}
					mu.Lock()
					large, largeBytes = large+1, largeBytes+2*len(big)
					mu.Unlock()
					continue
				case 100: // a missing method: an error for this call only
					var reply []byte
					err := c.Call("Blob.Missing", []byte("x"), &reply)
					var se rpc.ServerError
					if !errors.As(err, &se) {
						t.Errorf("worker %d: call of a missing method: %v, want an rpc.ServerError", k, err)
						return
					}
					continue
				}
				args := make([]byte, 1+r.IntN(512))
				src.Read(args)
				var reply []byte
				if err := c.Call("Blob.Echo", args, &reply); err != nil {
					t.Errorf("worker %d, call %d: %v", k, i, err)
					return
				}
				if !bytes.Equal(reply, args) {
					t.Errorf("worker %d, call %d: reply differs from the %d-byte argument", k, i, len(args))
					return
				}
				mu.Lock()
				small++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	t.Logf("%d small calls and %d large ones (%.1f MiB) over %d connections from %d goroutines: %v",
		small, large, float64(largeBytes)/(1<<20), clients, clients*workers, el.Round(time.Millisecond))
	// The leak check at the end can only see leaks if it sees live objects.
	if live := rdmatest.Resources(t); live["qp"] < 2*clients || live["cm_id"] < 2*clients+1 {
		t.Errorf("with %d connections open, rdma resource show lists %v for this process", clients, live)
	}
	if t.Failed() {
		t.FailNow()
	}

	for _, c := range cs {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		var reply []byte
		if err := c.Call("Blob.Echo", []byte("x"), &reply); !errors.Is(err, rpc.ErrShutdown) {
			t.Fatalf("call after Close: %v, want rpc.ErrShutdown", err)
		}
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-served: // serve returns after every ServeConn has
	case <-time.After(rdmatest.Scale(10 * time.Second)):
		t.Fatal("the server's connections did not end after the clients closed theirs")
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
	rdmatest.CheckNoLeaks(t, baseRes, baseG)
}
