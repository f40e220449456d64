//go:build linux && cgo

package ud

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/errs"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/rdmatest/devleaks"
	"github.com/verbline/rdma/internal/testhooks"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// The endpoint on the test device, through its own API: what the tests
// see of its insides (the receive ring, the header it sends) is what the
// root package's PacketConn tests cannot reach.

func init() {
	testhooks.TrackAllocations.Store(true) // leak reports name where each buffer was allocated
}

// testOptions are the options the root package gives an endpoint from a
// zero Config (its defaults for a PacketConn), with the device set up as
// a zero Config sets it up.
func testOptions() *Options {
	return &Options{RecvBuffers: 256, SendBuffers: 64, Backlog: 128, ConnectTimeout: 15 * time.Second,
		MaxPeers: 1024, PeerTTL: 30 * time.Second, Recheck: time.Second,
		AcquireDevice: func(ctx *verbs.Context) (*device.Device, error) {
			return device.Acquire(ctx, device.Config{BufferSize: 32 << 10, Linger: 2 * time.Second})
		}}
}

// listenTest opens an endpoint on the test device's address with a free
// port (o nil: testOptions), closed at the test's end.
func listenTest(t testing.TB, o *Options) *Endpoint[Datagram] {
	t.Helper()
	env := rdmatest.Require(t)
	if o == nil {
		o = testOptions()
	}
	p := new(Endpoint[Datagram])
	if err := p.Listen(netip.AddrPortFrom(netip.MustParseAddr(env.Addr), 0), o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// udOnDevice reports whether the test device has UD queue pairs; where it
// has none (iWARP) it checks that an endpoint is refused as documented
// (errors.ErrUnsupported naming what it lacks), and the test has nothing
// more to run.
func udOnDevice(t *testing.T) bool {
	t.Helper()
	env := rdmatest.Require(t)
	ctx, err := verbs.OpenDevice(env.Device)
	if err != nil {
		t.Fatal(err)
	}
	a, err := ctx.QueryDevice()
	ctx.Close()
	if err != nil {
		t.Fatal(err)
	}
	if device.CapsOf(a).UD {
		return true
	}
	devleaks.CheckAtEnd(t)
	p := new(Endpoint[Datagram])
	err = p.Listen(netip.AddrPortFrom(netip.MustParseAddr(env.Addr), 0), testOptions())
	if err == nil {
		p.Close()
		t.Fatalf("an endpoint opened on %s, which has no UD queue pairs", env.Device)
	}
	if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "UD queue pairs") {
		t.Fatalf("endpoint on a device without UD: %v, want errors.ErrUnsupported naming what it lacks", err)
	}
	t.Logf("%s has no UD queue pairs: refused as documented", env.Device)
	return false
}

// endpointPair returns two endpoints; the test checks for leaks at its end.
func endpointPair(t testing.TB, o *Options) (a, b *Endpoint[Datagram]) {
	t.Helper()
	devleaks.CheckAtEnd(t)
	return listenTest(t, o), listenTest(t, o)
}

// readWithin reads one datagram from p within the scaled timeout.
func readWithin(t testing.TB, p *Endpoint[Datagram], d time.Duration) ([]byte, netip.AddrPort) {
	t.Helper()
	p.SetDeadline(time.Now().Add(rdmatest.Scale(d)), true, false)
	defer p.SetDeadline(time.Time{}, true, false)
	buf := make([]byte, 64<<10)
	n, from, err := p.ReadFrom(buf)
	if err != nil {
		t.Fatalf("%v: ReadFrom: %v", p.LocalAddrPort(), err)
	}
	return buf[:n], from
}

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

func payload(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// TestEndpointEcho: a datagram there and its answer back, at every size
// up to the limit and on both sides of the inline room; the answer needs
// no address resolution on RoCE (the GRH of the datagram gives the way
// back); above the limit ErrDatagramTooLarge, and SendTo takes over the
// buffer it refuses; a read into a short buffer truncates and discards
// the rest.
func TestEndpointEcho(t *testing.T) {
	if !udOnDevice(t) {
		return
	}
	a, b := endpointPair(t, nil)
	max := a.MaxDatagramSize()
	t.Logf("MaxDatagramSize %d, inline %d", max, a.maxInline)
	if max <= 0 || max != b.MaxDatagramSize() {
		t.Fatalf("MaxDatagramSize %d / %d", max, b.MaxDatagramSize())
	}
	for i, size := range []int{0, 1, 64, a.maxInline - wire.DatagramHeaderLen, a.maxInline - wire.DatagramHeaderLen + 1, max - 1, max} {
		if size < 0 || size > max {
			continue
		}
		msg := payload(size, byte(i))
		if err := a.Send(context.Background(), msg, buffer.Buf{}, b.LocalAddrPort()); err != nil {
			t.Fatalf("Send %d bytes: %v", size, err)
		}
		got, from := readWithin(t, b, 5*time.Second)
		if !bytes.Equal(got, msg) {
			t.Fatalf("%d bytes: got %d bytes (contents differ: %v)", size, len(got), len(got) == size)
		}
		if from != a.LocalAddrPort() {
			t.Fatalf("from %v, want %v", from, a.LocalAddrPort())
		}
		// Answer the address ReadFrom returned.
		if err := b.Send(context.Background(), msg, buffer.Buf{}, from); err != nil {
			t.Fatalf("answer: %v", err)
		}
		got, from = readWithin(t, a, 5*time.Second)
		if !bytes.Equal(got, msg) || from != b.LocalAddrPort() {
			t.Fatalf("answer: %d bytes from %v", len(got), from)
		}
	}
	if sa, sb := a.Stats(), b.Stats(); sa.Resolutions != 1 || sb.Resolutions != 0 || sa.Peers != 1 || sb.Peers != 1 {
		t.Fatalf("resolutions %d / %d, peers %d / %d: want 1 / 0 (the answer goes back by the GRH), 1 / 1",
			sa.Resolutions, sb.Resolutions, sa.Peers, sb.Peers)
	}
	if err := a.Send(context.Background(), make([]byte, max+1), buffer.Buf{}, b.LocalAddrPort()); !errors.Is(err, errs.ErrDatagramTooLarge) {
		t.Fatalf("Send %d bytes: %v, want ErrDatagramTooLarge", max+1, err)
	}
	big, err := a.Alloc(max + 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SendTo(context.Background(), big, b.LocalAddrPort()); !errors.Is(err, errs.ErrDatagramTooLarge) {
		t.Fatalf("SendTo %d bytes: %v", max+1, err)
	}
	if big.Valid() {
		t.Fatal("SendTo did not take over the buffer it refused")
	}
	// ReadFrom truncates a datagram larger than its buffer, as for UDP.
	if err := a.Send(context.Background(), payload(100, 9), buffer.Buf{}, b.LocalAddrPort()); err != nil {
		t.Fatal(err)
	}
	b.SetDeadline(time.Now().Add(rdmatest.Scale(5*time.Second)), true, false)
	small := make([]byte, 10)
	n, _, err := b.ReadFrom(small)
	if err != nil || n != 10 || !bytes.Equal(small, payload(100, 9)[:10]) {
		t.Fatalf("truncated read: %d, %v", n, err)
	}
	// The rest was discarded: nothing else is waiting.
	b.SetDeadline(time.Now().Add(50*time.Millisecond), true, false)
	if _, _, err := b.ReadFrom(small); !isTimeout(err) {
		t.Fatalf("after a truncated read: %v, want a timeout", err)
	}
	if s := b.Stats(); s.Dropped != 0 {
		t.Fatalf("dropped %d", s.Dropped)
	}
}

// TestEndpointZeroCopy: Alloc and SendTo, Messages and Recv; a received
// buffer forwarded as it is, and released once sent: every receive buffer
// goes back to the ring.
func TestEndpointZeroCopy(t *testing.T) {
	if !udOnDevice(t) {
		return
	}
	a, b := endpointPair(t, nil)
	ctx := context.Background()
	to := b.LocalAddrPort()
	for i, size := range []int{0, 1, 300, a.MaxDatagramSize()} {
		buf, err := a.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		copy(buf.Bytes(), payload(size, byte(i)))
		if err := a.SendTo(ctx, buf, to); err != nil {
			t.Fatal(err)
		}
		var d Datagram
		if i%2 == 0 {
			select {
			case d = <-b.Messages():
			case <-time.After(rdmatest.Scale(5 * time.Second)):
				t.Fatalf("%d bytes: nothing on Messages()", size)
			}
		} else if d, err = b.Recv(ctx); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(d.Buf.Bytes(), payload(size, byte(i))) || d.From != a.LocalAddrPort() {
			t.Fatalf("%d bytes: got %d from %v", size, len(d.Buf.Bytes()), d.From)
		}
		// Forward the receive buffer itself back.
		if err := b.SendTo(ctx, d.Buf, d.From); err != nil {
			t.Fatal(err)
		}
		back, err := a.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back.Buf.Bytes(), payload(size, byte(i))) {
			t.Fatalf("%d bytes: forwarded datagram differs", size)
		}
		back.Buf.Release()
	}
	// The forwarded buffers went back to b's receive ring once sent.
	deadline := time.Now().Add(rdmatest.Scale(5 * time.Second))
	for {
		b.mu.Lock()
		lent := 0
		for _, l := range b.lent {
			if l {
				lent++
			}
		}
		posted, pending := b.recvPosted, len(b.recvWRs)
		b.mu.Unlock()
		// Receives are posted in batches: fewer than a batch may wait.
		if lent == 0 && posted+pending == b.nRecv && pending < b.repostBatch {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d receive buffers still lent, %d of %d posted, %d waiting (batch %d)", lent, posted, b.nRecv, pending, b.repostBatch)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A released Buf is refused (and not released twice).
	buf, _ := a.Alloc(8)
	buf.Release()
	if err := a.SendTo(ctx, buf, to); !errors.Is(err, buffer.ErrReleased) {
		t.Fatalf("SendTo a released buffer: %v", err)
	}
}

// TestEndpointDropsForeign: datagrams without a valid header, of another
// header version, or claiming an address the GRH contradicts are dropped
// and counted; valid ones around them arrive.
func TestEndpointDropsForeign(t *testing.T) {
	if !udOnDevice(t) {
		return
	}
	a, b := endpointPair(t, nil)
	good := bytes.Clone(a.hdrBytes)
	send := func(mod func([]byte)) {
		t.Helper()
		a.mu.Lock()
		mod(a.hdrBytes)
		a.mu.Unlock()
		if err := a.Send(context.Background(), []byte("payload"), buffer.Buf{}, b.LocalAddrPort()); err != nil {
			t.Fatal(err)
		}
		a.mu.Lock()
		copy(a.hdrBytes, good)
		a.mu.Unlock()
	}
	send(func(h []byte) { h[2] = 2 })                                    // another version
	send(func(h []byte) { h[0] = 'X' })                                  // not ours
	send(func(h []byte) { copy(h[20:], []byte{169, 254, 77, 77}) })      // spoofed address
	send(func(h []byte) { h[4], h[5] = 0, 0 })                           // port 0
	send(func(h []byte) { copy(h[8:], netip.IPv6Loopback().AsSlice()) }) // spoofed, IPv6
	send(func([]byte) {})                                                // valid
	got, from := readWithin(t, b, 5*time.Second)
	if string(got) != "payload" || from != a.LocalAddrPort() {
		t.Fatalf("got %q from %v", got, from)
	}
	deadline := time.Now().Add(rdmatest.Scale(2 * time.Second))
	for b.Stats().Dropped < 5 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s := b.Stats(); s.Dropped != 5 || s.Received != 1 {
		t.Fatalf("dropped %d, received %d; want 5, 1", s.Dropped, s.Received)
	}
	b.SetDeadline(time.Now().Add(50*time.Millisecond), true, false)
	if _, _, err := b.ReadFrom(make([]byte, 10)); !isTimeout(err) {
		t.Fatalf("a dropped datagram was delivered: %v", err)
	}
}

// TestEndpointForgedSource: an endpoint on the same host (the same IP, so
// its GRH passes on RoCE) sends datagrams whose header claims the port of
// a destination the receiver resolved, announcing a 1-byte max payload.
// The receiver's entry for that destination is neither replaced nor
// shrunk: its next datagram of the full size still reaches the real
// destination (after one more address resolution, which the contradiction
// asks for), and further forged datagrams within Options.Recheck cost
// nothing.
func TestEndpointForgedSource(t *testing.T) {
	if !udOnDevice(t) {
		return
	}
	a, forger := endpointPair(t, nil)
	victim := listenTest(t, nil)
	recheck := testOptions().Recheck
	big := payload(a.MaxDatagramSize(), 3)
	if err := a.Send(context.Background(), big, buffer.Buf{}, victim.LocalAddrPort()); err != nil {
		t.Fatal(err)
	}
	if got, _ := readWithin(t, victim, 5*time.Second); !bytes.Equal(got, big) {
		t.Fatalf("victim got %d bytes, want %d", len(got), len(big))
	}
	if r := a.Stats().Resolutions; r != 1 {
		t.Fatalf("%d resolutions, want 1", r)
	}
	forge := func() {
		t.Helper()
		forger.mu.Lock()
		binary.BigEndian.PutUint16(forger.hdrBytes[4:], victim.LocalAddrPort().Port())
		binary.BigEndian.PutUint16(forger.hdrBytes[6:], 1)
		forger.mu.Unlock()
		if err := forger.Send(context.Background(), []byte("forged"), buffer.Buf{}, a.LocalAddrPort()); err != nil {
			t.Fatal(err)
		}
		if got, from := readWithin(t, a, 5*time.Second); string(got) != "forged" || from != victim.LocalAddrPort() {
			t.Fatalf("got %q from %v", got, from)
		}
	}
	exchange := func() {
		t.Helper()
		if err := a.Send(context.Background(), big, buffer.Buf{}, victim.LocalAddrPort()); err != nil {
			t.Fatalf("a full-size datagram to the victim after a forged one: %v", err)
		}
		if got, _ := readWithin(t, victim, 5*time.Second); !bytes.Equal(got, big) {
			t.Fatalf("victim got %d bytes, want %d", len(got), len(big))
		}
		forger.SetDeadline(time.Now().Add(50*time.Millisecond), true, false)
		if _, _, err := forger.ReadFrom(make([]byte, 10)); !isTimeout(err) {
			t.Fatalf("the forger received a datagram meant for the victim: %v", err)
		}
	}
	forge()
	exchange()
	if r := a.Stats().Resolutions; r != 2 {
		t.Fatalf("%d resolutions, want 2 (the contradicted entry resolved again once)", r)
	}
	start := time.Now()
	for range 5 {
		forge()
		exchange()
	}
	bound := 3 + uint64(time.Since(start)/recheck)
	if r := a.Stats().Resolutions; r > bound {
		t.Fatalf("%d resolutions after 5 more forged datagrams in %v, want at most %d (one per Options.Recheck)", r, time.Since(start), bound)
	}
}
