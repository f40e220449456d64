package tcpconn

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

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/errs"
	"github.com/verbline/rdma/internal/tcpframe"
)

type testConn = Conn[completion, note]

// newPool is a pool for one test, checked empty at its end.
func newPool(t *testing.T) *buffer.Pool {
	t.Helper()
	pool, err := buffer.NewPool(nil, buffer.Options{MaxBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if u := pool.Stats().InUseBytes; u != 0 {
			t.Errorf("%d bytes of the pool still in use: %v", u, pool.Leaks())
		}
	})
	return pool
}

// pair dials a connection over loopback TCP and accepts it, both with o
// (the listener's hook admit).
func pair(t *testing.T, o Options, admit func(*net.TCPConn) error) (d, a *testConn, derr, aerr error) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		nc, err := ln.AcceptTCP()
		if err != nil {
			aerr = err
			return
		}
		if a, aerr = Accept[completion, note](nc, &o, newCompletion, admit); aerr != nil {
			nc.Close()
		}
	}()
	nc, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	if d, derr = Dial[completion, note](context.Background(), nc, &o, newCompletion); derr != nil {
		nc.Close()
	}
	<-accepted
	return d, a, derr, aerr
}

// The hellos exchange each side's limits; the stream and messages cross
// both ways, a PostSend's end arrives with its id, CloseWrite ends the
// peer's stream and messages, and Close closes the channels the root
// package hands out.
func TestRoundTrip(t *testing.T) {
	o := testOptions(newPool(t))
	o.BufferSize, o.MaxMessageSize = 4096, 100000
	d, a, derr, aerr := pair(t, o, nil)
	if derr != nil || aerr != nil {
		t.Fatalf("dial %v, accept %v", derr, aerr)
	}
	if d.MaxMessageSize() != 100000 || d.peerChunk != 4096 || d.FallbackReason() != nil {
		t.Errorf("the dialer's view of the peer: max message %d, chunk %d", d.MaxMessageSize(), d.peerChunk)
	}
	if d.LocalAddr().String() != a.RemoteAddr().String() || d.LocalAddr().Network() != "tcp" {
		t.Errorf("addresses: dialer's local %v, acceptor's remote %v", d.LocalAddr(), a.RemoteAddr())
	}
	want := bytes.Repeat([]byte("0123456789abcdef"), 1000) // 4 chunks
	if n, err := d.Write(want); n != len(want) || err != nil {
		t.Fatalf("Write: %d, %v", n, err)
	}
	m, err := a.Alloc(99999)
	if err != nil {
		t.Fatal(err)
	}
	copy(m.Bytes(), want)
	if err := a.PostSend(context.Background(), m, 7); err != nil {
		t.Fatal(err)
	}
	if oc, err := a.RecvCompletion(context.Background()); err != nil || oc.id != 7 || oc.err != nil {
		t.Fatalf("RecvCompletion: %+v, %v", oc, err)
	}
	got := make([]byte, len(want))
	if _, err := io.ReadFull(a, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("stream: %v (equal %v)", err, bytes.Equal(got, want))
	}
	r, err := d.Recv(context.Background())
	if err != nil || r.Len() != 99999 || !bytes.Equal(r.Bytes()[:len(want)], want) {
		t.Fatalf("Recv: %d bytes, %v", r.Len(), err)
	}
	r.Release()
	if err := a.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if n, err := d.Read(got); n != 0 || err != io.EOF {
		t.Errorf("Read after the peer's CloseWrite: %d, %v; want io.EOF", n, err)
	}
	if _, err := d.Recv(context.Background()); err != io.EOF {
		t.Errorf("Recv after the peer's CloseWrite: %v; want io.EOF", err)
	}
	if _, err := a.Write(want); !errors.Is(err, syscall.EPIPE) {
		t.Errorf("Write after CloseWrite: %v; want EPIPE", err)
	}
	closeBoth(t, d, a)
	for _, c := range []*testConn{d, a} {
		if _, ok := <-c.Notifications(); ok {
			t.Error("Notifications() delivered a value")
		}
		if _, ok := <-c.Messages(); ok {
			t.Error("Messages() open after Close")
		}
	}
}

