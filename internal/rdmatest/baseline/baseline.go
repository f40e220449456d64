// Package baseline takes the resource baseline that tests outside the rdma
// package (the examples') compare against at their end. It lives apart from
// rdmatest because it imports rdma, whose own tests import rdmatest.
package baseline

import (
	"io"
	"net"
	"testing"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
)

// Take returns the process's RDMA objects and goroutines to compare with
// (rdmatest.CheckNoLeaks) after a test. One RDMA connection is made and
// closed first, because librdmacm keeps a context and a PD per device from
// its first use on; the goroutine count is taken before it, and the
// device's pollers must be gone again before the RDMA objects are counted.
func Take(t *testing.T, env rdmatest.Env) (map[string]int, int) {
	t.Helper()
	g := rdmatest.Goroutines()
	ln, err := rdma.Listen("rdma", net.JoinHostPort(env.Addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan error, 1)
	go func() {
		s, err := ln.Accept()
		if err == nil {
			_, err = io.Copy(io.Discard, s)
			s.Close()
		}
		accepted <- err
	}()
	c, err := rdma.Dial("rdma", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	ln.Close()
	rdmatest.WaitGoroutines(t, g)
	return rdmatest.Resources(t), g
}
