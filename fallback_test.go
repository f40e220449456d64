package rdma

// Tests of the TCP fallback that need no RDMA device: they run on the host
// (with -race, and again with CGO_ENABLED=0) where rdma_cm cannot listen
// or dial at all, which is "a peer address with no RDMA device behind it";
// fallback_rdma_test.go runs the mixed cases inside Soft-RoCE. Here every
// address is 127.0.0.1, which no RDMA device serves (in the Soft-RoCE guest
// rdma_cm cannot route to it either), so every connection is TCP-backed.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/tcpframe"
)

// fallbackListen listens with Fallback on 127.0.0.1:0: TCP alone, since no
// RDMA device serves loopback, and the listener says so.
func fallbackListen(t testing.TB, lc ListenConfig) *Listener {
	t.Helper()
	lc.Fallback = &Fallback{}
	ln, err := lc.Listen(context.Background(), "rdma", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if ln.Addr().Network() != "tcp" || !errors.Is(ln.TCPOnlyReason(), ErrNotRDMAAddress) {
		t.Fatalf("fallback listener on loopback: Addr %v (%s), TCPOnlyReason %v; want tcp and ErrNotRDMAAddress",
			ln.Addr(), ln.Addr().Network(), ln.TCPOnlyReason())
	}
	return ln
}

// TestFallbackListenWithoutRDMA: where rdma_cm cannot listen (no device,
// a build without cgo) a Fallback listener on the wildcard address listens
// on TCP alone and says why (ErrNoDevice); with a device it listens on
// both, except where an iWARP device holds rdma_cm's ports for TCP, which
// it refuses naming the device (errors.ErrUnsupported).
func TestFallbackListenWithoutRDMA(t *testing.T) {
	ln, err := (&ListenConfig{Fallback: &Fallback{}}).Listen(context.Background(), "rdma", "0.0.0.0:0")
	switch {
	case os.Getenv("RDMA_TEST_DEVICE") == "":
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		if ln.Addr().Network() != "tcp" || !errors.Is(ln.TCPOnlyReason(), ErrNoDevice) {
			t.Fatalf("fallback listener without RDMA: Addr %v (%s), TCPOnlyReason %v; want tcp and ErrNoDevice",
				ln.Addr(), ln.Addr().Network(), ln.TCPOnlyReason())
		}
	case len(iwarpDevices()) > 0:
		if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), iwarpDevices()[0]) {
			t.Fatalf("fallback listener beside an iWARP device: %v, want errors.ErrUnsupported naming it", err)
		}
		t.Log(err)
	default:
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		if ln.Addr().Network() != "rdma" || ln.TCPOnlyReason() != nil {
			t.Fatalf("fallback listener with RDMA: Addr %v (%s), TCPOnlyReason %v", ln.Addr(), ln.Addr().Network(), ln.TCPOnlyReason())
		}
	}
}

// fallbackPair connects a fallback dialer to a fallback listener.
func fallbackPair(t testing.TB, dcfg, lcfg Config) (client, server *Conn, ln *Listener) {
	t.Helper()
	ln = fallbackListen(t, ListenConfig{Config: lcfg})
	type res struct {
		c   *Conn
		err error
	}
	accepted := make(chan res, 1)
	go func() {
		c, err := ln.AcceptRDMA()
		accepted <- res{c, err}
	}()
	d := Dialer{Config: dcfg, Fallback: &Fallback{RDMATimeout: rdmatest.Scale(2 * time.Second)}}
	nc, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	client = nc.(*Conn)
	r := <-accepted
	if r.err != nil {
		t.Fatal(r.err)
	}
	server = r.c
	for _, c := range []*Conn{client, server} {
		if c.LocalAddr().Network() != "tcp" || c.RemoteAddr().Network() != "tcp" || c.Transport() != "tcp" {
			t.Fatalf("fallback conn: addresses %v (%s) -> %v (%s), Transport() %q; want tcp",
				c.LocalAddr(), c.LocalAddr().Network(), c.RemoteAddr(), c.RemoteAddr().Network(), c.Transport())
		}
	}
	if !fallbackReason(client.FallbackReason()) || server.FallbackReason() != nil {
		t.Fatalf("FallbackReason: dialer %v, listener %v", client.FallbackReason(), server.FallbackReason())
	}
	return client, server, ln
}

