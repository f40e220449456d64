//go:build linux && cgo

package rdma

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
)

// echoAll serves every connection ln accepts with an echo of its stream
// and of its messages, until ln is closed.
// ownSocket reports whether this process holds a descriptor of the socket
// with inode ino (as /proc/net/tcp prints it).
func ownSocket(ino string) bool {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return false
	}
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && l == "socket:["+ino+"]" {
			return true
		}
	}
	return false
}

// shortSYNRetries sets the guest's net.ipv4.tcp_syn_retries to n for the
// test (restored at its end, before its leak check).
func shortSYNRetries(t *testing.T, n int) {
	t.Helper()
	const knob = "/proc/sys/net/ipv4/tcp_syn_retries"
	old, err := os.ReadFile(knob)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(knob, []byte(strconv.Itoa(n)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(knob, old, 0o644) })
}

// fallbackListenOnDevice opens a Fallback listener on addr, or, beside an iWARP
// device (whose CM listens on TCP at rdma_cm's port itself), checks that
// it is refused as documented (errors.ErrUnsupported naming the device)
// and returns nil.
func fallbackListenOnDevice(t *testing.T, addr string) *Listener {
	t.Helper()
	ln, err := (&ListenConfig{Fallback: &Fallback{}}).Listen(context.Background(), "rdma", addr)
	if iw := iwarpDevices(); len(iw) > 0 {
		if err == nil {
			ln.Close()
			t.Fatalf("a Fallback listener opened beside iWARP device %s", iw[0])
		}
		if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), iw[0]) {
			t.Fatalf("Fallback listener beside an iWARP device: %v, want errors.ErrUnsupported naming %s", err, iw[0])
		}
		t.Logf("refused as documented: %v", err)
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func echoAll(t *testing.T, ln *Listener, wg *sync.WaitGroup) {
	for {
		c, err := ln.AcceptRDMA()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			var inner sync.WaitGroup
			inner.Add(1)
			go func() {
				defer inner.Done()
				for {
					m, err := c.Recv(context.Background())
					if err != nil {
						return
					}
					if err := c.Send(context.Background(), m); err != nil { // a received Buf sent on
						return
					}
				}
			}()
			io.Copy(c, c)
			inner.Wait()
			c.CloseWrite()
		}()
	}
}

// roundTrip checks c's stream and message view against an echoAll peer.
func roundTrip(c *Conn, n int) error {
	want := bytes.Repeat([]byte(c.LocalAddr().Network()+" "), n/4+1)[:n]
	go c.Write(want)
	got := make([]byte, n)
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want) {
		return fmt.Errorf("%s stream echo of %d bytes: %w", c.LocalAddr().Network(), n, err)
	}
	b, err := c.Alloc(n)
	if err != nil {
		return err
	}
	copy(b.Bytes(), want)
	if err := c.Send(context.Background(), b); err != nil {
		return err
	}
	m, err := c.Recv(context.Background())
	if err != nil || !bytes.Equal(m.Bytes(), want) {
		return fmt.Errorf("%s message echo of %d bytes: %w", c.LocalAddr().Network(), n, err)
	}
	return m.Release()
}

