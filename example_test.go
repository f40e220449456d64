package rdma_test

// These examples need an RDMA device, so they carry no "Output:" comment:
// `go test` compiles them everywhere and runs none. Each one ends with a
// "Prints:" comment instead; TestExamples (example_rdma_test.go) runs every
// example inside Soft-RoCE and checks that it prints exactly that.
//
// Each example listens on the IP in RDMA_TEST_ADDR (scripts/softroce sets it
// to its Soft-RoCE address) or else on 192.168.1.10: replace it with an IP of
// one of your RDMA-capable netdevs (`rdma link show` lists them).

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/buffer"
)

// An echo server: every accepted connection is a net.Conn, echoed by
// io.Copy in a goroutine of its own; the client is a net.Conn too.
func ExampleListen() {
	host := os.Getenv("RDMA_TEST_ADDR") // an IP of an RDMA-capable netdev
	if host == "" {
		host = "192.168.1.10"
	}
	ln, err := rdma.Listen("rdma", net.JoinHostPort(host, "0")) // port 0: a free port
	if err != nil {
		log.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return // net.ErrClosed once ln is closed
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				io.Copy(c, c) // until the client closes: Read returns io.EOF
			}()
		}
	}()

	c, err := rdma.Dial("rdma", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintln(c, "hello, rdma")
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print("echo: ", line)

	c.Close()  // the server reads io.EOF, and its goroutine ends
	ln.Close() // Accept returns net.ErrClosed; accepted connections stay open
	wg.Wait()
	// Prints:
	// echo: hello, rdma
}

// A request and its answer over a stream: a Write of any size, CloseWrite
// to mark the request's end (the server reads io.EOF after its last byte),
// then the answer until the server closes.
func ExampleDial() {
	host := os.Getenv("RDMA_TEST_ADDR") // an IP of an RDMA-capable netdev
	if host == "" {
		host = "192.168.1.10"
	}
	ln, err := rdma.Listen("rdma", net.JoinHostPort(host, "0"))
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	served := make(chan struct{})
	go func() { // the server: read the whole request, answer with its length
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		defer c.Close() // delivers the answer, then the client reads io.EOF
		req, err := io.ReadAll(c)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Fprintf(c, "%d bytes received", len(req))
	}()

	c, err := rdma.Dial("rdma", ln.Addr().String()) // a *rdma.Conn, which is a net.Conn
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	// Split into the peer's receive buffers (32 KiB by default) and
	// pipelined; Write returns once every byte is in a posted send buffer.
	if _, err := c.Write(bytes.Repeat([]byte("rdma"), 50000)); err != nil {
		log.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		log.Fatal(err)
	}
	answer, err := io.ReadAll(c)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(answer))
	<-served
	// Prints:
	// 200000 bytes received
}

// net/http over RDMA: http.Serve takes the Listener, and the Dialer plugs
// into http.Transport (it takes the "tcp" that net/http asks for to mean
// "rdma").
func ExampleDialer_DialContext() {
	host := os.Getenv("RDMA_TEST_ADDR") // an IP of an RDMA-capable netdev
	if host == "" {
		host = "192.168.1.10"
	}
	ln, err := rdma.Listen("rdma", net.JoinHostPort(host, "0"))
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello, %s", r.URL.Path[1:])
	})}
	go srv.Serve(ln)
	defer srv.Close() // closes ln and the server's connections

	d := rdma.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext}
	defer tr.CloseIdleConnections() // the client's connections
	client := &http.Client{Transport: tr}
	resp, err := client.Get("http://" + ln.Addr().String() + "/gopher")
	if err != nil {
		log.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.Status, string(body))
	// Prints:
	// 200 OK hello, gopher
}

// Both sides tuned by a Config: here larger buffers (fewer, larger sends for
// a bulk stream), and fewer of them. A Write moves in chunks of the smaller
// BufferSize of the two sides, and RecvBuffers is how many chunks or
// messages the peer may have in flight, so both sides set them.
func ExampleListenConfig() {
	host := os.Getenv("RDMA_TEST_ADDR") // an IP of an RDMA-capable netdev
	if host == "" {
		host = "192.168.1.10"
	}
	cfg := rdma.Config{BufferSize: 256 << 10, RecvBuffers: 16} // zero fields take their defaults
	lc := rdma.ListenConfig{Config: cfg}
	ln, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(host, "0"))
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	received := make(chan int64)
	go func() {
		c, err := ln.AcceptRDMA() // Accept, returning the *rdma.Conn
		if err != nil {
			log.Fatal(err)
		}
		defer c.Close()
		n, err := io.Copy(io.Discard, c)
		if err != nil {
			log.Fatal(err)
		}
		received <- n
	}()

	d := rdma.Dialer{Config: cfg, Timeout: 5 * time.Second}
	c, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.Write(make([]byte, 4<<20)); err != nil {
		log.Fatal(err)
	}
	c.Close() // delivers every byte written (within Config.CloseTimeout), then io.EOF
	fmt.Println(<-received, "bytes received")
	// Prints:
	// 4194304 bytes received
}

