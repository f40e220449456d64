// Command echo is an RDMA echo server and client built on the net.Conn API.
//
//	echo -listen 192.168.1.10:7471            # server
//	echo -connect 192.168.1.10:7471 -n 1000   # client: ping-pong round trips, then a bulk echo
//
// With neither flag it runs both in one process on -addr (default
// $RDMA_TEST_ADDR, which scripts/softroce sets).
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"sort"
	"time"

	"github.com/verbline/rdma"
)

var cfg rdma.Config

func main() {
	listen := flag.String("listen", "", "serve echo on this address")
	connect := flag.String("connect", "", "connect to an echo server at this address")
	addr := flag.String("addr", os.Getenv("RDMA_TEST_ADDR"), "IP of an RDMA netdev, for the all-in-one mode")
	n := flag.Int("n", 1000, "ping-pong round trips")
	size := flag.Int("size", 64, "ping-pong message size")
	bulk := flag.Int("bulk", 16<<20, "bytes to echo in bulk")
	flag.DurationVar(&cfg.PollSpin, "spin", 0, "completion poller spin budget (0: library default)")
	flag.Parse()
	switch {
	case *listen != "":
		ln, err := (&rdma.ListenConfig{Config: cfg}).Listen(context.Background(), "rdma", *listen)
		if err != nil {
			log.Fatal(err)
		}
		log.Printf("echo server on %s", ln.Addr())
		serve(ln)
	case *connect != "":
		if err := client(*connect, *n, *size, *bulk); err != nil {
			log.Fatal(err)
		}
	default:
		if *addr == "" {
			log.Fatal("give -listen, -connect, or -addr (an IP of an RDMA netdev)")
		}
		ln, err := (&rdma.ListenConfig{Config: cfg}).Listen(context.Background(), "rdma", net.JoinHostPort(*addr, "0"))
		if err != nil {
			log.Fatal(err)
		}
		go serve(ln)
		err = client(ln.Addr().String(), *n, *size, *bulk)
		ln.Close()
		if err != nil {
			log.Fatal(err)
		}
	}
}

func serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			io.Copy(c, c) // Conn is a net.Conn: the standard library does the rest
		}()
	}
}

func client(addr string, n, size, bulk int) error {
	d := rdma.Dialer{Config: cfg}
	nc, err := d.DialContext(context.Background(), "rdma", addr)
	if err != nil {
		return err
	}
	c := nc.(*rdma.Conn)
	defer c.Close()
	fmt.Printf("connected %s -> %s\n", c.LocalAddr(), c.RemoteAddr())

	msg := bytes.Repeat([]byte{'x'}, size)
	buf := make([]byte, size)
	rtts := make([]time.Duration, n)
	for i := range rtts {
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		rtts[i] = time.Since(start)
	}
	sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
	fmt.Printf("ping-pong %d B x %d: round trip median %v, p99 %v\n", size, n, rtts[n/2], rtts[n*99/100])

	data := make([]byte, bulk)
	for i := range data {
		data[i] = byte(i * 7)
	}
	start := time.Now()
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		errc <- err
	}()
	got := make([]byte, bulk)
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if err := <-errc; err != nil {
		return err
	}
	el := time.Since(start)
	if !bytes.Equal(got, data) {
		return fmt.Errorf("bulk echo: data differs")
	}
	fmt.Printf("bulk echo %d MiB: %v, %.1f MB/s each way (MB = 10^6 B)\n", bulk>>20, el.Round(time.Millisecond), float64(bulk)/el.Seconds()/1e6)
	return nil
}