// One fallback listener on the wildcard address serves, on one port and at
// once, an RDMA dial to the RDMA netdev's IP and a fallback dial to
// 127.0.0.1, which rdma_cm cannot route to: that one falls back to TCP.
// It also shows that rdma_cm's port space and TCP's are apart: both listen
// on the same port.
func TestFallbackListenerServesBothRDMA(t *testing.T) {
	env := rdmatest.Require(t)
	checkLeaksAtEnd(t)
	g0 := rdmatest.Goroutines()
	ln := fallbackListenOnDevice(t, "0.0.0.0:0")
	if ln == nil {
		return
	}
	if ln.Addr().Network() != "rdma" || ln.TCPOnlyReason() != nil {
		t.Fatalf("fallback listener on an RDMA host: Addr %v (%s), TCPOnlyReason %v", ln.Addr(), ln.Addr().Network(), ln.TCPOnlyReason())
	}
	port := strconv.Itoa(int(ln.Addr().(*Addr).AddrPort.Port()))
	var served sync.WaitGroup
	go echoAll(t, ln, &served)

	type dialRes struct {
		c   *Conn
		err error
	}
	rdmaCh, tcpCh := make(chan dialRes, 1), make(chan dialRes, 1)
	go func() { // a plain RDMA dialer: no fallback
		d := Dialer{Timeout: rdmatest.Scale(10 * time.Second)}
		c, err := d.DialContext(context.Background(), "rdma", net.JoinHostPort(env.Addr, port))
		r := dialRes{err: err}
		if err == nil {
			r.c = c.(*Conn)
		}
		rdmaCh <- r
	}()
	go func() {
		d := Dialer{Timeout: rdmatest.Scale(10 * time.Second), Fallback: &Fallback{RDMATimeout: rdmatest.Scale(2 * time.Second)}}
		c, err := d.DialContext(context.Background(), "rdma", net.JoinHostPort("127.0.0.1", port))
		r := dialRes{err: err}
		if err == nil {
			r.c = c.(*Conn)
		}
		tcpCh <- r
	}()
	rr, tr := <-rdmaCh, <-tcpCh
	if rr.err != nil || tr.err != nil {
		t.Fatalf("rdma dial: %v; fallback dial: %v", rr.err, tr.err)
	}
	rc, tc := rr.c, tr.c
	if rc.LocalAddr().Network() != "rdma" || rc.Transport() != "rdma" || rc.FallbackReason() != nil {
		t.Fatalf("RDMA dial: %s, %s, %v", rc.LocalAddr().Network(), rc.Transport(), rc.FallbackReason())
	}
	if tc.LocalAddr().Network() != "tcp" || tc.Transport() != "tcp" || !fallbackReason(tc.FallbackReason()) {
		t.Fatalf("fallback dial to 127.0.0.1: %s, %s, reason %v", tc.LocalAddr().Network(), tc.Transport(), tc.FallbackReason())
	}
	t.Logf("fallback to TCP because: %v", tc.FallbackReason())
	if got := tc.RemoteAddr().(*net.TCPAddr).Port; strconv.Itoa(got) != port {
		t.Fatalf("TCP port %d, RDMA port %s", got, port)
	}
	// Both at once, through the same listener.
	var wg sync.WaitGroup
	for _, c := range []*Conn{rc, tc} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, n := range []int{1, 1000, 100 << 10} {
				if err := roundTrip(c, n); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// One-sided on the TCP one is refused; on the RDMA one it is not.
	buf, _ := tc.Alloc(16)
	if _, err := tc.Export(buf, RemoteWrite); !errors.Is(err, ErrNotRDMA) {
		t.Fatalf("Export over TCP: %v", err)
	}
	buf.Release()
	rb, _ := rc.Alloc(16)
	exp, err := rc.Export(rb, RemoteWrite)
	if err != nil {
		t.Fatalf("Export over RDMA: %v", err)
	}
	exp.Close()
	rb.Release()
	rc.Close()
	tc.Close()
	ln.Close()
	served.Wait()
	checkFallbackClean(t, g0)
}

// A fallback dialer to a fallback listener on the RDMA netdev's IP, and a
// plain one, stay on RDMA.
func TestFallbackDialerStaysOnRDMA(t *testing.T) {
	env := rdmatest.Require(t)
	checkLeaksAtEnd(t)
	ln := fallbackListenOnDevice(t, net.JoinHostPort(env.Addr, "0"))
	if ln == nil {
		return
	}
	var served sync.WaitGroup
	go echoAll(t, ln, &served)
	for _, d := range []Dialer{
		{Timeout: rdmatest.Scale(10 * time.Second), Fallback: &Fallback{RDMATimeout: rdmatest.Scale(5 * time.Second)}},
		{Timeout: rdmatest.Scale(10 * time.Second)},
	} {
		nc, err := d.DialContext(context.Background(), "tcp", ln.Addr().String()) // "tcp" as net/http asks
		if err != nil {
			t.Fatal(err)
		}
		c := nc.(*Conn)
		if c.LocalAddr().Network() != "rdma" || c.RemoteAddr().Network() != "rdma" || c.Transport() != "rdma" || c.FallbackReason() != nil {
			t.Fatalf("dial (fallback %v): %s, %s, %v", d.Fallback != nil, c.LocalAddr().Network(), c.Transport(), c.FallbackReason())
		}
		if err := roundTrip(c, 10<<10); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	ln.Close()
	served.Wait()
}

// The RDMA netdev's IP, where the peer listens on TCP alone (a fallback
// listener whose rdma_cm part is absent, as on a host without RDMA):
// rdma_cm's connect is refused (REJ, no listener), and the dialer falls
// back.
func TestFallbackRefusedFallsBackRDMA(t *testing.T) {
	env := rdmatest.Require(t)
	checkLeaksAtEnd(t)
	g0 := rdmatest.Goroutines()
	tl, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.ParseIP(env.Addr)})
	if err != nil {
		t.Fatal(err)
	}
	lc := ListenConfig{}
	cfg := lc.Config.withDefaults()
	ln := lc.newFallbackListener(&cfg, nil, ErrNoDevice, tl)
	var served sync.WaitGroup
	go echoAll(t, ln, &served)
	d := Dialer{Timeout: rdmatest.Scale(10 * time.Second), Fallback: &Fallback{RDMATimeout: rdmatest.Scale(5 * time.Second)}}
	start := time.Now()
	nc, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := nc.(*Conn)
	t.Logf("fell back after %v: %v", time.Since(start), c.FallbackReason())
	if c.LocalAddr().Network() != "tcp" || !errors.Is(c.FallbackReason(), syscall.ECONNREFUSED) {
		t.Fatalf("dial to a TCP-only peer on an RDMA address: %s, reason %v (want ECONNREFUSED)", c.LocalAddr().Network(), c.FallbackReason())
	}
	if err := roundTrip(c, 50<<10); err != nil {
		t.Fatal(err)
	}
	// Without Fallback the same dial is refused.
	if _, err := (&Dialer{Timeout: rdmatest.Scale(10 * time.Second)}).DialContext(context.Background(), "rdma", ln.Addr().String()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("plain dial to a TCP-only peer: %v, want ECONNREFUSED", err)
	}
	c.Close()
	ln.Close()
	served.Wait()
	checkFallbackClean(t, g0)
}

