package rdma_test

// Examples of datagrams (PacketConn). Like those of example_test.go they
// need an RDMA device, so they carry a "Prints:" comment instead of
// "Output:"; TestPacketExamples (example_packet_rdma_test.go) runs them
// inside Soft-RoCE.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"time"

	"github.com/verbline/rdma"
)

// A datagram echo: a PacketConn is a net.PacketConn over an RDMA UD queue
// pair. ReadFrom returns the sender's address, which WriteTo answers.
func ExampleListenPacket() {
	host := os.Getenv("RDMA_TEST_ADDR") // an IP of an RDMA-capable netdev
	if host == "" {
		host = "192.168.1.10"
	}
	srv, err := rdma.ListenPacket("rdma", net.JoinHostPort(host, "0")) // port 0: a free port
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, srv.MaxDatagramSize())
		for {
			n, from, err := srv.ReadFrom(buf)
			if err != nil {
				return // net.ErrClosed once srv is closed
			}
			srv.WriteTo(bytes.ToUpper(buf[:n]), from)
		}
	}()

	c, err := rdma.ListenPacket("rdma", net.JoinHostPort(host, "0"))
	if err != nil {
		log.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second)) // a lost datagram is not sent again
	if _, err := c.WriteTo([]byte("hello, datagrams"), srv.LocalAddr()); err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, c.MaxDatagramSize())
	n, from, err := c.ReadFrom(buf)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s (from the server: %v)\n", buf[:n], from.String() == srv.LocalAddr().String())

	// A datagram is one packet: larger ones are refused, not split.
	_, err = c.WriteTo(make([]byte, c.MaxDatagramSize()+1), srv.LocalAddr())
	fmt.Println("one byte over the limit:", errors.Is(err, rdma.ErrDatagramTooLarge))

	c.Close()
	srv.Close()
	<-done
	// Prints:
	// HELLO, DATAGRAMS (from the server: true)
	// one byte over the limit: true
}

// Datagrams without copies: Alloc and SendTo send a registered buffer as it
// is; Recv (or Messages) hands over the buffer the NIC wrote, which may be
// sent on as it is before its Release.
func ExamplePacketConn_Recv() {
	host := os.Getenv("RDMA_TEST_ADDR")
	if host == "" {
		host = "192.168.1.10"
	}
	a, err := rdma.ListenPacket("rdma", net.JoinHostPort(host, "0"))
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	b, err := rdma.ListenPacket("rdma", net.JoinHostPort(host, "0"))
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	buf, err := a.Alloc(5)
	if err != nil {
		log.Fatal(err)
	}
	copy(buf.Bytes(), "ping!")
	to := b.LocalAddr().(*rdma.Addr).AddrPort
	if err := a.SendTo(ctx, buf, to); err != nil { // buf is a's from here on
		log.Fatal(err)
	}

	d, err := b.Recv(ctx) // d.Buf: the receive buffer, exactly the payload long
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("b got %q\n", d.Bytes())
	if err := b.SendTo(ctx, d.Buf, d.From); err != nil { // back, without a copy
		log.Fatal(err)
	}

	back, err := a.Recv(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("a got %q back\n", back.Bytes())
	back.Release() // the buffer goes back to a's receive ring
	// Prints:
	// b got "ping!"
	// a got "ping!" back
}
