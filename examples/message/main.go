// Command message shows the zero-copy message view: the sender fills a
// registered buffer and sends it without a copy; the receiver gets the very
// buffer the NIC wrote into, whole, on a channel, and releases it. Messages
// larger than the receiver's buffers (the second phase) are read by the
// receiver straight from the sender's buffer (RDMA READ), still whole
// and uncopied.
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

	"github.com/verbline/rdma"
)

func main() {
	addr := flag.String("addr", os.Getenv("RDMA_TEST_ADDR"), "IP of an RDMA netdev")
	n := flag.Int("n", 10000, "small messages to send")
	size := flag.Int("size", 4096, "small message size in bytes")
	nLarge := flag.Int("nlarge", 200, "large messages to send after the small ones")
	large := flag.Int("large", 1<<20, "large message size in bytes (above the 32 KiB receive buffers)")
	flag.Parse()
	if *addr == "" {
		log.Fatal("give -addr (an IP of an RDMA netdev)")
	}
	ln, err := rdma.Listen("rdma", net.JoinHostPort(*addr, "0"))
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	phases := []struct{ n, size int }{{*n, *size}, {*nLarge, *large}}
	done := make(chan error, 1)
	go func() { done <- receive(ln, len(phases)) }()

	c, err := rdma.Dial("rdma", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	seq := 0
	for _, ph := range phases {
		start := time.Now()
		for i := 0; i < ph.n; i++ {
			b, err := c.Alloc(ph.size) // registered memory from the device's pool
			if err != nil {
				log.Fatal(err)
			}
			binary.LittleEndian.PutUint64(b.Bytes(), uint64(seq))
			seq++
			if err := c.Send(ctx, b); err != nil { // posted as is; released when the NIC (or the peer) is done
				log.Fatal(err)
			}
		}
		// Wait until the receiver has all of them: a round trip of a tiny message.
		if err := ping(ctx, c); err != nil {
			log.Fatal(err)
		}
		el := time.Since(start)
		fmt.Printf("%d messages of %d B in %v: %.0f msg/s, %.1f MB/s (MB = 10^6 B), zero copies\n",
			ph.n, ph.size, el.Round(time.Millisecond), float64(ph.n)/el.Seconds(), float64(ph.n*ph.size)/el.Seconds()/1e6)
	}
	if err := <-done; err != nil {
		log.Fatal(err)
	}
}

// ping sends an 8-byte marker and waits for the receiver's echo of it.
func ping(ctx context.Context, c *rdma.Conn) error {
	b, err := c.Alloc(8)
	if err != nil {
		return err
	}
	binary.LittleEndian.PutUint64(b.Bytes(), ^uint64(0))
	if err := c.Send(ctx, b); err != nil {
		return err
	}
	r, err := c.Recv(ctx)
	if err != nil {
		return err
	}
	return r.Release()
}

// receive checks the numbered messages and echoes each end-of-phase marker,
// until it has echoed phases of them.
func receive(ln *rdma.Listener, phases int) error {
	c, err := ln.AcceptRDMA()
	if err != nil {
		return err
	}
	defer c.Close()
	for i := 0; phases > 0; {
		b, ok := <-c.Messages() // valid until Release
		if !ok {
			return fmt.Errorf("connection ended after %d messages", i)
		}
		got := binary.LittleEndian.Uint64(b.Bytes())
		// Release reposts a receive buffer (returning the sender's credit),
		// or gives a large message's buffer back to the pool.
		b.Release()
		if got == ^uint64(0) { // the sender's end-of-phase marker: echo it
			phases--
			e, err := c.Alloc(8)
			if err != nil {
				return err
			}
			binary.LittleEndian.PutUint64(e.Bytes(), got)
			if err := c.Send(context.Background(), e); err != nil {
				return err
			}
			continue
		}
		if got != uint64(i) {
			return fmt.Errorf("message %d carries %d", i, got)
		}
		i++
	}
	return nil
}
