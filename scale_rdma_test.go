//go:build linux && cgo

package rdma

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
)

// envInt is the integer in the environment variable name, or def.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// procStatus returns a field of /proc/self/status (e.g. "VmRSS") in KiB.
func procStatus(t testing.TB, field string) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			return n
		}
	}
	return 0
}

func openFDs(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// echoServer accepts until ln is closed, echoing each connection.
func echoServer(ln *Listener) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.AcceptRDMA()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return &wg
}

// echo writes a short message on c and reads it back, within 10 s
// (scaled): a lost echo fails the test instead of hanging it.
func echo(c *Conn, i int) error {
	if err := c.SetDeadline(time.Now().Add(rdmatest.Scale(10 * time.Second))); err != nil {
		return err
	}
	defer c.SetDeadline(time.Time{})
	msg := []byte(fmt.Sprintf("hello %d", i))
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if string(got) != string(msg) {
		return fmt.Errorf("echo %q, want %q", got, msg)
	}
	return nil
}

// TestManyConnections: RDMA_TEST_CONNS (default 1,000) connections from one
// client to one server in one process, dialed 32 at a time: all echo, then
// sit idle while their memory is measured; all closed, the device is torn
// down and every QP, CQ, MR and cm_id is gone (checkLeaksAtEnd).
func TestManyConnections(t *testing.T) {
	n := envInt("RDMA_TEST_CONNS", 1000)
	checkLeaksAtEnd(t)
	// Handshakes queue behind each other in the emulated guest: give them time.
	ln := listenTest(t, &Config{Backlog: 256, HandshakeTimeout: rdmatest.Scale(5 * time.Second)})
	wg := echoServer(ln)
	defer wg.Wait()
	defer ln.Close()
	rssBefore, gBefore := procStatus(t, "VmRSS"), runtime.NumGoroutine()
	conns := make([]*Conn, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	start := time.Now()
	sem := make(chan struct{}, 32)
	errs := make(chan error, n)
	var dials sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		dials.Add(1)
		go func() {
			defer dials.Done()
			defer func() { <-sem }()
			d := Dialer{Timeout: rdmatest.Scale(30 * time.Second)}
			nc, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
			if err != nil {
				errs <- fmt.Errorf("dial %d: %w", i, err)
				return
			}
			conns[i] = nc.(*Conn)
			if err := echo(conns[i], i); err != nil {
				errs <- fmt.Errorf("conn %d: %w", i, err)
			}
		}()
	}
	dials.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	setup := time.Since(start)
	// Idle: what the connections pin, both ends being in this process.
	time.Sleep(rdmatest.Scale(100 * time.Millisecond))
	var ring uint64
	for _, c := range conns {
		ring += c.Stats().BufferBytes
	}
	dev := conns[0].dev
	pool := dev.Pool.Stats()
	rss, g := procStatus(t, "VmRSS"), runtime.NumGoroutine()
	perConn := float64(pool.InUseBytes) / float64(2*n)
	t.Logf("%d connections (both ends here: %d Conns) set up in %v (%.0f/s); idle: pool in use %d MiB = %.0f KiB per Conn "+
		"(its rings: client side %.0f KiB each); pool registered %d MiB; RSS %d MiB -> %d MiB; %d fds; %d pollers; "+
		"goroutines %d -> %d (%.2f per Conn besides the echo server's one per accepted Conn)",
		n, 2*n, setup, float64(n)/setup.Seconds(), pool.InUseBytes>>20, perConn/1024, float64(ring)/float64(n)/1024,
		pool.ArenaBytes>>20, rssBefore>>10, rss>>10, openFDs(t), len(dev.Pollers.Pollers()),
		gBefore, g, float64(g-gBefore-n)/float64(2*n))
	if perConn > idleBudget {
		t.Errorf("%.0f KiB pinned per idle connection, more than %d KiB", perConn/1024, idleBudget>>10)
	}
	// Every connection still works after the idle spell.
	for i, c := range conns {
		if err := echo(c, i); err != nil {
			t.Fatalf("conn %d after idling: %v", i, err)
		}
	}
}

