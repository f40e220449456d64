//go:build linux

package rdma

// Close of a TCP-backed connection: it delivers what Write accepted or
// returns an error, as the RDMA Close does. Linux only: the library learns
// that the peer acknowledged everything from the socket's TCP state, and
// Linux resets a connection closed with unread input.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/tcpframe"
)

// A side with input it never read writes 6 MiB and closes: Close returns
// nil and the peer reads every byte, then io.EOF (not a reset, not a
// connection ending inside a frame).
func TestFallbackCloseDeliversWithUnreadInput(t *testing.T) {
	g0 := rdmatest.Goroutines()
	a, b, ln := fallbackPair(t, Config{}, Config{})
	defer ln.Close()
	const toA, toB = 8 << 20, 6 << 20

	// b sends a 8 MiB that a never reads; b's Write may end with an error
	// once a has closed.
	bwrote := make(chan error, 1)
	go func() {
		_, err := b.Write(pattern(toA, 7))
		bwrote <- err
	}()
	// b reads what a writes, to the end.
	type result struct {
		got []byte
		err error
	}
	bread := make(chan result, 1)
	go func() {
		got, err := io.ReadAll(struct{ io.Reader }{b})
		bread <- result{got, err}
	}()
	time.Sleep(50 * time.Millisecond) // b's data fills a's side

	want := pattern(toB, 0)
	if n, err := a.Write(want); n != len(want) || err != nil {
		t.Fatalf("a.Write: %d, %v", n, err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("a.Close with unread input: %v, want nil (the peer reads)", err)
	}
	var r result
	select {
	case r = <-bread:
	case <-time.After(rdmatest.Scale(10 * time.Second)):
		t.Fatal("b's read of a's data did not end")
	}
	if r.err != nil || len(r.got) != len(want) || !bytes.Equal(r.got, want) {
		t.Fatalf("b read %d of the %d bytes a wrote before its Close (%v); equal %v",
			len(r.got), len(want), r.err, bytes.Equal(r.got, want[:min(len(r.got), len(want))]))
	}
	b.Close()
	<-bwrote
	ln.Close()
	checkFallbackClean(t, g0)
}

// rawFallbackPeer is a TCP listener on 127.0.0.1 that answers one fallback
// hello and then never reads, with a receive buffer of rcvbuf bytes.
func rawFallbackPeer(t *testing.T, rcvbuf int) (addr string, peer <-chan net.Conn) {
	t.Helper()
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		var serr error
		c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
		})
		return serr
	}}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(ch)
			return
		}
		if _, err := tcpframe.ReadHello(c); err != nil {
			c.Close()
			close(ch)
			return
		}
		c.Write((&tcpframe.Hello{Major: tcpframe.Major, Minor: tcpframe.Minor, MaxMessage: 1 << 20, MaxChunk: 1 << 10}).AppendTo(nil))
		ch <- c
	}()
	return l.Addr().String(), ch
}

// A peer that reads nothing: what Write accepted fits into the socket but
// is never acknowledged, so Close returns a timeout error after
// CloseTimeout instead of nil.
func TestFallbackCloseTimesOutUnacknowledged(t *testing.T) {
	g0 := rdmatest.Goroutines()
	addr, peerc := rawFallbackPeer(t, 4096)
	closeTimeout := rdmatest.Scale(300 * time.Millisecond)
	d := Dialer{Config: Config{CloseTimeout: closeTimeout}, Fallback: &Fallback{RDMATimeout: rdmatest.Scale(2 * time.Second)}}
	nc, err := d.DialContext(context.Background(), "rdma", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := nc.(*Conn)
	peer := <-peerc
	if peer == nil {
		t.Fatal("the raw peer's hello failed")
	}
	defer peer.Close()
	// More than the peer's receive window, little enough for the socket's
	// send buffer: the writer hands it all to TCP.
	if _, err := c.Write(pattern(64<<10, 0)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	err = c.Close()
	took := time.Since(start)
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Close with data the peer never acknowledged: %v, want a timeout", err)
	}
	if took < closeTimeout/2 || took > closeTimeout+rdmatest.Scale(time.Second) {
		t.Errorf("Close took %v, CloseTimeout %v", took, closeTimeout)
	}
	peer.Close()
	checkFallbackClean(t, g0)
}

// Both sides write more than the other reads and close at once: each side's
// Close drains the other's data, so both deliver and return nil.
func TestFallbackCloseBothWithUnreadInput(t *testing.T) {
	g0 := rdmatest.Goroutines()
	cfg := Config{CloseTimeout: rdmatest.Scale(2 * time.Second)}
	a, b, ln := fallbackPair(t, cfg, cfg)
	defer ln.Close()
	// More than the queues and the kernel's buffers (tcp_rmem's largest is
	// 32 MiB on common hosts) hold.
	data := [][]byte{pattern(48<<20, 0), pattern(48<<20, 1)}
	wrote := make(chan error, 2)
	for i, c := range []*Conn{a, b} {
		go func() {
			_, err := c.Write(data[i])
			wrote <- err
		}()
	}
	time.Sleep(rdmatest.Scale(500 * time.Millisecond)) // both writers block on the other's window
	closed := make(chan error, 2)
	for _, c := range []*Conn{a, b} {
		go func() { closed <- c.Close() }()
	}
	for range 2 {
		select {
		case err := <-closed:
			if err != nil {
				t.Errorf("Close: %v, want nil (each side drains the other)", err)
			}
		case <-time.After(rdmatest.Scale(10 * time.Second)):
			t.Fatal("Close did not return")
		}
	}
	for range 2 {
		<-wrote // a Write that Close cut short returns net.ErrClosed
	}
	ln.Close()
	checkFallbackClean(t, g0)
}

// A peer that keeps the connection open without reading or closing: what
// a Write handed over fits in the peer's buffers and is acknowledged, so
// Close returns nil without waiting for the peer's end of stream.
func TestFallbackCloseIdlePeer(t *testing.T) {
	g0 := rdmatest.Goroutines()
	cfg := Config{CloseTimeout: rdmatest.Scale(3 * time.Second)}
	a, b, ln := fallbackPair(t, cfg, cfg)
	defer ln.Close()
	if _, err := a.Write(pattern(256<<10, 0)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if took := time.Since(start); took > cfg.CloseTimeout/2 {
		t.Errorf("Close took %v: it waited for the peer's end of stream", took)
	}
	got, err := io.ReadAll(struct{ io.Reader }{b})
	if err != nil || !bytes.Equal(got, pattern(256<<10, 0)) {
		t.Fatalf("b read %d bytes (%v)", len(got), err)
	}
	b.Close()
	ln.Close()
	checkFallbackClean(t, g0)
}