func closeBoth(t *testing.T, cs ...*testConn) {
	t.Helper()
	for _, c := range cs {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}

// A listener's hook that refuses: the dialer's error matches ErrHandshake
// and carries the reason; the listener's is the hook's.
func TestAdmitRefused(t *testing.T) {
	o := testOptions(newPool(t))
	no := errors.New("not today")
	_, _, derr, aerr := pair(t, o, func(*net.TCPConn) error { return no })
	if !errors.Is(derr, errs.ErrHandshake) || !bytes.Contains([]byte(derr.Error()), []byte("not today")) {
		t.Errorf("dial: %v; want ErrHandshake with the reason", derr)
	}
	if aerr != no {
		t.Errorf("accept: %v; want the hook's error", aerr)
	}
}

// Errors leave as *net.OpError on "tcp" naming the call: a passed read
// deadline is a timeout matching os.ErrDeadlineExceeded; after Close,
// net.ErrClosed, while ends queued before Close are still returned.
func TestErrors(t *testing.T) {
	o := testOptions(newPool(t))
	o.MaxMessageSize = 1 // the buffer size, at least
	d, a, derr, aerr := pair(t, o, nil)
	if derr != nil || aerr != nil {
		t.Fatalf("dial %v, accept %v", derr, aerr)
	}
	if err := d.SetDeadline("set read deadline", time.Now().Add(-time.Second), true, false); err != nil {
		t.Fatal(err)
	}
	_, err := d.Read(make([]byte, 1))
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "read" || oe.Net != "tcp" || !oe.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("Read after its deadline: %v", err)
	}
	if _, err := d.Recv(context.Background()); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("Recv after the read deadline: %v", err)
	}
	big, _ := d.Alloc(d.MaxMessageSize() + 1)
	if err := d.Send(context.Background(), big); !errors.Is(err, errs.ErrMessageTooLarge) {
		t.Errorf("Send above the peer's limit: %v", err)
	}
	m, _ := d.Alloc(1)
	if err := d.PostSend(context.Background(), m, 1); err != nil {
		t.Fatal(err)
	}
	closeBoth(t, d, a)
	if oc, err := d.RecvCompletion(context.Background()); err != nil || oc.id != 1 {
		t.Errorf("RecvCompletion after Close, an end queued before: %+v, %v", oc, err)
	}
	for _, err := range []error{
		d.SetDeadline("set deadline", time.Time{}, true, true),
		func() error { _, err := d.Write([]byte{1}); return err }(),
		func() error { _, err := d.Read(make([]byte, 1)); return err }(),
		func() error { _, err := d.Alloc(1); return err }(),
		func() error { _, err := d.RecvCompletion(context.Background()); return err }(),
	} {
		if !errors.As(err, &oe) || oe.Net != "tcp" || !errors.Is(err, net.ErrClosed) {
			t.Errorf("after Close: %v; want a *net.OpError wrapping net.ErrClosed", err)
		}
	}
}

// The reader stops reading the socket once the frames nobody took hold
// the budget: the peer's writes stop (net.Pipe has no buffer), nothing is
// lost, and taking the messages lets it go on.
func TestRecvBudget(t *testing.T) {
	pool := newPool(t)
	o := testOptions(pool)
	o.RecvBuffers, o.BufferSize = 4, 1024
	lim := tcpframe.Limits{MaxMessage: 1024, MaxChunk: 1024}
	a, z := net.Pipe()
	c := makeConn[completion, note](z, &o, lim, newCompletion, tcpframe.Hello{MaxMessage: 1024, MaxChunk: 1024})
	defer c.cancel()
	go c.readLoop()
	go c.deliverLoop()
	const frames = 32
	wrote := make(chan int, 1)
	go func() {
		n := 0
		for ; n < frames; n++ {
			fr := append(frameHeaderOf(tcpframe.TypeMessage, 1000), bytes.Repeat([]byte{byte(n)}, 1000)...)
			if _, err := a.Write(fr); err != nil {
				break
			}
		}
		a.Close()
		wrote <- n
	}()
	for start := time.Now(); c.held.Load() < c.recvBudget; time.Sleep(time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("received frames hold %d bytes; the budget %d is never reached", c.held.Load(), c.recvBudget)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if h := c.held.Load(); h > c.recvBudget+1024 {
		t.Errorf("received frames hold %d bytes; the budget is %d", h, c.recvBudget)
	}
	select {
	case n := <-wrote:
		t.Fatalf("the peer wrote all %d frames while nothing was taken", n)
	default:
	}
	for i := range frames {
		m, err := c.Recv(context.Background())
		if err != nil || m.Len() != 1000 || m.Bytes()[0] != byte(i) {
			t.Fatalf("message %d: %d bytes, %v", i, m.Len(), err)
		}
		m.Release()
	}
	if n := <-wrote; n != frames {
		t.Errorf("the peer wrote %d frames of %d", n, frames)
	}
	if _, err := c.Recv(context.Background()); err != io.EOF {
		t.Errorf("after the last message: %v; want io.EOF", err)
	}
	<-c.drained
	<-c.delivered
}

// Close delivers, in order, what was queued before it, then the end of
// stream: the peer reads every byte and message and then io.EOF.
func TestCloseDeliversQueued(t *testing.T) {
	o := testOptions(newPool(t))
	o.SendBuffers = 4 // Write and Send wait for the writer
	d, a, derr, aerr := pair(t, o, nil)
	if derr != nil || aerr != nil {
		t.Fatalf("dial %v, accept %v", derr, aerr)
	}
	want := bytes.Repeat([]byte{0xa5}, 1<<20)
	if _, err := d.Write(want); err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		m, _ := d.Alloc(1)
		m.Bytes()[0] = byte(i)
		if err := d.Send(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	got, err := io.ReadAll(reader[completion, note]{a})
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("stream after the peer's Close: %d bytes of %d, %v", len(got), len(want), err)
	}
	for i := range 8 {
		m, err := a.Recv(context.Background())
		if err != nil || m.Bytes()[0] != byte(i) {
			t.Fatalf("message %d: %v", i, err)
		}
		m.Release()
	}
	if _, err := a.Recv(context.Background()); err != io.EOF {
		t.Errorf("after the last message: %v; want io.EOF", err)
	}
	closeBoth(t, a)
}
