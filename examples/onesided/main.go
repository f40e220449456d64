// Command onesided shows one-sided RDMA: the server exports a buffer and
// sends its descriptor in a message; the client writes into it and reads it
// back without the server's CPU, then writes with an immediate value that
// the server receives as a notification.
//
//	onesided -addr 192.168.1.10
package main

import (
	"bytes"
	"context"
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
	size := flag.Int("size", 16384, "exported buffer size")
	n := flag.Int("n", 1000, "RDMA writes to time")
	flag.Parse()
	if *addr == "" {
		log.Fatal("give -addr (an IP of an RDMA netdev)")
	}
	ln, err := rdma.Listen("rdma", net.JoinHostPort(*addr, "0"))
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	serverDone := make(chan error, 1)
	go func() { serverDone <- serve(ln, *size) }()

	ctx := context.Background()
	c, err := rdma.Dial("rdma", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	msg, err := c.Recv(ctx) // the server's descriptor
	if err != nil {
		log.Fatal(err)
	}
	remote, err := rdma.ParseRemoteBuf(msg.Bytes())
	msg.Release()
	if err != nil {
		log.Fatal(err)
	}
	local, err := c.Alloc(*size)
	if err != nil {
		log.Fatal(err)
	}
	defer local.Release()
	copy(local.Bytes(), bytes.Repeat([]byte("one-sided "), *size/10+1))
	start := time.Now()
	for i := 0; i < *n; i++ {
		if err := c.WriteRemote(ctx, local, remote, 0); err != nil {
			log.Fatal(err)
		}
	}
	el := time.Since(start)
	fmt.Printf("%d RDMA writes of %d B: %v each, %.1f MB/s (MB = 10^6 B)\n", *n, *size,
		(el / time.Duration(*n)).Round(time.Microsecond), float64(*n**size)/el.Seconds()/1e6)
	check, _ := c.Alloc(*size)
	defer check.Release()
	if err := c.ReadRemote(ctx, check, remote, 0); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("RDMA read back %d B: equal=%v\n", *size, bytes.Equal(check.Bytes(), local.Bytes()))
	if err := c.WriteRemoteImm(ctx, local, remote, 0, 42); err != nil {
		log.Fatal(err)
	}
	if err := <-serverDone; err != nil {
		log.Fatal(err)
	}
}

func serve(ln *rdma.Listener, size int) error {
	c, err := ln.AcceptRDMA()
	if err != nil {
		return err
	}
	defer c.Close()
	buf, err := c.Alloc(size)
	if err != nil {
		return err
	}
	defer buf.Release()
	exp, err := c.Export(buf, rdma.RemoteWrite|rdma.RemoteRead) // nothing is remote-accessible unless exported
	if err != nil {
		return err
	}
	defer exp.Close()
	desc, err := c.Alloc(64)
	if err != nil {
		return err
	}
	desc.SetLen(len(exp.Remote().AppendTo(desc.Bytes()[:0])))
	if err := c.Send(context.Background(), desc); err != nil {
		return err
	}
	note := <-c.Notifications() // the client's WriteRemoteImm
	defer note.Release()
	fmt.Printf("server: notified with imm=%d after %d B written; buffer starts %q\n", note.Imm, note.Len, buf.Bytes()[:20])
	return nil
}