// TestDialCycles: RDMA_TEST_CYCLES (default 400; make soak runs 10,000) sequential dial, echo,
// close cycles against one listener while a long-lived connection holds the
// device (so each cycle pays no device set-up): goroutines, open fds, QPs
// and the pool's bytes in use do not grow, nor its arenas beyond what a new
// peak of bytes in use needed.
func TestDialCycles(t *testing.T) {
	n := envInt("RDMA_TEST_CYCLES", 400)
	checkLeaksAtEnd(t)
	ln := listenTest(t, nil)
	wg := echoServer(ln)
	defer wg.Wait()
	defer ln.Close()
	keep, err := Dial("rdma", ln.Addr().String()) // holds the device
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	if err := echo(keep, -1); err != nil {
		t.Fatal(err)
	}
	type sample struct{ goroutines, fds, qps int }
	measure := func() sample {
		// Resources first: it settles (QPs waiting for TIMEWAIT_EXIT go to
		// the pool, with their ids, channels and event loops); pooled QPs
		// are owned by the device, not leaked.
		qps := rdmatest.Resources(t)["qp"] - pooledQPs()
		return sample{rdmatest.Goroutines(), openFDs(t), qps}
	}
	cycle := func(i int) {
		c, err := Dial("rdma", ln.Addr().String())
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		if err := echo(c, i); err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("cycle %d: close: %v", i, err)
		}
	}
	settle := func() {
		// The server side of the last cycle closes after reading our end.
		time.Sleep(rdmatest.Scale(50 * time.Millisecond))
	}
	warm := min(n/10, 100)
	for i := range warm {
		cycle(i)
	}
	settle()
	before, poolBefore := measure(), keep.dev.Pool.Stats()
	start := time.Now()
	for i := warm; i < n; i++ {
		cycle(i)
	}
	el := time.Since(start)
	// The server side of the last cycles closes after reading our end: give
	// it until a deadline to come back to what the warm-up left, rather
	// than a fixed pause (the guest is slow and shared).
	after, poolAfter := measure(), keep.dev.Pool.Stats()
	for deadline := time.Now().Add(rdmatest.Scale(5 * time.Second)); time.Now().Before(deadline); {
		if after.goroutines <= before.goroutines && after.fds <= before.fds && after.qps <= before.qps &&
			poolAfter.InUseBytes <= poolBefore.InUseBytes {
			break
		}
		time.Sleep(rdmatest.Scale(20 * time.Millisecond))
		after, poolAfter = measure(), keep.dev.Pool.Stats()
	}
	t.Logf("%d cycles in %v: %.1f ms per dial+echo+close (%.0f/s); after %d: %+v, pool in use %d KiB, registered %d MiB; after %d: %+v, pool in use %d KiB, registered %d MiB",
		n-warm, el, el.Seconds()*1000/float64(n-warm), float64(n-warm)/el.Seconds(),
		warm, before, poolBefore.InUseBytes>>10, poolBefore.ArenaBytes>>20, n, after, poolAfter.InUseBytes>>10, poolAfter.ArenaBytes>>20)
	// A new arena is no leak if the buffers in use reached a new peak
	// during the cycles (connections whose server side had not closed yet
	// overlapping the next ones: the pool keeps arenas it mapped); an arena
	// mapped with no new peak is space the pool lost.
	arenaLost := poolAfter.ArenaBytes > poolBefore.ArenaBytes && poolAfter.HighWaterBytes <= poolBefore.HighWaterBytes
	if poolAfter.ArenaBytes > poolBefore.ArenaBytes && !arenaLost {
		t.Logf("the pool mapped %d KiB more while the buffers in use peaked at %d KiB (%d KiB before the cycles)",
			(poolAfter.ArenaBytes-poolBefore.ArenaBytes)>>10, poolAfter.HighWaterBytes>>10, poolBefore.HighWaterBytes>>10)
	}
	if after.goroutines > before.goroutines || after.fds > before.fds || after.qps > before.qps ||
		poolAfter.InUseBytes > poolBefore.InUseBytes || arenaLost {
		t.Errorf("resources grew over %d cycles: %+v -> %+v, pool in use %d -> %d, registered %d -> %d (buffers in use peaked at %d, %d before)", n-warm,
			before, after, poolBefore.InUseBytes, poolAfter.InUseBytes, poolBefore.ArenaBytes, poolAfter.ArenaBytes,
			poolAfter.HighWaterBytes, poolBefore.HighWaterBytes)
	}
}