// checkFallbackClean fails t unless the goroutines come back to g0 and no
// fallback buffer is out.
func checkFallbackClean(t *testing.T, g0 int) {
	t.Helper()
	rdmatest.WaitGoroutines(t, g0)
	p, _ := fallbackPool()
	deadline := time.Now().Add(rdmatest.Scale(2 * time.Second))
	for p.Stats().InUseBytes != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("fallback pool: %d bytes still in use: %v", p.Stats().InUseBytes, p.Leaks())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestFallbackStream(t *testing.T) {
	g0 := rdmatest.Goroutines()
	c, s, ln := fallbackPair(t, Config{BufferSize: 4096}, Config{})
	defer ln.Close()

	// 8 MiB each way at once, random write and read sizes, checked byte for
	// byte; read one way with Read, the other with WriteTo.
	const total = 8 << 20
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	pump := func(w, r *Conn, seed int64) {
		data := make([]byte, total)
		rand.New(rand.NewSource(seed)).Read(data)
		wg.Add(2)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed + 1))
			for off := 0; off < total; {
				n := min(total-off, 1+rng.Intn(100<<10))
				if _, err := w.Write(data[off : off+n]); err != nil {
					errs <- err
					return
				}
				off += n
			}
			if err := w.CloseWrite(); err != nil {
				errs <- err
			}
		}()
		go func() {
			defer wg.Done()
			var got []byte
			var err error
			if seed == 1 {
				got, err = io.ReadAll(struct{ io.Reader }{r})
			} else { // the other way through WriteTo (io.Copy's path)
				var b bytes.Buffer
				_, err = r.WriteTo(&b)
				got = b.Bytes()
			}
			if err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(got, data) {
				errs <- fmt.Errorf("received %d bytes, not the %d sent", len(got), len(data))
			}
		}()
	}
	pump(c, s, 1)
	pump(s, c, 2)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// After CloseWrite: writing fails with EPIPE, as on TCP.
	if _, err := c.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Errorf("write after CloseWrite: %v, want EPIPE", err)
	}
	if err := c.Close(); err != nil {
		t.Error(err)
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("read after Close: %v, want net.ErrClosed", err)
	}
	ln.Close()
	checkFallbackClean(t, g0)
}