// A peer that answers neither rdma_cm nor TCP (an address on the RDMA
// netdev's subnet where no host is): the RDMA attempt ends at
// Fallback.RDMATimeout (the TCP attempt's socket appears then), TCP at the
// Dialer's Timeout (a timeout), and the error says both.
func TestFallbackBoundRDMA(t *testing.T) {
	env := rdmatest.Require(t)
	checkLeaksAtEnd(t)
	ip := net.ParseIP(env.Addr).To4()
	if ip == nil {
		t.Skip("needs an IPv4 test address")
	}
	ghost := net.IPv4(ip[0], ip[1], ip[2], ip[3]^0x55).To4()
	const port = 7471
	// The TCP attempt's socket in /proc/net/tcp: its remote address is the
	// ghost's, as the kernel prints it (the address's 32 bits in host
	// order, little-endian here).
	// On iWARP the RDMA attempt is a TCP connection too, but the kernel's
	// (siw's socket has no descriptor in this process): the TCP attempt's
	// is the socket whose inode one of this process's descriptors holds.
	remote := fmt.Sprintf("%02X%02X%02X%02X:%04X", ghost[3], ghost[2], ghost[1], ghost[0], port)
	tcpStarted := func() bool {
		b, err := os.ReadFile("/proc/net/tcp")
		if err != nil {
			t.Error(err)
			return true
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 9 && f[2] == remote && ownSocket(f[9]) {
				return true
			}
		}
		return false
	}
	if testDeviceCaps(t).CMConnectsQP {
		// siw's connect blocks in the kernel until TCP gives up on the
		// ghost's SYNs (about two minutes by default): the dial's
		// abandoned set-up is undone only then, so the leak check at the
		// end would fail. Fewer SYN retries (15 s, past the Dialer's
		// Timeout) end it sooner.
		shortSYNRetries(t, 3)
		base := rdmatest.Resources(t)["cm_id"]
		t.Cleanup(func() { // before the leak check: the abandoned connect returns
			for deadline := time.Now().Add(15*time.Second + rdmatest.Scale(5*time.Second)); rdmatest.Resources(t)["cm_id"] > base &&
				time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			}
		})
	}
	if tcpStarted() {
		t.Fatalf("a socket to %v:%d exists before the dial", ghost, port)
	}
	rdmaBound, total := rdmatest.Scale(100*time.Millisecond), rdmatest.Scale(400*time.Millisecond)
	slack := rdmatest.Scale(100 * time.Millisecond)
	d := Dialer{Timeout: total, Fallback: &Fallback{RDMATimeout: rdmaBound}}
	start := time.Now()
	seen := make(chan time.Duration, 1)
	stop := make(chan struct{})
	go func() { // when the TCP attempt starts: the RDMA attempt is over
		defer close(seen)
		for {
			if tcpStarted() {
				seen <- time.Since(start)
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	_, err := d.DialContext(context.Background(), "rdma", net.JoinHostPort(ghost.String(), strconv.Itoa(port)))
	el := time.Since(start)
	close(stop)
	rdmaEnd, ok := <-seen
	t.Logf("after %v (TCP from %v): %v", el, rdmaEnd, err)
	if err == nil {
		t.Fatal("dial to nobody succeeded")
	}
	var fe *fallbackError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "RDMA failed (") || !strings.Contains(err.Error(), "then TCP failed") {
		t.Fatalf("error does not tell both attempts: %v", err)
	}
	// The RDMA attempt: over by Fallback.RDMATimeout (route resolution may
	// fail before it, with no neighbour: still a fallback); one that waited
	// for an answer ran until then.
	if !ok {
		t.Fatalf("no TCP attempt seen (no socket to %s in /proc/net/tcp)", remote)
	}
	if rdmaEnd > rdmaBound+slack {
		t.Fatalf("the RDMA attempt ended after %v, Fallback.RDMATimeout %v", rdmaEnd, rdmaBound)
	}
	if strings.Contains(fe.rdma.Error(), "no answer within Fallback.RDMATimeout") && rdmaEnd < rdmaBound {
		t.Fatalf("the RDMA attempt ended after %v with no answer, before Fallback.RDMATimeout %v", rdmaEnd, rdmaBound)
	}
	// The TCP attempt: ended by the Dialer's Timeout, as a timeout.
	var ne net.Error
	if !errors.Is(fe.tcp, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("TCP attempt: %v, want a timeout (Dialer.Timeout %v) that says so", fe.tcp, total)
	}
	if el < total || el > total+slack {
		t.Fatalf("dial took %v, want the Dialer's Timeout %v", el, total)
	}
}
