// Command message shows the zero-copy message view: the sender fills a
// registered buffer and sends it without a copy; the receiver gets the very
// buffer the NIC wrote into, whole, on a channel, and releases it.
//
//	message -addr 192.168.1.10      # both ends in one process, on an RDMA netdev's IP
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"time"

	"github.com/gordma/rdma"
)

func main() {
	addr := flag.String("addr", os.Getenv("RDMA_TEST_ADDR"), "IP of an RDMA netdev")
	n := flag.Int("n", 10000, "messages to send")
	size := flag.Int("size", 4096, "message size in bytes")
	flag.Parse()
	if *addr == "" {
		log.Fatal("give -addr (an IP of an RDMA netdev)")
	}
	ln, err := rdma.Listen("rdma", net.JoinHostPort(*addr, "0"))
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() { done <- receive(ln, *n) }()

	c, err := rdma.Dial("rdma", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	start := time.Now()
	for i := 0; i < *n; i++ {
		b, err := c.Alloc(*size) // registered memory from the device's pool
		if err != nil {
			log.Fatal(err)
		}
		binary.LittleEndian.PutUint64(b.Bytes(), uint64(i))
		if err := c.Send(ctx, b); err != nil { // posted as is; released when the NIC is done
			log.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	el := time.Since(start)
	fmt.Printf("%d messages of %d B in %v: %.0f msg/s, %.1f MB/s (MB = 10^6 B), zero copies\n",
		*n, *size, el.Round(time.Millisecond), float64(*n)/el.Seconds(), float64(*n**size)/el.Seconds()/1e6)
}

func receive(ln *rdma.Listener, n int) error {
	c, err := ln.AcceptRDMA()
	if err != nil {
		return err
	}
	defer c.Close()
	for i := 0; i < n; i++ {
		b, ok := <-c.Messages() // the receive buffer itself; valid until Release
		if !ok {
			return fmt.Errorf("connection ended after %d messages", i)
		}
		if got := binary.LittleEndian.Uint64(b.Bytes()); got != uint64(i) {
			return fmt.Errorf("message %d carries %d", i, got)
		}
		b.Release() // reposts the receive and returns the credit to the sender
	}
	return nil
}
