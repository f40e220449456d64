//go:build linux && cgo

package rdma

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/rdmatest/devleaks"
	"github.com/verbline/rdma/internal/testhooks"
	"golang.org/x/net/nettest"
)

// listenTest listens on the test device's address with a free port.
func listenTest(t testing.TB, cfg *Config) *Listener {
	t.Helper()
	env := rdmatest.Require(t)
	lc := ListenConfig{}
	if cfg != nil {
		lc.Config = *cfg
	}
	ln, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(env.Addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func init() {
	testhooks.TrackAllocations.Store(true) // leak reports name where each buffer was allocated
	// Pooled QPs and lingering devices are owned, not leaked: rdmatest's
	// counts run settleDevices first (qpreuse.go registers it).
}

// checkLeaksAtEnd makes t, once it and its deferred closes are done, wait
// for every device to be torn down and for the process's RDMA objects and
// goroutines to come back to what they were now (devleaks.CheckAtEnd).
func checkLeaksAtEnd(t testing.TB) {
	t.Helper()
	devleaks.CheckAtEnd(t)
}

// forceTeardownUnusedDevices tears down every device no connection uses,
// whatever buffers of its pool are still out (devleaks.ForceTeardownUnused).
func forceTeardownUnusedDevices(t testing.TB) { devleaks.ForceTeardownUnused(t) }

// connPair returns both ends of one connection; the test checks for leaks
// at its end (checkLeaksAtEnd).
func connPair(t testing.TB, cfg *Config) (client, server *Conn, ln *Listener) {
	t.Helper()
	checkLeaksAtEnd(t)
	return dialPair(t, cfg)
}

// dialPair is connPair without its leak check, for a test that makes many
// pairs and checks once for all of them.
func dialPair(t testing.TB, cfg *Config) (client, server *Conn, ln *Listener) {
	t.Helper()
	ln = listenTest(t, cfg)
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.AcceptRDMA()
		ch <- res{c, err}
	}()
	d := Dialer{Timeout: rdmatest.Scale(10 * time.Second)}
	if cfg != nil {
		d.Config = *cfg
	}
	start := time.Now()
	nc, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	t.Logf("dial took %v", time.Since(start))
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return nc.(*Conn), r.c, ln
}

func TestEcho(t *testing.T) {
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	go func() {
		io.Copy(s, s)
		s.Close()
	}()
	msg := []byte("hello, rdma")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("echo %q, want %q", got, msg)
	}
	if c.RemoteAddr().String() != ln.Addr().String() || c.LocalAddr().Network() != "rdma" {
		t.Fatalf("addresses: local %v remote %v listener %v", c.LocalAddr(), c.RemoteAddr(), ln.Addr())
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(got); err != io.EOF {
		t.Fatalf("after half-close and echo: %d, %v; want io.EOF", n, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestNetConn runs golang.org/x/net/nettest's net.Conn conformance suite.
func TestNetConn(t *testing.T) {
	checkLeaksAtEnd(t) // once for the 11 pairs (each check lists the device's objects)
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		c, s, ln := dialPair(t, nil)
		return c, s, func() {
			c.Close()
			s.Close()
			ln.Close()
		}, nil
	})
}

// TestBidirectionalTransfer moves 64 MiB each way at once (make soak: 1 GiB;
// RDMA_TEST_TRANSFER_MIB sets it) with random write
// and read sizes and compares checksums.
func TestBidirectionalTransfer(t *testing.T) {
	total := 64 << 20
	if s := os.Getenv("RDMA_TEST_TRANSFER_MIB"); s != "" {
		fmt.Sscan(s, &total)
		total <<= 20
	}
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	var wg sync.WaitGroup
	sums := make([][32]byte, 4)
	errs := make([]error, 4)
	send := func(i int, conn *Conn, seed int64) {
		defer wg.Done()
		rng := rand.New(rand.NewSource(seed))
		h := sha256.New()
		buf := make([]byte, 1<<20)
		for left := total; left > 0; {
			n := min(left, 1+rng.Intn(len(buf)))
			rng.Read(buf[:n])
			h.Write(buf[:n])
			if _, err := conn.Write(buf[:n]); err != nil {
				errs[i] = err
				return
			}
			left -= n
		}
		copy(sums[i][:], h.Sum(nil))
	}
	recv := func(i int, conn *Conn, seed int64) {
		defer wg.Done()
		rng := rand.New(rand.NewSource(seed))
		h := sha256.New()
		buf := make([]byte, 1<<20)
		for left := total; left > 0; {
			n, err := conn.Read(buf[:min(left, 1+rng.Intn(len(buf)))])
			if err != nil {
				errs[i] = err
				return
			}
			h.Write(buf[:n])
			left -= n
		}
		copy(sums[i][:], h.Sum(nil))
	}
	start := time.Now()
	wg.Add(4)
	go send(0, c, 1)
	go recv(1, s, 2)
	go send(2, s, 3)
	go recv(3, c, 4)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("goroutine %d: %v", i, err)
		}
	}
	if sums[0] != sums[1] || sums[2] != sums[3] {
		t.Fatal("checksums differ: data was lost, duplicated or reordered")
	}
	el := time.Since(start)
	t.Logf("%d MiB each way in %v (%.1f MB/s per direction)", total>>20, el, float64(total)/el.Seconds()/1e6)
}

