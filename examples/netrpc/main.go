// Command netrpc serves the standard library's net/rpc over RDMA and calls
// it: many small calls in flight at once, then large arguments.
//
//	netrpc -listen 192.168.1.10:7473             # server
//	netrpc -connect 192.168.1.10:7473 -calls 1000 # client
//
// With neither flag it runs both in one process on -addr (default
// $RDMA_TEST_ADDR, which scripts/softroce sets) and exits 0 if every reply
// was right.
package main

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"net/rpc"
	"os"
	"sync"
	"time"

	"github.com/verbline/rdma"
)

// Blob is the service: net/rpc calls its methods "Blob.Echo" and "Blob.Digest".
type Blob struct{}

// Echo replies with its argument.
func (Blob) Echo(args []byte, reply *[]byte) error {
	*reply = args
	return nil
}

// Digest replies with the SHA-256 of its argument.
func (Blob) Digest(args []byte, reply *[sha256.Size]byte) error {
	*reply = sha256.Sum256(args)
	return nil
}

// newServer returns an rpc.Server with Blob registered.
func newServer() *rpc.Server {
	srv := rpc.NewServer()
	if err := srv.Register(Blob{}); err != nil {
		panic(err) // Blob's method set is fixed: this cannot fail
	}
	return srv
}

// serve accepts connections on ln and serves each until its client hangs up;
// it returns when ln is closed, after every connection's ServeConn has
// returned. (rpc.Server.Accept would do the same without the wait, and log the
// listener's close as an error.)
func serve(srv *rpc.Server, ln net.Listener) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		wg.Go(func() { srv.ServeConn(c) }) // closes c when the client hangs up
	}
}

// dial returns a net/rpc client over an RDMA connection to addr.
func dial(addr string) (*rpc.Client, error) {
	c, err := rdma.Dial("rdma", addr)
	if err != nil {
		return nil, err
	}
	return rpc.NewClient(c), nil
}

func main() {
	listen := flag.String("listen", "", "serve on this address (host:port)")
	connect := flag.String("connect", "", "call a server at this address (host:port)")
	addr := flag.String("addr", os.Getenv("RDMA_TEST_ADDR"), "IP of an RDMA netdev, for the all-in-one mode")
	calls := flag.Int("calls", 1000, "small calls, 8 in flight at a time")
	large := flag.Int("large", 4<<20, "size of the large argument")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("netrpc example: ")

	switch {
	case *listen != "":
		ln, err := rdma.Listen("rdma", *listen)
		if err != nil {
			log.Fatal(err)
		}
		log.Printf("serving Blob on %s", ln.Addr())
		serve(newServer(), ln)
	case *connect != "":
		if err := client(*connect, *calls, *large); err != nil {
			log.Fatal(err)
		}
	default:
		if *addr == "" {
			log.Fatal("no address: give -addr with an IP of an RDMA netdev (rdma link show lists them), or set RDMA_TEST_ADDR (scripts/softroce run sets it)")
		}
		ln, err := rdma.Listen("rdma", net.JoinHostPort(*addr, "0"))
		if err != nil {
			log.Fatal(err)
		}
		done := make(chan struct{})
		go func() { serve(newServer(), ln); close(done) }()
		err = client(ln.Addr().String(), *calls, *large)
		ln.Close()
		<-done // the client closed its connection: every ServeConn has returned
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("ok")
	}
}

func client(addr string, calls, large int) error {
	c, err := dial(addr)
	if err != nil {
		return err
	}
	defer c.Close()

	start := time.Now()
	const inFlight = 8
	errs := make(chan error, inFlight)
	for g := range inFlight {
		go func() {
			for i := g; i < calls; i += inFlight {
				args := fmt.Appendf(nil, "call %d", i)
				var reply []byte
				if err := c.Call("Blob.Echo", args, &reply); err != nil {
					errs <- fmt.Errorf("Blob.Echo call %d: %w", i, err)
					return
				}
				if !bytes.Equal(reply, args) {
					errs <- fmt.Errorf("Blob.Echo call %d: got %q, want %q", i, reply, args)
					return
				}
			}
			errs <- nil
		}()
	}
	for range inFlight {
		err = errors.Join(err, <-errs)
	}
	if err != nil {
		return err
	}
	el := time.Since(start)
	fmt.Printf("%d Blob.Echo calls to %s, %d in flight: %v, %.0f calls/s\n", calls, addr, inFlight, el.Round(time.Millisecond), float64(calls)/el.Seconds())

	big := make([]byte, large)
	rand.NewChaCha8([32]byte{'r', 'p', 'c'}).Read(big)
	start = time.Now()
	var sum [sha256.Size]byte
	if err := c.Call("Blob.Digest", big, &sum); err != nil {
		return fmt.Errorf("Blob.Digest of %d bytes: %w", large, err)
	}
	if sum != sha256.Sum256(big) {
		return fmt.Errorf("Blob.Digest of %d bytes: the server's digest differs from the client's", large)
	}
	var back []byte
	if err := c.Call("Blob.Echo", big, &back); err != nil {
		return fmt.Errorf("Blob.Echo of %d bytes: %w", large, err)
	}
	if !bytes.Equal(back, big) {
		return fmt.Errorf("Blob.Echo of %d bytes: the reply differs", large)
	}
	fmt.Printf("%.1f MiB argument digested, then echoed and checked: %v\n", float64(large)/(1<<20), time.Since(start).Round(time.Millisecond))
	return nil
}
