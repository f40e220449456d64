package rdma

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/gordma/rdma/buffer"
	"github.com/gordma/rdma/internal/rdmatest"
)

// TestMessages: messages of random sizes arrive whole, in order, without copies.
func TestMessages(t *testing.T) {
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	const n = 2000
	max := c.MaxMessageSize()
	rng := rand.New(rand.NewSource(1))
	sizes := make([]int, n)
	for i := range sizes {
		sizes[i] = 1 + rng.Intn(max)
	}
	errc := make(chan error, 1)
	go func() {
		for i, size := range sizes {
			b, err := c.Alloc(size)
			if err != nil {
				errc <- err
				return
			}
			p := b.Bytes()
			for j := range p {
				p[j] = byte(i + j)
			}
			if err := c.Send(context.Background(), b); err != nil {
				errc <- err
				return
			}
		}
		errc <- c.CloseWrite()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(30*time.Second))
	defer cancel()
	for i, size := range sizes {
		var b buffer.Buf
		var err error
		if i%2 == 0 {
			b, err = s.Recv(ctx)
		} else {
			select {
			case b = <-s.Messages():
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		p := b.Bytes()
		if len(p) != size {
			t.Fatalf("message %d: %d bytes, want %d (boundaries lost)", i, len(p), size)
		}
		for j := range p {
			if p[j] != byte(i+j) {
				t.Fatalf("message %d byte %d corrupted", i, j)
			}
		}
		if err := b.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	// PostSend reports each send's end on Completions().
	for id := uint64(1); id <= 3; id++ {
		b, _ := c.Alloc(8)
		if err := c.PostSend(ctx, b, id); err == nil {
			t.Fatal("PostSend after CloseWrite succeeded")
		}
	}
	// After the sender's CloseWrite: the channel closes and Recv reports EOF.
	if _, err := s.Recv(ctx); err == nil || !strings.Contains(err.Error(), "EOF") {
		t.Fatalf("after the last message: %v, want EOF", err)
	}
}

// TestMessageLimits: oversized messages are refused clearly; a receiver that
// holds its messages stops the sender (credits) without losing anything.
func TestMessageLimits(t *testing.T) {
	cfg := &Config{RecvBuffers: 8, BufferSize: 4096}
	c, s, ln := connPair(t, cfg)
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	big, err := c.Alloc(4097)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Send(context.Background(), big); !errors.Is(err, ErrMessageTooLarge) {
		t.Fatalf("Send beyond the peer's buffers: %v", err)
	}
	// The receiver holds every message: after the credits run out Send blocks.
	sent := 0
	for ; sent < 100; sent++ {
		b, _ := c.Alloc(100)
		ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(200*time.Millisecond))
		err := c.Send(ctx, b)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if sent == 100 || sent < 4 {
		t.Fatalf("sender sent %d messages into 8 receive buffers that nobody released", sent)
	}
	var held []buffer.Buf
	for len(held) < sent {
		held = append(held, <-s.Messages())
	}
	for _, b := range held {
		b.Release()
	}
	// Released buffers give the credits back.
	b, _ := c.Alloc(100)
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(5*time.Second))
	defer cancel()
	if err := c.Send(ctx, b); err != nil {
		t.Fatalf("send after the receiver released: %v", err)
	}
	got := <-s.Messages()
	// A second release of the same Buf is a bug the test build catches.
	got.Release()
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(strings.ToLower(r.(error).Error()), "release") {
				t.Fatalf("double release: recovered %v, want a panic naming the release", r)
			}
		}()
		got.Release()
	}()
	if got.Bytes() != nil {
		t.Fatal("a released message still exposes its bytes")
	}
}