func TestFallbackMessages(t *testing.T) {
	g0 := rdmatest.Goroutines()
	c, s, ln := fallbackPair(t, Config{BufferSize: 1024}, Config{BufferSize: 1024, MaxMessageSize: 256 << 10})
	defer ln.Close()
	if got := c.MaxMessageSize(); got != 256<<10 {
		t.Fatalf("MaxMessageSize %d, want the listener's 256 KiB", got)
	}
	if got := s.MaxMessageSize(); got != 4<<20 {
		t.Fatalf("listener's MaxMessageSize %d, want the dialer's default 4 MiB", got)
	}
	ctx := context.Background()
	sizes := []int{0, 1, 100, 1023, 1024, 1025, 64 << 10, 256 << 10}
	go func() {
		for i, n := range sizes {
			b, err := c.Alloc(n)
			if err != nil {
				t.Error(err)
				return
			}
			for j := range b.Bytes() {
				b.Bytes()[j] = byte(i + j)
			}
			if i%2 == 0 {
				err = c.Send(ctx, b)
			} else {
				err = c.PostSend(ctx, b, uint64(i))
			}
			if err != nil {
				t.Error(err)
				return
			}
			if b.Valid() && i%2 == 0 {
				// Send takes b over; it is released once written.
				time.Sleep(time.Millisecond)
			}
		}
		c.Write([]byte("stream between messages"))
		c.CloseWrite()
	}()
	for i, n := range sizes {
		var m buffer.Buf
		var err error
		if i%2 == 0 {
			m, err = s.Recv(ctx)
		} else {
			m = <-s.Messages()
		}
		if err != nil || !m.Valid() {
			t.Fatalf("message %d: %v", i, err)
		}
		if m.Len() != n {
			t.Fatalf("message %d: %d bytes, want %d (boundaries kept)", i, m.Len(), n)
		}
		for j, v := range m.Bytes() {
			if v != byte(i+j) {
				t.Fatalf("message %d byte %d: %d", i, j, v)
			}
		}
		if err := m.Release(); err != nil {
			t.Fatal(err)
		}
	}
	// PostSend's ends arrive on Completions().
	seen := map[uint64]bool{}
	for range len(sizes) / 2 {
		select {
		case oc := <-c.Completions():
			if oc.Err != nil {
				t.Errorf("completion %d: %v", oc.ID, oc.Err)
			}
			seen[oc.ID] = true
		case <-time.After(rdmatest.Scale(5 * time.Second)):
			t.Fatalf("completions: got %v", seen)
		}
	}
	got, err := io.ReadAll(struct{ io.Reader }{s})
	if err != nil || string(got) != "stream between messages" {
		t.Fatalf("stream beside the messages: %q, %v", got, err)
	}
	// The peer's CloseWrite ends the messages too.
	if _, err := s.Recv(ctx); err != io.EOF {
		t.Fatalf("Recv after the peer's CloseWrite: %v, want io.EOF", err)
	}
	if _, ok := <-s.Messages(); ok {
		t.Fatal("Messages() still open after the peer's CloseWrite")
	}
	// After CloseWrite, Send fails as Write does (EPIPE) and takes the Buf over.
	late, _ := c.Alloc(10)
	if err := c.Send(ctx, late); !errors.Is(err, syscall.EPIPE) || late.Valid() {
		t.Fatalf("Send after CloseWrite: %v (Buf valid: %v), want EPIPE and the Buf released", err, late.Valid())
	}
	c.Close()
	s.Close()
	ln.Close()
	checkFallbackClean(t, g0)
}

func TestFallbackMessageTooLarge(t *testing.T) {
	g0 := rdmatest.Goroutines()
	c, s, ln := fallbackPair(t, Config{}, Config{MaxMessageSize: 64 << 10, BufferSize: 4096})
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	ctx := context.Background()
	b, _ := c.Alloc(64<<10 + 1)
	err := c.Send(ctx, b)
	if !errors.Is(err, ErrMessageTooLarge) || !strings.Contains(err.Error(), "65537 bytes, limit 65536") {
		t.Fatalf("oversize Send: %v, want ErrMessageTooLarge naming the sizes", err)
	}
	if b.Valid() {
		t.Fatal("refused Send left the Buf with the caller")
	}
	b, _ = c.Alloc(64 << 10)
	if err := c.PostSend(ctx, b, 7); err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv(ctx)
	if err != nil || m.Len() != 64<<10 {
		t.Fatalf("limit-sized message: %d bytes, %v", m.Len(), err)
	}
	m.Release()
	if oc := <-c.Completions(); oc.ID != 7 || oc.Err != nil {
		t.Fatalf("completion %+v", oc)
	}
	c.Close()
	s.Close()
	ln.Close()
	checkFallbackClean(t, g0)
}

// A peer that sends more than it announced breaks the protocol: the
// receiver ends the connection with ErrProtocol, not an allocation of what
// the header claims.
func TestFallbackProtocolViolation(t *testing.T) {
	g0 := rdmatest.Goroutines()
	ln := fallbackListen(t, ListenConfig{Config: Config{MaxMessageSize: 4096, BufferSize: 4096}})
	defer ln.Close()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.Write((&tcpframe.Hello{Major: tcpframe.Major, MaxMessage: 1 << 20, MaxChunk: 1 << 10}).AppendTo(nil))
	peer, err := tcpframe.ReadHello(raw)
	if err != nil || peer.MaxMessage != 4096 {
		t.Fatalf("listener's hello %+v, %v", peer, err)
	}
	s, err := ln.AcceptRDMA()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var hdr [tcpframe.HeaderLen]byte
	tcpframe.PutHeader(&hdr, tcpframe.TypeMessage, 1<<30)
	raw.Write(hdr[:])
	_, err = s.Recv(context.Background())
	if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "1073741824") {
		t.Fatalf("Recv after an oversize frame header: %v, want ErrProtocol", err)
	}
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, ErrProtocol) {
		t.Fatalf("Read after it: %v, want ErrProtocol", err)
	}
	// The listener closed the connection.
	raw.SetReadDeadline(time.Now().Add(rdmatest.Scale(5 * time.Second)))
	if _, err := raw.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection stayed open after a protocol error")
	}
	s.Close()
	ln.Close()
	checkFallbackClean(t, g0)
}