// The message view: whole messages sent from registered memory and
// received in the buffer the NIC wrote into, without a copy on either side.
func ExampleConn_Send() {
	host := os.Getenv("RDMA_TEST_ADDR") // an IP of an RDMA-capable netdev
	if host == "" {
		host = "192.168.1.10"
	}
	ln, err := rdma.Listen("rdma", net.JoinHostPort(host, "0"))
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan *rdma.Conn)
	go func() {
		s, err := ln.AcceptRDMA()
		if err != nil {
			log.Fatal(err)
		}
		accepted <- s
	}()
	c, err := rdma.Dial("rdma", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	s := <-accepted
	defer s.Close()
	ctx := context.Background()

	// Sender: fill a registered buffer from the connection's pool and send
	// it. The Buf is the connection's from Send on, whatever the outcome:
	// do not touch or Release it afterwards.
	for _, text := range []string{"first", "second"} {
		b, err := c.Alloc(len(text))
		if err != nil {
			log.Fatal(err)
		}
		copy(b.Bytes(), text)
		if err := c.Send(ctx, b); err != nil {
			log.Fatal(err)
		}
	}
	// A message larger than the peer's receive buffers (32 KiB by default)
	// is read by the peer straight from this Buf with RDMA READs, and
	// still arrives whole. c.MaxMessageSize() is the limit.
	big, err := c.Alloc(1 << 20)
	if err != nil {
		log.Fatal(err)
	}
	copy(big.Bytes(), bytes.Repeat([]byte("big!"), 1<<18))
	if err := c.Send(ctx, big); err != nil {
		log.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil { // after the last message the receiver's Recv returns io.EOF
		log.Fatal(err)
	}

	// Receiver: each message is valid until its Release, which hands the
	// receive buffer back to the connection (and the sender its credit).
	for {
		m, err := s.Recv(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%d bytes: %.8s\n", m.Len(), m.Bytes())
		m.Release()
	}
	// Prints:
	// 5 bytes: first
	// 6 bytes: second
	// 1048576 bytes: big!big!
}

// One-sided access: the server exports a buffer and sends its descriptor in
// a message; the client writes into that memory with RDMA, and the
// immediate value it attaches tells the server.
func ExampleConn_Export() {
	host := os.Getenv("RDMA_TEST_ADDR") // an IP of an RDMA-capable netdev
	if host == "" {
		host = "192.168.1.10"
	}
	ln, err := rdma.Listen("rdma", net.JoinHostPort(host, "0"))
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan *rdma.Conn)
	go func() {
		s, err := ln.AcceptRDMA()
		if err != nil {
			log.Fatal(err)
		}
		accepted <- s
	}()
	c, err := rdma.Dial("rdma", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	s := <-accepted
	defer s.Close()
	ctx := context.Background()

	// Server: export 4 KiB for remote writes; nothing else of its memory is
	// reachable. The descriptor (16 bytes) travels in a message.
	mem, err := s.Alloc(4096)
	if err != nil {
		log.Fatal(err)
	}
	defer mem.Release()
	exp, err := s.Export(mem, rdma.RemoteWrite)
	if err != nil {
		log.Fatal(err)
	}
	defer exp.Close() // ends remote access
	desc, err := s.Alloc(64)
	if err != nil {
		log.Fatal(err)
	}
	desc.SetLen(len(exp.Remote().AppendTo(desc.Bytes()[:0])))
	if err := s.Send(ctx, desc); err != nil {
		log.Fatal(err)
	}

	// Client: decode the descriptor and write at offset 100 of the
	// server's buffer, with immediate value 7.
	m, err := c.Recv(ctx)
	if err != nil {
		log.Fatal(err)
	}
	remote, err := rdma.ParseRemoteBuf(m.Bytes())
	m.Release()
	if err != nil {
		log.Fatal(err)
	}
	local, err := c.Alloc(len("written by the peer"))
	if err != nil {
		log.Fatal(err)
	}
	copy(local.Bytes(), "written by the peer")
	// Returns once the NIC reports the bytes placed in the server's memory.
	if err := c.WriteRemoteImm(ctx, local, remote, 100, 7); err != nil {
		log.Fatal(err)
	}
	local.Release()

	// Server: when the notification arrives, the bytes are in place.
	n, err := s.RecvNotification(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("imm %d, %d bytes: %s\n", n.Imm, n.Len, mem.Bytes()[100:100+n.Len])
	n.Release() // a notification holds a receive buffer, as a message does
	// Prints:
	// imm 7, 19 bytes: written by the peer
}

// Asynchronous one-sided writes: PostWriteRemote returns at once, and each
// operation's end arrives on Completions() with the id given to it.
func ExampleConn_PostWriteRemote() {
	host := os.Getenv("RDMA_TEST_ADDR") // an IP of an RDMA-capable netdev
	if host == "" {
		host = "192.168.1.10"
	}
	ln, err := rdma.Listen("rdma", net.JoinHostPort(host, "0"))
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan *rdma.Conn)
	go func() {
		s, err := ln.AcceptRDMA()
		if err != nil {
			log.Fatal(err)
		}
		accepted <- s
	}()
	c, err := rdma.Dial("rdma", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	s := <-accepted
	defer s.Close()
	ctx := context.Background()

	// The server exports 4 slots of 8 bytes for writing and reading. Both
	// ends are in this process, so the client takes the descriptor as it is
	// (ExampleConn_Export sends it to the peer in a message).
	mem, err := s.Alloc(32)
	if err != nil {
		log.Fatal(err)
	}
	defer mem.Release()
	exp, err := s.Export(mem, rdma.RemoteWrite|rdma.RemoteRead)
	if err != nil {
		log.Fatal(err)
	}
	defer exp.Close()
	remote := exp.Remote()

	// The client posts four writes, one per slot, then collects their ends.
	// A local Buf's bytes must stay as they are until its write has ended.
	var locals []buffer.Buf
	for id := uint64(0); id < 4; id++ {
		b, err := c.Alloc(8)
		if err != nil {
			log.Fatal(err)
		}
		copy(b.Bytes(), fmt.Sprintf("[slot %d]", id))
		if err := c.PostWriteRemote(b, remote, 8*id, id); err != nil {
			log.Fatal(err)
		}
		locals = append(locals, b)
	}
	for range locals {
		done := <-c.Completions()
		if done.Err != nil {
			log.Fatalf("write %d: %v", done.ID, done.Err)
		}
	}
	for _, b := range locals {
		b.Release()
	}

	// Read the whole export back: what the writes left there.
	back, err := c.Alloc(32)
	if err != nil {
		log.Fatal(err)
	}
	defer back.Release()
	if err := c.ReadRemote(ctx, back, remote, 0); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s\n", back.Bytes())
	// Prints:
	// [slot 0][slot 1][slot 2][slot 3]
}

// Errors are *net.OpError, tested with errors.Is as for net's: here a port
// nobody listens on, an address on no RDMA netdev and a read deadline.
func Example_errors() {
	host := os.Getenv("RDMA_TEST_ADDR") // an IP of an RDMA-capable netdev
	if host == "" {
		host = "192.168.1.10"
	}
	_, err := rdma.Dial("rdma", net.JoinHostPort(host, "1"))
	var oe *net.OpError
	fmt.Println("dial port 1:", errors.As(err, &oe), errors.Is(err, syscall.ECONNREFUSED))

	// 192.0.2.1 (TEST-NET-1) is on no interface of this machine. On a
	// machine without an RDMA device the error is rdma.ErrNoDevice. The
	// sentinels' text says what to do.
	_, err = rdma.Listen("rdma", "192.0.2.1:0")
	fmt.Println("listen on 192.0.2.1:", errors.Is(err, rdma.ErrNotRDMAAddress))
	fmt.Println(err)

	ln, err := rdma.Listen("rdma", net.JoinHostPort(host, "0"))
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		s, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		s.Close() // without writing a byte
	}()
	c, err := rdma.Dial("rdma", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(-time.Second)) // already passed
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	fmt.Println("read past its deadline:", errors.As(err, &ne) && ne.Timeout(), errors.Is(err, os.ErrDeadlineExceeded))
	c.Close()
	_, err = c.Read(make([]byte, 1))
	fmt.Println("read after Close:", errors.Is(err, net.ErrClosed))
	<-served
	// Prints:
	// dial port 1: true true
	// listen on 192.0.2.1: true
	// listen rdma 192.0.2.1:0: address is not on an RDMA-capable network device (use an IP of a netdev that `rdma link show` lists): rdma_bind_addr 192.0.2.1:0: cannot assign requested address
	// read past its deadline: true true
	// read after Close: true
}

// Process-wide counters: ReadMetrics is a snapshot of what every connection
// of the process moved, in total and by device, open connections and closed
// ones alike; the difference of two snapshots is what happened in between.
// metrics/rdmaexpvar and metrics/rdmaprom publish the same snapshot.
func ExampleReadMetrics() {
	host := os.Getenv("RDMA_TEST_ADDR") // an IP of an RDMA-capable netdev
	if host == "" {
		host = "192.168.1.10"
	}
	ln, err := rdma.Listen("rdma", net.JoinHostPort(host, "0"))
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	served := make(chan struct{})
	go func() { // an echo server
		defer close(served)
		s, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close()
		io.Copy(s, s)
	}()

	before := rdma.ReadMetrics()
	c, err := rdma.Dial("rdma", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	msg := bytes.Repeat([]byte("rdma"), 25000)
	if _, err := c.Write(msg); err != nil {
		log.Fatal(err)
	}
	if _, err := io.ReadFull(c, msg); err != nil { // the echo
		log.Fatal(err)
	}
	after := rdma.ReadMetrics()
	// Both ends are in this process: each counts what it sent and received.
	fmt.Println("connections established:", after.ConnsTotal-before.ConnsTotal)
	fmt.Println("bytes sent:", after.BytesSent-before.BytesSent)
	fmt.Println("bytes received:", after.BytesReceived-before.BytesReceived)
	// By device (Soft-RoCE's is rxe0): its share of the counters, and the
	// hardware counters its driver keeps in sysfs, which count every user
	// of the device (rdma.DeviceCounters reads them without a connection;
	// some drivers, siw among them, keep none).
	withPorts := 0
	for _, d := range after.Devices {
		if d.PortsError == "" && len(d.Ports) > 0 {
			withPorts++
		}
	}
	fmt.Println("devices with hardware counters:", withPorts)
	c.Close()
	<-served
	// Prints:
	// connections established: 2
	// bytes sent: 200000
	// bytes received: 200000
	// devices with hardware counters: 1
}

// A connection's queue pair as the device holds it (ibv_query_qp): its
// state, the path MTU rdma_cm resolved, and the transport settings of this
// side's Config, rounded as the device keeps them. For debugging: each call
// is a system call. On an iWARP device (siw) the retry count and the ACK
// timeout print 0 and 0s (n=0): TCP retransmits there.
func ExampleConn_QPInfo() {
	host := os.Getenv("RDMA_TEST_ADDR") // an IP of an RDMA-capable netdev
	if host == "" {
		host = "192.168.1.10"
	}
	ln, err := rdma.Listen("rdma", net.JoinHostPort(host, "0"))
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		s, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		io.Copy(io.Discard, s) // until the dialer closes
		s.Close()
	}()

	// 4.096 µs x 2^n: 100 ms rounds up to n = 15.
	d := rdma.Dialer{Config: rdma.Config{AckTimeout: 100 * time.Millisecond, RetryCount: 3}}
	nc, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	c := nc.(*rdma.Conn)
	info, err := c.QPInfo()
	if err != nil {
		log.Fatal(err)
	}
	// info.String() is all of it on one line, for a log.
	fmt.Println("state:", info.State)
	fmt.Println("path MTU > 0:", info.PathMTU > 0)
	fmt.Println("retry count:", info.RetryCount)
	fmt.Printf("ACK timeout: %v (n=%d)\n", info.AckTimeout, info.TimeoutExp)
	c.Close()
	_, err = c.QPInfo()
	fmt.Println("after Close:", errors.Is(err, net.ErrClosed))
	<-served
	// Prints:
	// state: RTS
	// path MTU > 0: true
	// retry count: 3
	// ACK timeout: 134.217728ms (n=15)
	// after Close: true
}