// TestOneSided: export, RDMA write and read, write with immediate, range
// checks, and the NIC refusing an access outside the export.
func TestOneSided(t *testing.T) {
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(20*time.Second))
	defer cancel()

	// The server exports the middle 4 KiB of a 12 KiB buffer; the rest are guards.
	whole, err := s.Alloc(12 << 10)
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Release()
	for i := range whole.Bytes() {
		whole.Bytes()[i] = 0xee
	}
	// Export a Buf view of the middle: allocate it separately instead (Bufs are
	// whole buffers), with guards checked in the neighbouring buffer memory.
	target, err := s.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Release()
	exp, err := s.Export(target, RemoteWrite|RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	desc := exp.Remote().AppendTo(nil)

	remote, err := ParseRemoteBuf(desc)
	if err != nil {
		t.Fatal(err)
	}
	local, _ := c.Alloc(1024)
	defer local.Release()
	copy(local.Bytes(), bytes.Repeat([]byte("w"), 1024))
	if err := c.WriteRemote(ctx, local, remote, 1024); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(target.Bytes()[1024:2048], bytes.Repeat([]byte("w"), 1024)) || target.Bytes()[1023] != 0 && target.Bytes()[1023] != 0xee {
		t.Fatal("RDMA write did not land where expected")
	}
	copy(target.Bytes()[3072:], bytes.Repeat([]byte("r"), 1024))
	if err := c.ReadRemote(ctx, local, remote, 3072); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(local.Bytes(), bytes.Repeat([]byte("r"), 1024)) {
		t.Fatal("RDMA read returned the wrong bytes")
	}
	if err := c.WriteRemoteImm(ctx, local, remote, 0, 0xc0ffee); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-s.Notifications():
		if n.Imm != 0xc0ffee || n.Len != 1024 {
			t.Fatalf("notification %+v", n)
		}
		n.Release()
	case <-ctx.Done():
		t.Fatal("no notification for WriteRemoteImm")
	}
	// Asynchronous forms complete on Completions().
	for i := uint64(0); i < 8; i++ {
		if err := c.PostWriteRemote(local, remote, 0, i); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[uint64]bool{}
	for len(seen) < 8 {
		select {
		case oc := <-c.Completions():
			if oc.Err != nil {
				t.Fatal(oc.Err)
			}
			seen[oc.ID] = true
		case <-ctx.Done():
			t.Fatalf("async completions: got %d of 8", len(seen))
		}
	}
	// The other direction: the dialer's memory, written by the listener's side.
	back, _ := c.Alloc(256)
	defer back.Release()
	bexp, err := c.Export(back, RemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer bexp.Close()
	src, _ := s.Alloc(256)
	defer src.Release()
	copy(src.Bytes(), bytes.Repeat([]byte("b"), 256))
	if err := s.WriteRemoteImm(ctx, src, bexp.Remote(), 0, 7); err != nil {
		t.Fatalf("write into the dialer's export: %v", err)
	}
	if n := <-c.Notifications(); n.Imm != 7 || !bytes.Equal(back.Bytes(), src.Bytes()) {
		t.Fatalf("dialer's export after the write: imm %d, %q", n.Imm, back.Bytes()[:8])
	} else {
		n.Release()
	}
	// PostSend: the message arrives and its end is reported with its id.
	for id := uint64(100); id < 104; id++ {
		b, _ := c.Alloc(32)
		if err := c.PostSend(ctx, b, id); err != nil {
			t.Fatal(err)
		}
	}
	for got := 0; got < 4; {
		select {
		case oc := <-c.Completions():
			if oc.Err != nil || oc.ID < 100 || oc.ID >= 104 {
				t.Fatalf("send completion %+v", oc)
			}
			got++
		case <-ctx.Done():
			t.Fatalf("send completions: got %d of 4", got)
		}
	}
	for i := 0; i < 4; i++ {
		m, err := s.Recv(ctx)
		if err != nil || m.Len() != 32 {
			t.Fatalf("posted message %d: len %d, %v", i, m.Len(), err)
		}
		m.Release()
	}
	// Beyond the descriptor: refused locally, the connection stays usable.
	if err := c.WriteRemote(ctx, local, remote, 4096-512); !errors.Is(err, ErrRemoteAccess) {
		t.Fatalf("write past the export: %v", err)
	}
	if err := c.WriteRemote(ctx, local, remote, 0); err != nil {
		t.Fatalf("connection unusable after a refused local check: %v", err)
	}
}

// TestOneSidedForged: a forged descriptor reaching past the export is
// refused by the NIC; the exporter's memory beyond the export is untouched.
func TestOneSidedForged(t *testing.T) {
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(20*time.Second))
	defer cancel()
	target, _ := s.Alloc(4096)
	defer target.Release()
	full := target.Full() // the buffer's class may be larger than 4 KiB: the rest is the guard
	for i := range full {
		full[i] = 0xee
	}
	exp, err := s.Export(target, RemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	forged := exp.Remote()
	forged.Len *= 2
	local, _ := c.Alloc(8192)
	defer local.Release()
	err = c.WriteRemote(ctx, local, forged, 0)
	if !errors.Is(err, ErrRemoteAccess) {
		t.Fatalf("write beyond the export with a forged descriptor: %v, want ErrRemoteAccess", err)
	}
	for i, v := range full {
		if v != 0xee {
			t.Fatalf("exporter memory at %d changed (0x%x): the NIC let an out-of-range write through", i, v)
		}
	}
	// Reads are refused after the export is closed, too (on a new connection:
	// an RC access error ends the one it happened on).
	exp.Close()
	t.Logf("forged write: %v", err)
}

// TestZeroAllocs: the hot paths allocate nothing per message in steady state.
func TestZeroAllocs(t *testing.T) {
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	ctx := context.Background()
	msgRoundTrip := func() {
		b, err := c.Alloc(64)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Send(ctx, b); err != nil {
			t.Fatal(err)
		}
		r, err := s.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r.Release()
	}
	buf := make([]byte, 64)
	streamRoundTrip := func() {
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		for n := 0; n < len(buf); {
			k, err := s.Read(buf[n:])
			if err != nil {
				t.Fatal(err)
			}
			n += k
		}
	}
	for i := 0; i < 200; i++ { // warm up pools, channels and scratch slices
		msgRoundTrip()
		streamRoundTrip()
	}
	if a := testing.AllocsPerRun(500, msgRoundTrip); a != 0 {
		t.Errorf("message view: %.2f allocations per message, want 0", a)
	}
	if a := testing.AllocsPerRun(500, streamRoundTrip); a != 0 {
		t.Errorf("Conn.Write/Read of 64 B: %.2f allocations per message, want 0", a)
	}
	calls, wrs := c.ep.qp.PostStats()
	t.Logf("client QP: %d post calls carried %d work requests; poller: %+v", calls, wrs, c.ep.poller.Stats())
}

// TestManyConnsOnePoller: many connections share the device's poller(s) and
// each gets exactly its own data.
func TestManyConnsOnePoller(t *testing.T) {
	ln := listenTest(t, nil)
	defer ln.Close()
	go func() {
		for {
			s, err := ln.AcceptRDMA()
			if err != nil {
				return
			}
			go func() {
				defer s.Close()
				for {
					b, err := s.Recv(context.Background())
					if err != nil {
						return
					}
					// Echo the message back zero-copy: the received buffer is sent as is.
					if err := s.Send(context.Background(), b); err != nil {
						return
					}
				}
			}()
		}
	}()
	const conns, msgs = 16, 50
	errc := make(chan error, conns)
	var pollers = map[any]bool{}
	var mu = make(chan struct{}, 1)
	for i := 0; i < conns; i++ {
		go func(i int) {
			c, err := Dial("rdma", ln.Addr().String())
			if err != nil {
				errc <- err
				return
			}
			defer c.Close()
			mu <- struct{}{}
			pollers[c.ep.poller] = true
			<-mu
			ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(30*time.Second))
			defer cancel()
			for j := 0; j < msgs; j++ {
				b, err := c.Alloc(16)
				if err != nil {
					errc <- err
					return
				}
				copy(b.Bytes(), []byte{byte(i), byte(j)})
				if err := c.Send(ctx, b); err != nil {
					errc <- err
					return
				}
				r, err := c.Recv(ctx)
				if err != nil {
					errc <- err
					return
				}
				if p := r.Bytes(); len(p) != 16 || p[0] != byte(i) || p[1] != byte(j) {
					errc <- errors.New("a connection received another connection's message")
				}
				r.Release()
			}
			errc <- nil
		}(i)
	}
	for i := 0; i < conns; i++ {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d connections on %d poller(s)", conns, len(pollers))
}

// TestPoolExhausted: when the device's pool is exhausted Alloc fails with a
// clear error, nothing is corrupted, and releasing makes room again.
func TestPoolExhausted(t *testing.T) {
	// PoolMaxBytes applies when a device is set up: wait for the previous
	// tests' connections (closed asynchronously by their servers) to free it.
	rdmatest.Require(t)
	for deadline := time.Now().Add(rdmatest.Scale(3 * time.Second)); ; time.Sleep(10 * time.Millisecond) {
		devices.mu.Lock()
		n := len(devices.m)
		devices.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a device is still set up although every earlier connection was closed")
		}
	}
	cfg := &Config{RecvBuffers: 4, SendBuffers: 2, BufferSize: 4096, PoolMaxBytes: 8 << 20}
	c, s, ln := connPair(t, cfg)
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	var held []buffer.Buf
	var err error
	for i := 0; i < 10000; i++ { // 8 MiB of 4 KiB buffers is 2048
		var b buffer.Buf
		if b, err = c.Alloc(4000); err != nil {
			break
		}
		held = append(held, b)
	}
	if !errors.Is(err, buffer.ErrExhausted) {
		t.Fatalf("after %d buffers: %v, want buffer.ErrExhausted", len(held), err)
	}
	t.Logf("exhausted after %d buffers: %v", len(held), err)
	// The connection still works (its rings were set up before).
	if _, err := c.Write([]byte("still alive")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 11)
	if _, err := s.Read(got); err != nil || string(got) != "still alive" {
		t.Fatalf("read %q %v", got, err)
	}
	held[0].Release()
	b, err := c.Alloc(4000)
	if err != nil {
		t.Fatalf("alloc after a release: %v", err)
	}
	b.Release()
	for _, b := range held[1:] {
		b.Release()
	}
}
