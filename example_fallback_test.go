package rdma_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"time"

	"github.com/verbline/rdma"
)

// A service that must also serve, and reach, hosts without RDMA opts into
// TCP fallback on both sides. 127.0.0.1 has no RDMA device behind it, so
// this connection runs over TCP (on a host with RDMA, a dial to an RDMA
// netdev's IP runs over RDMA, with the same code).
func ExampleFallback() {
	lc := rdma.ListenConfig{Fallback: &rdma.Fallback{}} // rdma_cm and TCP on one port
	ln, err := lc.Listen(context.Background(), "rdma", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.AcceptRDMA()
		if err != nil {
			return
		}
		m, _ := c.Recv(context.Background()) // the message view works over TCP too
		c.Send(context.Background(), m)      // echoed whole
		c.Close()
	}()

	d := rdma.Dialer{Fallback: &rdma.Fallback{RDMATimeout: time.Second}} // RDMA first, TCP after
	nc, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	c := nc.(*rdma.Conn)
	defer c.Close()
	fmt.Println("transport:", c.LocalAddr().Network(), c.Transport())

	b, _ := c.Alloc(5)
	copy(b.Bytes(), "hello")
	c.Send(context.Background(), b)
	m, _ := c.Recv(context.Background())
	fmt.Printf("echo: %s\n", m.Bytes())
	m.Release()

	buf, _ := c.Alloc(4096)
	_, err = c.Export(buf, rdma.RemoteWrite) // one-sided access needs RDMA
	fmt.Println(errors.Is(err, rdma.ErrNotRDMA))
	buf.Release()
	_, err = c.Recv(context.Background())
	fmt.Println(err == io.EOF)
	// Output:
	// transport: tcp tcp
	// echo: hello
	// true
	// true
}
