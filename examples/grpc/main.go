// Command grpc serves a grpc-go service over RDMA and calls it: a unary
// method and a bidirectional stream, with no protoc and no generated code
// (service.go defines the service by hand, with a codec for raw bytes).
//
//	grpc -listen 192.168.1.10:7472                 # server
//	grpc -connect 192.168.1.10:7472 -calls 1000    # client: unary calls, then a stream
//
// With neither flag it runs both in one process on -addr (default
// $RDMA_TEST_ADDR, which scripts/softroce sets), stops the server gracefully
// and exits 0 if every reply was right.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"slices"
	"time"

	"github.com/verbline/rdma"
)

func main() {
	listen := flag.String("listen", "", "serve on this address (host:port)")
	connect := flag.String("connect", "", "call a server at this address (host:port)")
	addr := flag.String("addr", os.Getenv("RDMA_TEST_ADDR"), "IP of an RDMA netdev, for the all-in-one mode")
	calls := flag.Int("calls", 500, "unary calls")
	stream := flag.Int("stream", 8<<20, "bytes to send on the bidirectional stream (messages of 1 B to 1 MiB)")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("grpc example: ")

	switch {
	case *listen != "":
		ln, err := rdma.Listen("rdma", *listen)
		if err != nil {
			log.Fatal(err)
		}
		srv := newServer()
		go func() {
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, os.Interrupt)
			<-sig
			srv.GracefulStop()
		}()
		log.Printf("serving %s on %s (interrupt to stop)", serviceName, ln.Addr())
		if err := srv.Serve(ln); err != nil {
			log.Fatal(err)
		}
	case *connect != "":
		if err := client(*connect, *calls, *stream); err != nil {
			log.Fatal(err)
		}
	default:
		if *addr == "" {
			log.Fatal(errNoAddr)
		}
		if err := allInOne(*addr, *calls, *stream); err != nil {
			log.Fatal(err)
		}
		fmt.Println("ok")
	}
}

// allInOne serves on a free port of ip, runs the client against it, then
// stops the server gracefully.
func allInOne(ip string, calls, stream int) error {
	ln, err := rdma.Listen("rdma", net.JoinHostPort(ip, "0"))
	if err != nil {
		return err
	}
	srv := newServer()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	err = client(ln.Addr().String(), calls, stream)
	start := time.Now()
	srv.GracefulStop() // closes ln, waits for the connection to finish
	if serr := <-served; err == nil && serr != nil {
		err = fmt.Errorf("serve: %w", serr)
	}
	if err == nil {
		fmt.Printf("server stopped gracefully in %v\n", time.Since(start).Round(time.Millisecond))
	}
	return err
}

func client(addr string, calls, stream int) error {
	var d rdma.Dialer
	cc, err := newClient(addr, &d)
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	rtts := make([]time.Duration, 0, calls)
	for i := range calls {
		req := fmt.Appendf(nil, "call %d", i)
		start := time.Now()
		resp, err := echo(ctx, cc, req)
		if err != nil {
			return fmt.Errorf("Echo call %d to %s: %w", i, addr, err)
		}
		rtts = append(rtts, time.Since(start))
		if string(resp) != string(req) {
			return fmt.Errorf("Echo call %d: got %q, want %q", i, resp, req)
		}
	}
	if calls > 0 {
		slices.Sort(rtts)
		fmt.Printf("unary Echo x %d to %s: median %v, p99 %v (the first includes connecting)\n",
			calls, addr, rtts[calls/2].Round(time.Microsecond), rtts[calls*99/100].Round(time.Microsecond))
	}

	// Messages of 1 B to 1 MiB, random sizes and contents, stream bytes in all.
	src := rand.NewChaCha8([32]byte{'g', 'r', 'p', 'c'})
	r := rand.New(src)
	var msgs [][]byte
	for total := 0; total < stream; {
		m := make([]byte, min(1+r.IntN(1<<20), stream-total))
		src.Read(m)
		msgs = append(msgs, m)
		total += len(m)
	}
	start := time.Now()
	if err := exchange(ctx, cc, msgs); err != nil {
		return fmt.Errorf("Exchange with %s: %w", addr, err)
	}
	el := time.Since(start)
	fmt.Printf("bidi Exchange: %d messages, %.1f MiB echoed and checked in %v, %.1f MB/s each way (MB = 10^6 B)\n",
		len(msgs), float64(stream)/(1<<20), el.Round(time.Millisecond), float64(stream)/el.Seconds()/1e6)
	return nil
}