// TestHTTP serves net/http on a Listener and fetches through Dialer.DialContext.
func TestHTTP(t *testing.T) {
	ln := listenTest(t, nil)
	body := strings.Repeat("rdma ", 100000)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "%s %s\n%s", r.Method, r.URL.Path, body)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	var d Dialer
	tr := &http.Transport{DialContext: d.DialContext}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: rdmatest.Scale(20 * time.Second)}
	for i := 0; i < 5; i++ {
		resp, err := client.Post("http://"+ln.Addr().String()+"/x", "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if want := "POST /x\n" + body; string(got) != want {
			t.Fatalf("response %d: %d bytes, want %d", i, len(got), len(want))
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() && errors.Is(err, os.ErrDeadlineExceeded)
}

func TestDeadlines(t *testing.T) {
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	buf := make([]byte, 10)
	// A deadline in the past fails at once.
	c.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := c.Read(buf); !isTimeout(err) {
		t.Fatalf("read with past deadline: %v", err)
	}
	// A blocked Read times out, and extending the deadline works.
	// start is taken before the deadline is computed: a stall of the
	// emulated guest between the two would otherwise count against the
	// Read, which could then seem to return before its deadline.
	start := time.Now()
	c.SetReadDeadline(start.Add(50 * time.Millisecond))
	_, err := c.Read(buf)
	if !isTimeout(err) {
		t.Fatalf("read: %v, want timeout", err)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "read" || oe.Net != "rdma" {
		t.Fatalf("read error %#v is not a *net.OpError", err)
	}
	if time.Since(start) < 40*time.Millisecond {
		t.Fatal("read returned before its deadline")
	}
	c.SetReadDeadline(time.Now().Add(rdmatest.Scale(5 * time.Second)))
	go s.Write([]byte("late"))
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "late" {
		t.Fatalf("read after extending deadline: %q %v", buf[:n], err)
	}
	c.SetReadDeadline(time.Time{})
	// A Write blocked on a peer that does not read times out.
	s.SetWriteDeadline(time.Now().Add(rdmatest.Scale(300 * time.Millisecond)))
	big := make([]byte, 64<<20)
	n, err := s.Write(big)
	if !isTimeout(err) || n >= len(big) {
		t.Fatalf("write to a non-reading peer: %d, %v; want a timeout", n, err)
	}
}

// TestCloseUnblocks: Close wakes blocked Read and Write with net.ErrClosed.
func TestCloseUnblocks(t *testing.T) {
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	defer s.Close()
	errc := make(chan error, 2)
	go func() {
		_, err := c.Read(make([]byte, 10))
		errc <- err
	}()
	go func() {
		_, err := c.Write(make([]byte, 64<<20))
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	c.Close()
	for i := 0; i < 2; i++ {
		select {
		case err := <-errc:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("blocked call returned %v, want net.ErrClosed", err)
			}
		case <-time.After(rdmatest.Scale(5 * time.Second)):
			t.Fatal("Close did not unblock a blocked call")
		}
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
}

// TestGracefulClose: everything written before Close arrives, then io.EOF.
func TestGracefulClose(t *testing.T) {
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	defer s.Close()
	data := make([]byte, 3<<20)
	rand.New(rand.NewSource(1)).Read(data) // any bytes; reproducible
	go func() {
		c.Write(data)
		c.Close()
	}()
	got, err := io.ReadAll(s)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("got %d bytes, want %d (or contents differ)", len(got), len(data))
	}
	// Writing to a peer that has gone fails.
	deadline := time.Now().Add(rdmatest.Scale(5 * time.Second))
	for {
		if _, err := s.Write([]byte("x")); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("writes to a closed peer keep succeeding")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRefused(t *testing.T) {
	env := rdmatest.Require(t)
	start := time.Now()
	_, err := Dial("rdma", net.JoinHostPort(env.Addr, "1"))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial to a port nobody listens on: %v, want connection refused", err)
	}
	t.Logf("refused after %v: %v", time.Since(start), err)
}

func TestBadAddresses(t *testing.T) {
	env := rdmatest.Require(t)
	if _, err := Dial("tcp", net.JoinHostPort(env.Addr, "1")); err == nil || !strings.Contains(err.Error(), "unknown network") {
		t.Fatalf("unknown network: %v", err)
	}
	// scripts/softroce puts this address on a netdev without RDMA.
	if a := os.Getenv("RDMA_TEST_NONRDMA_ADDR"); a != "" {
		_, err := Listen("rdma", net.JoinHostPort(a, "0"))
		if !errors.Is(err, ErrNotRDMAAddress) {
			t.Fatalf("listen on %s (no RDMA there): %v", a, err)
		}
		t.Logf("listen: %v", err)
		_, err = (&Dialer{LocalAddr: &Addr{netip.AddrPortFrom(netip.MustParseAddr(a), 0)}}).DialContext(
			context.Background(), "rdma", net.JoinHostPort(env.Addr, "1"))
		if !errors.Is(err, ErrNotRDMAAddress) {
			t.Fatalf("dial from %s (no RDMA there): %v", a, err)
		}
		t.Logf("dial: %v", err)
	}
	// An address that is on no interface at all.
	if _, err := Listen("rdma", "192.0.2.1:0"); !errors.Is(err, ErrNotRDMAAddress) {
		t.Fatalf("listen on an address of no interface: %v", err)
	}
	if _, err := Dial("rdma", "127.0.0.1:7000"); !errors.Is(err, ErrNotRDMAAddress) {
		t.Fatalf("dial to loopback: %v", err)
	}
	if _, err := Dial("rdma", "no-port"); err == nil {
		t.Fatal("dial without a port succeeded")
	}
}

// TestForcedTeardownAfterLeak: the leak check's clean-up (after it has
// reported a buffer never released) leaves no device behind, so a leak
// fails only the test that leaked and not every later one.
func TestForcedTeardownAfterLeak(t *testing.T) {
	waitNoDevice(t)
	c, s, ln := connPair(t, nil)
	b, err := c.Alloc(4096) // never released
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	s.Close()
	ln.Close()
	for deadline := time.Now().Add(rdmatest.Scale(3 * time.Second)); ; time.Sleep(10 * time.Millisecond) {
		devs := device.All()
		refs, n := 0, len(devs)
		for _, d := range devs {
			refs += d.Refs()
		}
		if n == 1 && refs == 0 {
			break // the buffer alone holds the device
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d devices, %d connections on them; want the one device held by a buffer alone", n, refs)
		}
	}
	forceTeardownUnusedDevices(t)
	waitNoDevice(t)
	if b.Valid() {
		t.Fatal("a buffer of a torn-down pool is still valid")
	}
	c2, s2, ln2 := connPair(t, nil) // a fresh device works
	defer ln2.Close()
	defer c2.Close()
	defer s2.Close()
	if _, err := c2.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	one := make([]byte, 1)
	if _, err := io.ReadFull(s2, one); err != nil {
		t.Fatal(err)
	}
}