func TestFallbackOneSidedRefused(t *testing.T) {
	g0 := rdmatest.Goroutines()
	c, s, ln := fallbackPair(t, Config{}, Config{})
	defer ln.Close()
	ctx := context.Background()
	local, err := c.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	var remote RemoteBuf
	_, exportErr := c.Export(local, RemoteWrite|RemoteRead)
	_, noteErr := c.RecvNotification(ctx)
	_, qpErr := c.QPInfo()
	_, devErr := c.DeviceInfo()
	_, casErr := c.CompareAndSwap(ctx, remote, 0, 0, 1)
	_, faaErr := c.FetchAdd(ctx, remote, 0, 1)
	_, atomicExportErr := c.Export(local, RemoteAtomic)
	for name, err := range map[string]error{
		"CompareAndSwap":       casErr,
		"FetchAdd":             faaErr,
		"PostCompareAndSwap":   c.PostCompareAndSwap(remote, 0, 0, 1, 1),
		"PostFetchAdd":         c.PostFetchAdd(remote, 0, 1, 1),
		"Export(RemoteAtomic)": atomicExportErr,
		"Export":               exportErr,
		"WriteRemote":          c.WriteRemote(ctx, local, remote, 0),
		"WriteRemoteImm":       c.WriteRemoteImm(ctx, local, remote, 0, 1),
		"ReadRemote":           c.ReadRemote(ctx, local, remote, 0),
		"PostWriteRemote":      c.PostWriteRemote(local, remote, 0, 1),
		"PostReadRemote":       c.PostReadRemote(local, remote, 0, 1),
		"RecvNotification":     noteErr,
		"QPInfo":               qpErr,
		"DeviceInfo":           devErr,
	} {
		var oe *net.OpError
		if !errors.Is(err, ErrNotRDMA) || !errors.As(err, &oe) || oe.Net != "tcp" {
			t.Errorf("%s on a TCP-backed Conn: %v, want a *net.OpError (Net tcp) wrapping ErrNotRDMA", name, err)
		}
	}
	// The local Buf stays the caller's (as after a refused one-sided call on RDMA).
	if !local.Valid() {
		t.Fatal("a refused one-sided call released the caller's Buf")
	}
	local.Release()
	// Notifications() never delivers, and closes with the connection's end.
	c.Close()
	s.Close()
	select {
	case _, ok := <-s.Notifications():
		if ok {
			t.Fatal("a notification over TCP")
		}
	case <-time.After(rdmatest.Scale(5 * time.Second)):
		t.Fatal("Notifications() not closed at the end")
	}
	ln.Close()
	checkFallbackClean(t, g0)
}

