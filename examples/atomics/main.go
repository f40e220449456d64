// Command atomics shows RDMA atomics on exported memory: the server exports
// three 8-byte words to two clients, each on its own connection; the
// clients count with FetchAdd on the first word, and take turns holding a
// lease lock on the second (CompareAndSwap of 0 to their lease, and back)
// while they update the third with a plain ReadRemote and WriteRemote.
// Neither the server's CPU nor any message takes part in the contention.
// It checks its own result: no add and no locked update is lost.
//
//	atomics -addr 192.168.1.10
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"sync"
	"time"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/buffer"
)

// The exported words.
const (
	counterOff = 0  // FetchAdd'ed by both clients
	lockOff    = 8  // 0, or the holder's lease: client id << 48 | expiry in ms since start
	dataOff    = 16 // updated only under the lock, with plain RDMA READ and WRITE
	words      = 3
)

var start = time.Now()

func main() {
	addr := flag.String("addr", os.Getenv("RDMA_TEST_ADDR"), "IP of an RDMA netdev")
	adds := flag.Int("adds", 2000, "FetchAdds per client")
	locked := flag.Int("locked", 200, "locked updates per client")
	flag.Parse()
	if *addr == "" {
		log.Fatal("give -addr (an IP of an RDMA netdev)")
	}
	ln, err := rdma.Listen("rdma", net.JoinHostPort(*addr, "0"))
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()

	// The server: one buffer, exported on each client's connection.
	const clients = 2
	ready := make(chan error, 1)
	var shared buffer.Buf
	var conns []*rdma.Conn
	go func() {
		var err error
		defer func() { ready <- err }()
		for i := 0; i < clients; i++ {
			var c *rdma.Conn
			if c, err = ln.AcceptRDMA(); err != nil {
				return
			}
			conns = append(conns, c)
			if i == 0 {
				if shared, err = c.Alloc(8 * words); err != nil {
					return
				}
				clear(shared.Bytes())
			}
			var exp *rdma.Export
			// Atomics, and READ and WRITE for the word kept under the lock.
			if exp, err = c.Export(shared, rdma.RemoteAtomic|rdma.RemoteRead|rdma.RemoteWrite); err != nil {
				return
			}
			defer exp.Close()
			var desc buffer.Buf
			if desc, err = c.Alloc(64); err != nil {
				return
			}
			desc.SetLen(len(exp.Remote().AppendTo(desc.Bytes()[:0])))
			if err = c.Send(context.Background(), desc); err != nil {
				return
			}
		}
		// Wait until both clients are done (each closes its connection).
		for _, c := range conns {
			if _, rerr := c.Recv(context.Background()); rerr == nil {
				err = errors.New("unexpected message from a client")
				return
			}
		}
	}()

	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for id := 1; id <= clients; id++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- client(ln.Addr().String(), uint64(id), *adds, *locked)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			log.Fatal(err)
		}
	}
	if err := <-ready; err != nil {
		log.Fatal(err)
	}
	defer shared.Release()
	for _, c := range conns {
		defer c.Close()
	}
	w := func(off int) uint64 { return binary.NativeEndian.Uint64(shared.Bytes()[off:]) }
	fmt.Printf("server: counter %d (want %d), locked updates %d (want %d), lock %d (want 0)\n",
		w(counterOff), clients**adds, w(dataOff), clients**locked, w(lockOff))
	if w(counterOff) != uint64(clients**adds) || w(dataOff) != uint64(clients**locked) || w(lockOff) != 0 {
		log.Fatal("an update was lost")
	}
}

func client(addr string, id uint64, adds, locked int) error {
	ctx := context.Background()
	c, err := rdma.Dial("rdma", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	msg, err := c.Recv(ctx) // the server's descriptor
	if err != nil {
		return err
	}
	remote, err := rdma.ParseRemoteBuf(msg.Bytes())
	msg.Release()
	if err != nil {
		return err
	}

	// A shared counter: each FetchAdd returns the value it added to, so
	// every client gets distinct numbers (sequence numbers, ticket ids).
	t0 := time.Now()
	for i := 0; i < adds; i++ {
		if _, err := c.FetchAdd(ctx, remote, counterOff, 1); err != nil {
			return err
		}
	}
	fmt.Printf("client %d: %d FetchAdds, %v each\n", id, adds, (time.Since(t0) / time.Duration(adds)).Round(time.Microsecond))

	// A lease lock: the holder's id and an expiry; a holder that vanished
	// loses the lock once its lease expires (the next one swaps it out).
	local, err := c.Alloc(8)
	if err != nil {
		return err
	}
	defer local.Release()
	const lease = 2 * time.Second
	var retries int
	for i := 0; i < locked; i++ {
		mine, err := acquire(ctx, c, remote, id, lease, &retries)
		if err != nil {
			return err
		}
		if err := c.ReadRemote(ctx, local, remote, dataOff); err != nil {
			return err
		}
		b := local.Bytes()
		binary.NativeEndian.PutUint64(b, binary.NativeEndian.Uint64(b)+1)
		if err := c.WriteRemote(ctx, local, remote, dataOff); err != nil {
			return err
		}
		if old, err := c.CompareAndSwap(ctx, remote, lockOff, mine, 0); err != nil {
			return err
		} else if old != mine {
			return fmt.Errorf("client %d: the lock was taken from it (lease expired?)", id)
		}
	}
	fmt.Printf("client %d: %d updates under the lock, %d failed tries to take it\n", id, locked, retries)
	return nil
}

// acquire takes the lock: it swaps 0, or an expired lease, for its own
// lease and returns it.
func acquire(ctx context.Context, c *rdma.Conn, remote rdma.RemoteBuf, id uint64, lease time.Duration, retries *int) (uint64, error) {
	expect := uint64(0)
	for {
		mine := id<<48 | uint64((time.Since(start) + lease).Milliseconds())
		old, err := c.CompareAndSwap(ctx, remote, lockOff, expect, mine)
		if err != nil {
			return 0, err
		}
		if old == expect {
			return mine, nil
		}
		*retries++
		if expiry := old & (1<<48 - 1); time.Duration(expiry)*time.Millisecond < time.Since(start) {
			expect = old // expired: take it over from its holder
		} else {
			expect = 0
		}
	}
}
