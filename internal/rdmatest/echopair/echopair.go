// Package echopair gives tests outside package rdma (the metrics
// subpackages') an RDMA connection to an echo server in the same process.
// It lives apart from rdmatest because it imports rdma, whose own tests
// import rdmatest.
package echopair

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"testing"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
)

// Pair is a client connection and the listener whose server end echoes
// every byte back.
type Pair struct {
	Client *rdma.Conn
	ln     *rdma.Listener
	served chan error
}

// Open listens on env's address, dials it, and echoes on the accepted end.
func Open(t *testing.T, env rdmatest.Env) *Pair {
	t.Helper()
	ln, err := rdma.Listen("rdma", net.JoinHostPort(env.Addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	p := &Pair{ln: ln, served: make(chan error, 1)}
	go func() {
		s, err := ln.Accept()
		if err == nil {
			_, err = io.Copy(s, s)
			s.Close()
		}
		p.served <- err
	}()
	if p.Client, err = rdma.Dial("rdma", ln.Addr().String()); err != nil {
		ln.Close()
		t.Fatal(err)
	}
	return p
}

// RoundTrip writes n random bytes and reads them back, checking them.
// It moves n bytes each way.
func (p *Pair) RoundTrip(t *testing.T, n int) {
	t.Helper()
	out := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(n)}).Read(out)
	werr := make(chan error, 1)
	go func() {
		_, err := p.Client.Write(out)
		werr <- err
	}()
	in := make([]byte, n)
	if _, err := io.ReadFull(p.Client, in); err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(in, out) {
		t.Fatalf("%d bytes echoed differ from those written", n)
	}
}

// Close closes the client, waits for the server end to finish and closes
// the listener.
func (p *Pair) Close(t *testing.T) {
	t.Helper()
	if err := p.Client.Close(); err != nil {
		t.Error(err)
	}
	if err := <-p.served; err != nil {
		t.Error(err)
	}
	p.ln.Close()
}