func TestFallbackDeadlinesAndClose(t *testing.T) {
	g0 := rdmatest.Goroutines()
	c, s, ln := fallbackPair(t, Config{}, Config{})
	defer ln.Close()
	// A read deadline interrupts Read and Recv.
	s.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := s.Read(make([]byte, 10))
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past the deadline: %v", err)
	}
	if _, err := s.Recv(context.Background()); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("recv past the deadline: %v", err)
	}
	s.SetReadDeadline(time.Time{})
	// A write deadline: nobody reads s, so c's writes fill the queue and TCP;
	// the timed-out Write reports exactly what it queued, all of which arrives.
	c.SetWriteDeadline(time.Now().Add(rdmatest.Scale(300 * time.Millisecond)))
	var written int
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i % 251)
	}
	for {
		n, err := c.Write(buf)
		written += n
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("write past the deadline: %v", err)
			}
			break
		}
	}
	c.SetWriteDeadline(time.Time{})
	go c.CloseWrite() // it waits for room in the queue, which the reader below makes
	got, err := io.ReadAll(struct{ io.Reader }{s})
	if err != nil || len(got) != written {
		t.Fatalf("read %d bytes (%v) of the %d the timed-out writes reported", len(got), err, written)
	}
	for i, v := range got {
		if v != byte(i%(1<<20)%251) {
			t.Fatalf("byte %d: %d", i, v)
		}
	}
	// Close unblocks a blocked Read and Recv; later calls get net.ErrClosed.
	errc := make(chan error, 2)
	go func() { _, err := c.Read(make([]byte, 1)); errc <- err }()
	go func() { _, err := c.Recv(context.Background()); errc <- err }()
	time.Sleep(20 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errc; !errors.Is(err, net.ErrClosed) {
			t.Errorf("blocked call after Close: %v, want net.ErrClosed", err)
		}
	}
	if err := c.SetDeadline(time.Now()); !errors.Is(err, net.ErrClosed) {
		t.Errorf("SetDeadline after Close: %v", err)
	}
	if _, err := c.Alloc(1); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Alloc after Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	s.Close()
	ln.Close()
	checkFallbackClean(t, g0)
}

// Close with messages and stream data nobody received gives their buffers
// back.
func TestFallbackCloseReleases(t *testing.T) {
	g0 := rdmatest.Goroutines()
	c, s, ln := fallbackPair(t, Config{}, Config{})
	defer ln.Close()
	ctx := context.Background()
	for range 10 {
		b, _ := c.Alloc(10 << 10)
		if err := c.Send(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	c.Write(make([]byte, 100<<10))
	held, err := s.Recv(ctx) // one kept past Close: still the receiver's
	if err != nil {
		t.Fatal(err)
	}
	s.Read(make([]byte, 10)) // a chunk partly read
	time.Sleep(50 * time.Millisecond)
	c.Close()
	s.Close()
	if !held.Valid() || held.Len() != 10<<10 {
		t.Fatal("a received message did not survive its Conn's Close")
	}
	held.Release()
	ln.Close()
	checkFallbackClean(t, g0)
}

func TestFallbackNetConn(t *testing.T) {
	g0 := rdmatest.Goroutines()
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		c, s, ln := fallbackPair(t, Config{}, Config{})
		return c, s, func() {
			c.Close()
			s.Close()
			ln.Close()
		}, nil
	})
	checkFallbackClean(t, g0)
}

// Without Fallback nothing falls back: a plain Dialer fails (here, there
// is no RDMA to reach 127.0.0.1), though the listener takes TCP.
func TestFallbackOnlyWhenEnabled(t *testing.T) {
	g0 := rdmatest.Goroutines()
	ln := fallbackListen(t, ListenConfig{})
	defer ln.Close()
	var d Dialer
	c, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	if err == nil {
		c.Close()
		t.Fatal("a Dialer without Fallback connected to 127.0.0.1")
	}
	if !fallbackReason(err) {
		t.Fatalf("plain dial: %v, want what a fallback dialer falls back on (ErrNoDevice, ErrNotRDMAAddress, ...)", err)
	}
	if _, err := Dial("rdma", ln.Addr().String()); err == nil {
		t.Fatal("Dial connected to 127.0.0.1")
	}
	ln.Close()
	checkFallbackClean(t, g0)
}

// Both attempts failing: the error says what happened to each and matches
// both causes.
func TestFallbackBothFail(t *testing.T) {
	g0 := rdmatest.Goroutines()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nobody listens there now
	d := Dialer{Fallback: &Fallback{RDMATimeout: rdmatest.Scale(2 * time.Second)}}
	_, err = d.DialContext(context.Background(), "rdma", addr)
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "dial" || !errors.Is(err, syscall.ECONNREFUSED) ||
		!fallbackReason(errors.Unwrap(err).(*fallbackError).rdma) ||
		!strings.Contains(err.Error(), "RDMA failed (") || !strings.Contains(err.Error(), "then TCP failed") {
		t.Fatalf("both attempts failed: %v", err)
	}
	t.Log(err)
	checkFallbackClean(t, g0)
}

