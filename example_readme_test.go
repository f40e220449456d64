package rdma_test

// The README's quick starts. README.md copies its Go snippets verbatim from
// the bodies below (TestReadmeSnippets checks that), so what a new user
// reads first compiles; TestReadmeExamples runs them inside Soft-RoCE. Like
// example_test.go's, they need a device: each says what it prints in a
// "Prints:" comment instead of "Output:".

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"

	"github.com/verbline/rdma"
)

// readmeAddr is the address the README's snippets call addr: an IP of an
// RDMA-capable netdev (RDMA_TEST_ADDR inside Soft-RoCE) and a fixed port,
// as a service would use.
func readmeAddr() string {
	host := os.Getenv("RDMA_TEST_ADDR")
	if host == "" {
		host = "192.168.1.10"
	}
	return net.JoinHostPort(host, "7479")
}

// net/http over RDMA: the server takes the Listener, the client's
// http.Transport takes the Dialer.
func Example_netHTTP() {
	addr := readmeAddr()
	ln, err := rdma.Listen("rdma", addr) // addr: "192.168.1.10:7479", an IP of an RDMA netdev
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello over %s", r.Proto)
	})}
	go srv.Serve(ln)
	defer srv.Close() // closes ln and the server's connections

	var d rdma.Dialer // d.DialContext has net.Dialer.DialContext's signature
	tr := &http.Transport{DialContext: d.DialContext}
	defer tr.CloseIdleConnections() // the client's connections
	resp, err := (&http.Client{Transport: tr}).Get("http://" + addr + "/")
	if err != nil {
		log.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(string(body), err)
	// Prints:
	// hello over HTTP/1.1 <nil>
}

// The message view: the sender's registered buffer is posted as it is, and
// the receiver gets the buffer the NIC wrote into, whole.
func Example_messages() {
	addr := readmeAddr()
	ln, err := rdma.Listen("rdma", addr)
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	ctx := context.Background()
	done := make(chan struct{})
	go func() {
		defer close(done)
		nc, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		peer := nc.(*rdma.Conn)
		defer peer.Close()
		m, err := peer.Recv(ctx) // the receive buffer the NIC wrote into
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s (%d bytes)\n", m.Bytes(), m.Len())
		m.Release() // reposts the receive, returns the sender's credit
	}()

	c, err := rdma.Dial("rdma", addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	b, err := c.Alloc(len("hello, messages")) // registered memory from the pool
	if err != nil {
		log.Fatal(err)
	}
	copy(b.Bytes(), "hello, messages")
	if err := c.Send(ctx, b); err != nil { // no copy: the NIC reads b; b is c's now
		log.Fatal(err)
	}
	<-done
	// Prints:
	// hello, messages (15 bytes)
}
