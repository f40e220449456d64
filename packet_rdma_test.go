//go:build linux && cgo

package rdma

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/testhooks"
)

// udOnDevice reports whether the test device has UD queue pairs. Where it
// has none (iWARP) it checks that ListenPacket refuses it as documented
// (errors.ErrUnsupported naming what the device lacks), and the caller's
// test ends there: that refusal is what the device's users get.
func udOnDevice(t *testing.T) bool {
	t.Helper()
	if testDeviceCaps(t).UD {
		return true
	}
	env := rdmatest.Require(t)
	p, err := ListenPacket("rdma", net.JoinHostPort(env.Addr, "0"))
	if err == nil {
		p.Close()
		t.Fatal("ListenPacket succeeded on a device without UD queue pairs")
	}
	if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "UD queue pairs") {
		t.Fatalf("ListenPacket on a device without UD: %v (want errors.ErrUnsupported naming what it lacks)", err)
	}
	t.Logf("device without UD queue pairs: refused as documented")
	return false
}

// listenPacketTest opens a PacketConn on the test device's address with a
// free port; the test checks for leaks at its end.
func listenPacketTest(t testing.TB, cfg *Config) *PacketConn {
	t.Helper()
	env := rdmatest.Require(t)
	lc := ListenConfig{}
	if cfg != nil {
		lc.Config = *cfg
	}
	p, err := lc.ListenPacket(context.Background(), "rdma", net.JoinHostPort(env.Addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// packetPair returns two PacketConns; the test checks for leaks at its end.
func packetPair(t testing.TB, cfg *Config) (a, b *PacketConn) {
	t.Helper()
	checkLeaksAtEnd(t)
	a = listenPacketTest(t, cfg)
	b = listenPacketTest(t, cfg)
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b
}

// readWithin reads one datagram from p within the scaled timeout.
func readWithin(t testing.TB, p *PacketConn, d time.Duration) ([]byte, net.Addr) {
	t.Helper()
	p.SetReadDeadline(time.Now().Add(rdmatest.Scale(d)))
	defer p.SetReadDeadline(time.Time{})
	buf := make([]byte, 64<<10)
	n, from, err := p.ReadFrom(buf)
	if err != nil {
		t.Fatalf("%v: ReadFrom: %v", p.LocalAddr(), err)
	}
	return buf[:n], from
}

func payload(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// TestPacketEcho: a datagram there and its answer back, at every size up to
// the limit; the answer needs no address resolution on RoCE (the GRH of
// the datagram gives the way back); above the limit a clear error.
func TestPacketEcho(t *testing.T) {
	if !udOnDevice(t) {
		return
	}
	a, b := packetPair(t, nil)
	if a.LocalAddr().Network() != "rdma" || a.LocalAddr().(*Addr).AddrPort.Port() == 0 {
		t.Fatalf("LocalAddr %v", a.LocalAddr())
	}
	max := a.MaxDatagramSize()
	t.Logf("MaxDatagramSize %d", max)
	if max <= 0 || max != b.MaxDatagramSize() {
		t.Fatalf("MaxDatagramSize %d / %d", max, b.MaxDatagramSize())
	}
	// internal/ud's TestEndpointEcho sends on both sides of the inline room.
	for i, size := range []int{0, 1, 64, max - 1, max} {
		msg := payload(size, byte(i))
		if n, err := a.WriteTo(msg, b.LocalAddr()); err != nil || n != size {
			t.Fatalf("WriteTo %d bytes: %d, %v", size, n, err)
		}
		got, from := readWithin(t, b, 5*time.Second)
		if !bytes.Equal(got, msg) {
			t.Fatalf("%d bytes: got %d bytes (contents differ: %v)", size, len(got), len(got) == size)
		}
		if from.String() != a.LocalAddr().String() || from.Network() != "rdma" {
			t.Fatalf("from %v, want %v", from, a.LocalAddr())
		}
		// Answer the address ReadFrom returned.
		if _, err := b.WriteTo(msg, from); err != nil {
			t.Fatalf("answer: %v", err)
		}
		got, from = readWithin(t, a, 5*time.Second)
		if !bytes.Equal(got, msg) || from.String() != b.LocalAddr().String() {
			t.Fatalf("answer: %d bytes from %v", len(got), from)
		}
	}
	if sa, sb := a.Stats(), b.Stats(); sa.Resolutions != 1 || sb.Resolutions != 0 || sa.Peers != 1 || sb.Peers != 1 {
		t.Fatalf("resolutions %d / %d, peers %d / %d: want 1 / 0 (the answer goes back by the GRH), 1 / 1",
			sa.Resolutions, sb.Resolutions, sa.Peers, sb.Peers)
	}
	// Above the limit: ErrDatagramTooLarge, in a *net.OpError, nothing sent.
	_, err := a.WriteTo(make([]byte, max+1), b.LocalAddr())
	var oe *net.OpError
	if !errors.Is(err, ErrDatagramTooLarge) || !errors.As(err, &oe) || oe.Op != "write" || oe.Net != "rdma" {
		t.Fatalf("WriteTo %d bytes: %v, want ErrDatagramTooLarge in a *net.OpError", max+1, err)
	}
	t.Logf("above the limit: %v", err)
	big, err := a.Alloc(max + 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SendTo(context.Background(), big, b.LocalAddr().(*Addr).AddrPort); !errors.Is(err, ErrDatagramTooLarge) {
		t.Fatalf("SendTo %d bytes: %v", max+1, err)
	}
	if big.Valid() {
		t.Fatal("SendTo did not take over the buffer it refused")
	}
	// ReadFrom truncates a datagram larger than its buffer, as for UDP.
	if _, err := a.WriteTo(payload(100, 9), b.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	b.SetReadDeadline(time.Now().Add(rdmatest.Scale(5 * time.Second)))
	small := make([]byte, 10)
	n, _, err := b.ReadFrom(small)
	if err != nil || n != 10 || !bytes.Equal(small, payload(100, 9)[:10]) {
		t.Fatalf("truncated read: %d, %v", n, err)
	}
	// The rest was discarded: nothing else is waiting.
	b.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, _, err := b.ReadFrom(small); !isTimeout(err) {
		t.Fatalf("after a truncated read: %v, want a timeout", err)
	}
	if s := b.Stats(); s.Dropped != 0 {
		t.Fatalf("dropped %d", s.Dropped)
	}
}

// TestPacketReplyBySIDR: where a datagram's GRH cannot give the way back
// (InfiniBand, forced here), the answer resolves the sender's address
// from the address in the datagram header.
func TestPacketReplyBySIDR(t *testing.T) {
	if !udOnDevice(t) {
		return
	}
	testhooks.ReplyBySIDR.Store(true)
	a, b := packetPair(t, nil)
	testhooks.ReplyBySIDR.Store(false)
	for i := 0; i < 3; i++ {
		msg := payload(200, byte(i))
		if _, err := a.WriteTo(msg, b.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		got, from := readWithin(t, b, 5*time.Second)
		if !bytes.Equal(got, msg) || from.String() != a.LocalAddr().String() {
			t.Fatalf("got %d bytes from %v", len(got), from)
		}
		if _, err := b.WriteTo(got, from); err != nil {
			t.Fatal(err)
		}
		if got, _ := readWithin(t, a, 5*time.Second); !bytes.Equal(got, msg) {
			t.Fatal("answer differs")
		}
	}
	if sa, sb := a.Stats(), b.Stats(); sa.Resolutions != 1 || sb.Resolutions != 1 {
		t.Fatalf("resolutions %d / %d, want 1 / 1", sa.Resolutions, sb.Resolutions)
	}
}

func TestPacketDeadlines(t *testing.T) {
	if !udOnDevice(t) {
		return
	}
	a, b := packetPair(t, nil)
	buf := make([]byte, 10)
	// A deadline in the past fails at once, even with a datagram waiting.
	if _, err := a.WriteTo([]byte("x"), b.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(rdmatest.Scale(20 * time.Millisecond))
	b.SetReadDeadline(time.Now().Add(-time.Second))
	if _, _, err := b.ReadFrom(buf); !isTimeout(err) {
		t.Fatalf("read with a past deadline: %v", err)
	}
	b.SetReadDeadline(time.Time{})
	if got, _ := readWithin(t, b, 5*time.Second); string(got) != "x" {
		t.Fatalf("read %q after clearing the deadline", got)
	}
	// A blocked read times out at its deadline.
	dl := time.Now().Add(50 * time.Millisecond)
	b.SetReadDeadline(dl)
	_, _, err := b.ReadFrom(buf)
	var oe *net.OpError
	if !isTimeout(err) || !errors.As(err, &oe) || oe.Op != "read" || oe.Net != "rdma" {
		t.Fatalf("read: %v, want a timeout in a *net.OpError", err)
	}
	if early := time.Until(dl); early > time.Millisecond {
		t.Fatalf("read returned %v before its deadline", early)
	}
	// Recv too, and a context bounds it as well.
	if _, err := b.Recv(context.Background()); !isTimeout(err) {
		t.Fatalf("Recv past the deadline: %v", err)
	}
	b.SetReadDeadline(time.Time{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.Recv(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Recv with a context: %v", err)
	}
	// Extending a deadline while a read waits lets it finish.
	b.SetReadDeadline(time.Now().Add(rdmatest.Scale(200 * time.Millisecond)))
	go func() {
		time.Sleep(rdmatest.Scale(50 * time.Millisecond))
		b.SetReadDeadline(time.Now().Add(rdmatest.Scale(5 * time.Second)))
		time.Sleep(rdmatest.Scale(300 * time.Millisecond))
		a.WriteTo([]byte("late"), b.LocalAddr())
	}()
	if n, _, err := b.ReadFrom(buf); err != nil || string(buf[:n]) != "late" {
		t.Fatalf("read after extending the deadline: %q %v", buf[:n], err)
	}
	// A write past its deadline fails, even one that would not wait.
	a.SetWriteDeadline(time.Now().Add(-time.Second))
	if _, err := a.WriteTo([]byte("x"), b.LocalAddr()); !isTimeout(err) {
		t.Fatalf("write with a past deadline: %v", err)
	}
	// SetDeadline sets both.
	a.SetDeadline(time.Time{})
	if _, err := a.WriteTo([]byte("y"), b.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	a.SetDeadline(time.Now().Add(-time.Second))
	if _, _, err := a.ReadFrom(buf); !isTimeout(err) {
		t.Fatalf("read after SetDeadline: %v", err)
	}
	if _, err := a.WriteTo([]byte("x"), b.LocalAddr()); !isTimeout(err) {
		t.Fatalf("write after SetDeadline: %v", err)
	}
}

// TestPacketCloseUnblocks: Close wakes ReadFrom, Recv, a Messages reader
// and a WriteTo waiting for an address resolution; afterwards every call
// fails with net.ErrClosed.
func TestPacketCloseUnblocks(t *testing.T) {
	if !udOnDevice(t) {
		return
	}
	checkLeaksAtEnd(t)
	p := listenPacketTest(t, nil)
	errc := make(chan error, 4)
	go func() {
		_, _, err := p.ReadFrom(make([]byte, 10))
		errc <- err
	}()
	go func() {
		_, err := p.Recv(context.Background())
		errc <- err
	}()
	msgs := p.Messages()
	go func() {
		_, ok := <-msgs
		errc <- fmt.Errorf("Messages closed (%v): %w", ok, net.ErrClosed)
	}()
	// An address on the subnet that nobody has: its resolution waits for
	// an ARP answer that never comes.
	nobody := netip.AddrPortFrom(netip.MustParseAddr("169.254.77.250"), 9)
	if env := rdmatest.Require(t); env.Addr != "169.254.77.1" {
		t.Logf("test device %s: the unanswered address may resolve differently", env.Addr)
	}
	go func() {
		_, err := p.WriteToAddrPort([]byte("x"), nobody)
		errc <- err
	}()
	time.Sleep(rdmatest.Scale(100 * time.Millisecond))
	start := time.Now()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		select {
		case err := <-errc:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("blocked call returned %v, want net.ErrClosed", err)
			}
		case <-time.After(rdmatest.Scale(5 * time.Second)):
			t.Fatalf("Close did not unblock a blocked call (%d of 4 returned)", i)
		}
	}
	t.Logf("Close took %v", time.Since(start))
	if _, err := p.WriteTo([]byte("x"), &Addr{nobody}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
	if _, _, err := p.ReadFrom(nil); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
	if err := p.SetDeadline(time.Now()); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("SetDeadline after close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestPacketRefused: a datagram to a port where no PacketConn listens
// fails with connection refused (the address resolution is answered so).
func TestPacketRefused(t *testing.T) {
	if !udOnDevice(t) {
		return
	}
	checkLeaksAtEnd(t)
	env := rdmatest.Require(t)
	p := listenPacketTest(t, nil)
	defer p.Close()
	// A Listener's port is in the TCP port space: no PacketConn there.
	ln := listenTest(t, nil)
	defer ln.Close()
	start := time.Now()
	_, err := p.WriteTo([]byte("x"), ln.Addr())
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("datagram to %v (a Listener, no PacketConn): %v, want connection refused", ln.Addr(), err)
	}
	t.Logf("refused after %v: %v", time.Since(start), err)
	if _, err := ListenPacket("rdma", net.JoinHostPort("0.0.0.0", "0")); !errors.Is(err, ErrNotRDMAAddress) {
		t.Fatalf("ListenPacket on the wildcard address: %v", err)
	}
	if _, err := ListenPacket("rdma", "192.0.2.1:0"); !errors.Is(err, ErrNotRDMAAddress) {
		t.Fatalf("ListenPacket on an address of no interface: %v", err)
	}
	// scripts/softroce puts this address on a netdev without RDMA.
	if a := os.Getenv("RDMA_TEST_NONRDMA_ADDR"); a != "" {
		_, err := ListenPacket("rdma", net.JoinHostPort(a, "0"))
		if !errors.Is(err, ErrNotRDMAAddress) {
			t.Fatalf("ListenPacket on %s (no RDMA there): %v", a, err)
		}
		t.Logf("ListenPacket on a netdev without RDMA: %v", err)
	}
	if _, err := p.WriteTo([]byte("x"), &net.IPAddr{IP: net.ParseIP(env.Addr)}); err == nil {
		t.Fatal("WriteTo an address without a port succeeded")
	}
}

// TestPacketManyPeers: one PacketConn echoes, from two goroutines and
// without copies (the received buffer is sent back as it is), to many
// clients at once; each client gets exactly its own datagrams back.
func TestPacketManyPeers(t *testing.T) {
	if !udOnDevice(t) {
		return
	}
	checkLeaksAtEnd(t)
	const clients, rounds = 12, 20
	srv := listenPacketTest(t, nil)
	defer srv.Close()
	var echoes sync.WaitGroup
	for range 2 {
		echoes.Add(1)
		go func() {
			defer echoes.Done()
			for {
				d, err := srv.Recv(context.Background())
				if err != nil {
					if !errors.Is(err, net.ErrClosed) {
						t.Errorf("server Recv: %v", err)
					}
					return
				}
				if err := srv.SendTo(context.Background(), d.Buf, d.From); err != nil && !errors.Is(err, net.ErrClosed) {
					t.Errorf("server SendTo %v: %v", d.From, err)
				}
			}
		}()
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	resends := 0
	for c := range clients {
		p := listenPacketTest(t, &Config{RecvBuffers: 16, SendBuffers: 8})
		defer p.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 2048)
			for r := range rounds {
				msg := []byte(fmt.Sprintf("client %d round %d %s", c, r, payload(c*37%900, byte(r))))
				got := false
				for try := 0; try < 4 && !got; try++ {
					if try > 0 {
						mu.Lock()
						resends++
						mu.Unlock()
					}
					if _, err := p.WriteTo(msg, srv.LocalAddr()); err != nil {
						t.Errorf("client %d: WriteTo: %v", c, err)
						return
					}
					p.SetReadDeadline(time.Now().Add(rdmatest.Scale(2 * time.Second)))
					for {
						n, from, err := p.ReadFrom(buf)
						if isTimeout(err) {
							break // lost (UD): send again
						}
						if err != nil {
							t.Errorf("client %d: ReadFrom: %v", c, err)
							return
						}
						if from.String() != srv.LocalAddr().String() {
							t.Errorf("client %d: datagram from %v", c, from)
							return
						}
						if bytes.Equal(buf[:n], msg) {
							got = true
							break
						}
						// An echo of an earlier try of this round: skip it.
						if !bytes.HasPrefix(buf[:n], []byte(fmt.Sprintf("client %d round", c))) {
							t.Errorf("client %d got another client's datagram %q", c, buf[:min(n, 40)])
							return
						}
					}
				}
				if !got {
					t.Errorf("client %d round %d: no echo after 4 tries", c, r)
					return
				}
			}
		}()
	}
	wg.Wait()
	s := srv.Stats()
	t.Logf("server: %+v; %d resends by the clients", s, resends)
	if s.Peers != clients || s.Resolutions != 0 || s.Dropped != 0 {
		t.Errorf("server has %d peers, made %d resolutions and dropped %d; want %d, 0 (answers go back by the GRH), 0",
			s.Peers, s.Resolutions, s.Dropped, clients)
	}
	if resends > clients*rounds/10 {
		t.Errorf("%d resends for %d round trips", resends, clients*rounds)
	}
	srv.Close()
	echoes.Wait()
}

// TestPacketReceiveRing: datagrams that find no receive posted are dropped
// (a receiver holding every buffer), and reception resumes once buffers
// are released; nothing stalls.
func TestPacketReceiveRing(t *testing.T) {
	if !udOnDevice(t) {
		return
	}
	a, b := packetPair(t, &Config{RecvBuffers: 4})
	ctx := context.Background()
	var held []Datagram
	for i := range 4 {
		if _, err := a.WriteTo([]byte{byte(i)}, b.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		d, err := b.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, d)
	}
	// Every receive buffer is held: the next datagram is dropped.
	if _, err := a.WriteTo([]byte("lost"), b.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	b.SetReadDeadline(time.Now().Add(rdmatest.Scale(100 * time.Millisecond)))
	if d, err := b.Recv(ctx); !isTimeout(err) {
		t.Fatalf("with every buffer held: %q, %v; want a timeout", d.Bytes(), err)
	}
	b.SetReadDeadline(time.Time{})
	for i, d := range held {
		if len(d.Bytes()) != 1 || d.Bytes()[0] != byte(i) {
			t.Fatalf("held datagram %d changed: %v", i, d.Bytes())
		}
		d.Release()
	}
	for i := range 8 {
		if _, err := a.WriteTo([]byte{byte(100 + i)}, b.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		if got, _ := readWithin(t, b, 5*time.Second); len(got) != 1 || got[0] != byte(100+i) {
			t.Fatalf("after release: %v", got)
		}
	}
}

// TestPacketPeerRestart: a peer that closes and opens again on the same
// port (a new QP) is found again: at once when it sends first (its
// datagram, from another QP than the one cached, makes the next send
// resolve the address again), else by the background resolution of an
// address not heard from for a TTL.
func TestPacketPeerRestart(t *testing.T) {
	if !udOnDevice(t) {
		return
	}
	ttl := udPeerTTL
	udPeerTTL = rdmatest.Scale(30 * time.Millisecond)
	defer func() { udPeerTTL = ttl }()
	a, b := packetPair(t, nil)
	bAddr := b.LocalAddr().String()
	exchange := func(b *PacketConn) {
		t.Helper()
		if _, err := a.WriteTo([]byte("ping"), b.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		if got, _ := readWithin(t, b, 5*time.Second); string(got) != "ping" {
			t.Fatalf("got %q", got)
		}
	}
	exchange(b)
	reopen := func() *PacketConn {
		t.Helper()
		b.Close()
		b2, err := ListenPacket("rdma", bAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b2.Close() })
		return b2
	}
	// It sends first: a learns its new QP from the datagram.
	b = reopen()
	if _, err := b.WriteTo([]byte("back"), a.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	if got, _ := readWithin(t, a, 5*time.Second); string(got) != "back" {
		t.Fatalf("got %q", got)
	}
	exchange(b)
	if r := a.Stats().Resolutions; r != 2 {
		t.Fatalf("%d resolutions, want 2 (its datagram contradicted the entry: the next send resolved it again)", r)
	}
	// It does not: a keeps sending to the old QP (lost) until the TTL
	// passes without news, then resolves the address again.
	b = reopen()
	deadline := time.Now().Add(rdmatest.Scale(5 * time.Second))
	buf := make([]byte, 10)
	for {
		if _, err := a.WriteTo([]byte("again"), b.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		b.SetReadDeadline(time.Now().Add(rdmatest.Scale(20 * time.Millisecond)))
		if n, _, err := b.ReadFrom(buf); err == nil {
			if string(buf[:n]) != "again" {
				t.Fatalf("got %q", buf[:n])
			}
			break
		} else if !isTimeout(err) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restarted peer was not found again within %v", rdmatest.Scale(5*time.Second))
		}
	}
	if r := a.Stats().Resolutions; r != 3 {
		t.Fatalf("%d resolutions, want 3", r)
	}
}

// TestPacketPeerCache: the address handles a PacketConn keeps are bounded;
// the least recently used destination is evicted and resolved again when
// used again.
func TestPacketPeerCache(t *testing.T) {
	if !udOnDevice(t) {
		return
	}
	checkLeaksAtEnd(t)
	max := udMaxPeers
	udMaxPeers = 3
	a := listenPacketTest(t, nil)
	udMaxPeers = max
	defer a.Close()
	var srvs []*PacketConn
	for range 5 {
		s := listenPacketTest(t, &Config{RecvBuffers: 8, SendBuffers: 4})
		defer s.Close()
		srvs = append(srvs, s)
	}
	for round := range 2 {
		for i, s := range srvs {
			msg := []byte(fmt.Sprint(round, i))
			if _, err := a.WriteTo(msg, s.LocalAddr()); err != nil {
				t.Fatal(err)
			}
			if got, _ := readWithin(t, s, 5*time.Second); !bytes.Equal(got, msg) {
				t.Fatalf("server %d got %q, want %q", i, got, msg)
			}
		}
	}
	// Round robin over 5 with room for 3: every send missed.
	if st := a.Stats(); st.Peers != 3 || st.Resolutions != 10 {
		t.Fatalf("%d peers cached, %d resolutions; want 3, 10", st.Peers, st.Resolutions)
	}
	// The most recent stay: no resolution for them.
	for _, s := range srvs[2:] {
		if _, err := a.WriteTo([]byte("hit"), s.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		readWithin(t, s, 5*time.Second)
	}
	if r := a.Stats().Resolutions; r != 10 {
		t.Fatalf("%d resolutions after sending to cached peers, want 10", r)
	}
}

// TestPacketZeroAllocs: the copying and the zero-copy forms allocate
// nothing per datagram once warm.
func TestPacketZeroAllocs(t *testing.T) {
	if !udOnDevice(t) {
		return
	}
	testhooks.TrackAllocations.Store(false)
	a, b := packetPair(t, nil)
	testhooks.TrackAllocations.Store(true)
	ctx := context.Background()
	to := b.LocalAddr().(*Addr).AddrPort
	buf := make([]byte, 64)
	msg := payload(64, 1)
	copyTrip := func() {
		if _, err := a.WriteToAddrPort(msg, to); err != nil {
			t.Fatal(err)
		}
		if _, _, err := b.ReadFromAddrPort(buf); err != nil {
			t.Fatal(err)
		}
	}
	zeroTrip := func() {
		x, err := a.Alloc(64)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.SendTo(ctx, x, to); err != nil {
			t.Fatal(err)
		}
		d, err := b.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		d.Release()
	}
	for range 200 {
		copyTrip()
		zeroTrip()
	}
	if n := testing.AllocsPerRun(300, copyTrip); n != 0 {
		t.Errorf("WriteToAddrPort/ReadFromAddrPort: %.2f allocations per datagram", n)
	}
	if n := testing.AllocsPerRun(300, zeroTrip); n != 0 {
		t.Errorf("SendTo/Recv: %.2f allocations per datagram", n)
	}
}