// A fallback dialer does not mistake a plain TCP service for a peer.
func TestFallbackPlainTCPPeer(t *testing.T) {
	g0 := rdmatest.Goroutines()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		c.Write([]byte("SSH-2.0-OpenSSH_9.2\r\n"))
		io.Copy(io.Discard, c)
		c.Close()
	}()
	d := Dialer{Fallback: &Fallback{RDMATimeout: rdmatest.Scale(2 * time.Second)}}
	_, err = d.DialContext(context.Background(), "rdma", l.Addr().String())
	if !errors.Is(err, ErrHandshake) || !errors.Is(err, tcpframe.ErrNotFallbackPeer) {
		t.Fatalf("dial to a plain TCP service: %v, want ErrHandshake: not a fallback peer", err)
	}
	l.Close()
	checkFallbackClean(t, g0)
}

// Admit decides on TCP dialers too; the dialer reads the reason.
func TestFallbackAdmit(t *testing.T) {
	g0 := rdmatest.Goroutines()
	var asked netip.AddrPort
	var mu sync.Mutex
	ln := fallbackListen(t, ListenConfig{Admit: func(remote netip.AddrPort) error {
		mu.Lock()
		asked = remote
		mu.Unlock()
		return errors.New("not on the guest list")
	}})
	defer ln.Close()
	d := Dialer{Fallback: &Fallback{RDMATimeout: rdmatest.Scale(2 * time.Second)}}
	_, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	if !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), "not on the guest list") {
		t.Fatalf("refused dial: %v", err)
	}
	mu.Lock()
	if !asked.Addr().IsLoopback() {
		t.Errorf("Admit got %v", asked)
	}
	mu.Unlock()
	ln.Close()
	checkFallbackClean(t, g0)
}

func TestFallbackListenerClose(t *testing.T) {
	g0 := rdmatest.Goroutines()
	ln := fallbackListen(t, ListenConfig{})
	errc := make(chan error, 1)
	go func() { _, err := ln.Accept(); errc <- err }()
	// A dialer that connects and never says hello is dropped at Close too.
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	time.Sleep(20 * time.Millisecond)
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
	if err := ln.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	checkFallbackClean(t, g0)
}

// The dialer's bound holds: a peer that accepts TCP but never answers the
// hello fails the dial within the Dialer's Timeout.
func TestFallbackDialTimeout(t *testing.T) {
	g0 := rdmatest.Goroutines()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var held []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	d := Dialer{Timeout: rdmatest.Scale(500 * time.Millisecond), Fallback: &Fallback{RDMATimeout: rdmatest.Scale(200 * time.Millisecond)}}
	start := time.Now()
	_, err = d.DialContext(context.Background(), "rdma", l.Addr().String())
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("dial to a silent peer: %v, want a timeout", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("%v: Timeout() false", err)
	}
	if el := time.Since(start); el > rdmatest.Scale(2*time.Second) {
		t.Fatalf("dial took %v, bound %v", el, d.Timeout)
	}
	l.Close()
	checkFallbackClean(t, g0)
}

// net reports a TCP dial that ran out of its context's time either as
// os.ErrDeadlineExceeded or as an error matching context.DeadlineExceeded,
// depending on which it noticed first; the fallback error's TCP part is
// always this package's deadline error.
func TestFallbackTCPTimeoutMatches(t *testing.T) {
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	_, err := (&net.Dialer{}).DialContext(ctx, "tcp", "127.0.0.1:1")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial with an expired context: %v, want one matching context.DeadlineExceeded", err)
	}
	for _, in := range []error{err, &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}} {
		fe := &fallbackError{rdma: os.ErrDeadlineExceeded, tcp: tcpDialErr(in)}
		var ne net.Error
		if !errors.Is(fe.tcp, os.ErrDeadlineExceeded) || !fe.Timeout() || !errors.As(error(fe), &ne) || !ne.Timeout() {
			t.Errorf("TCP attempt %v: carried as %v, want a timeout matching os.ErrDeadlineExceeded", in, fe.tcp)
		}
	}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	if got := tcpDialErr(refused); got != syscall.ECONNREFUSED {
		t.Errorf("refused: carried as %v, want ECONNREFUSED", got)
	}
}
