//go:build linux && cgo

package rdma

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/rdmatest"
)

// idleBudget is the registered memory an idle connection may hold with the
// default Config: an idle connection pins little, so one device serves
// thousands of them.
const idleBudget = 256 << 10

// An idle connection pins little; a stream whose reader keeps up grows
// both rings to the Config's sizes; the bytes arrive intact.
func TestWindowGrowsWithTraffic(t *testing.T) {
	client, server, ln := connPair(t, nil)
	defer ln.Close()
	defer server.Close()
	defer client.Close()
	for _, c := range []*Conn{client, server} {
		if b := c.Stats().BufferBytes; b > idleBudget {
			t.Errorf("idle connection holds %d bytes of buffers, more than %d", b, idleBudget)
		} else {
			t.Logf("idle connection: %d KiB of registered buffers", b>>10)
		}
	}
	const total = 32 << 20
	data := make([]byte, total)
	for i := range data {
		data[i] = byte(i*31 + i>>12)
	}
	pool0 := client.dev.Pool.Stats()
	go func() {
		client.Write(data)
	}()
	got := make([]byte, total)
	start := time.Now()
	if _, err := io.ReadFull(server, got); err != nil {
		t.Fatal(err)
	}
	el := time.Since(start)
	if !bytes.Equal(got, data) {
		t.Fatal("bytes differ")
	}
	server.mu.Lock()
	window := server.win.size
	server.mu.Unlock()
	client.mu.Lock()
	ring := len(client.ep.send)
	client.mu.Unlock()
	t.Logf("after %d MiB in %v (%.1f MB/s): receive window %d, send ring %d, buffers %d KiB / %d KiB",
		total>>20, el, float64(total)/el.Seconds()/1e6, window, ring, server.Stats().BufferBytes>>10, client.Stats().BufferBytes>>10)
	if cfg := server.cfg; window != cfg.RecvBuffers || ring != cfg.SendBuffers {
		t.Errorf("window %d, send ring %d: want them grown to %d and %d", window, ring, cfg.RecvBuffers, cfg.SendBuffers)
	}
	// Growing rings map arenas off the data path (Pool.Grow), never in a
	// Get made with c.mu held (a miss), which would stall the connection's
	// completions for as long as the registration takes.
	pool1 := client.dev.Pool.Stats()
	t.Logf("arenas mapped during the stream: %d by Grow, %d by Get", pool1.Grows-pool0.Grows, pool1.Misses-pool0.Misses)
	if pool1.Misses != pool0.Misses {
		t.Errorf("the rings' growth mapped %d arenas in Get, on the data path", pool1.Misses-pool0.Misses)
	}
}

// A reader that does not read does not grow its window: the writer blocks
// on the initial credits, and the receiver pins no more.
func TestWindowSlowReaderDoesNotGrow(t *testing.T) {
	client, server, ln := connPair(t, nil)
	defer ln.Close()
	defer server.Close()
	defer client.Close()
	go client.Write(make([]byte, 4<<20))
	time.Sleep(rdmatest.Scale(300 * time.Millisecond))
	server.mu.Lock()
	window := server.win.size
	server.mu.Unlock()
	if window != initialWindow(&server.cfg) {
		t.Errorf("the receive window grew to %d while nobody read", window)
	}
	if b := server.Stats().BufferBytes; b > idleBudget {
		t.Errorf("a receiver that does not read holds %d bytes", b)
	}
	// Once it reads, everything arrives.
	if _, err := io.ReadFull(server, make([]byte, 4<<20)); err != nil {
		t.Fatal(err)
	}
}

// Messages released as they arrive grow the window too, and large
// messages grow the rendezvous reserve up to maxRendezvous in flight.
func TestWindowGrowsWithMessages(t *testing.T) {
	client, server, ln := connPair(t, nil)
	defer ln.Close()
	defer server.Close()
	defer client.Close()
	ctx := context.Background()
	const n = 2000
	done := make(chan error, 1)
	go func() {
		for i := range n {
			size := 100
			if i%50 == 0 {
				size = 200 << 10 // by rendezvous
			}
			b, err := client.Alloc(size)
			if err != nil {
				done <- err
				return
			}
			b.Bytes()[0] = byte(i)
			if err := client.Send(ctx, b); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for i := range n {
		m, err := server.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.Bytes()[0] != byte(i) {
			t.Fatalf("message %d out of order", i)
		}
		m.Release()
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	server.mu.Lock()
	window := server.win.size
	server.mu.Unlock()
	client.mu.Lock()
	reserve := client.win.rvReserve
	client.mu.Unlock()
	t.Logf("after %d messages: receive window %d, rendezvous reserve %d", n, window, reserve)
	if window <= initialWindow(&server.cfg) || reserve < 1 {
		t.Errorf("window %d, reserve %d: want both grown", window, reserve)
	}
}

// A peer that sends beyond its credits is caught when the message lands in
// a receive posted for something else (here one kept for control messages, so the
// overshoot causes no RNR NAK): its connection ends with ErrProtocol, and
// another connection on the device is unaffected.
func TestCreditOvershoot(t *testing.T) {
	client, server, ln := connPair(t, nil)
	defer ln.Close()
	defer server.Close()
	defer client.Close()
	c2, s2, ln2 := connPair(t, nil)
	defer ln2.Close()
	defer s2.Close()
	defer c2.Close()
	// The forger: two credits it was never granted. With the last one kept
	// for control, it sends initial+1 data messages into initial+1 receives
	// (the credited ones and the keepalive's).
	client.mu.Lock()
	client.stream.credits += 2
	client.mu.Unlock()
	if _, err := client.Write(make([]byte, (initialWindow(&server.cfg)+1)*client.peerBufSize)); err != nil {
		t.Fatal(err)
	}
	// The server reads nothing until the overshoot is caught: a read would
	// repost receives and grant credits (the peer down to half its window
	// gets an update at once), and the extra message could then arrive
	// within real credits: nothing would be caught, and a server that read
	// the first messages before the last one arrived would hang in Read.
	deadline := time.Now().Add(rdmatest.Scale(5 * time.Second))
	for {
		server.mu.Lock()
		failed := server.stream.rerr != nil
		server.mu.Unlock()
		if failed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the overshoot was not caught within %v", rdmatest.Scale(5*time.Second))
		}
		time.Sleep(time.Millisecond)
	}
	_, err := io.ReadAll(server)
	if !errors.Is(err, ErrProtocol) {
		t.Fatalf("server read: %v, want ErrProtocol", err)
	}
	t.Logf("server: %v", err)
	echoOnce(t, c2, s2)
	echoOnce(t, s2, c2)
}

// Two idle connections whose readers are both blocked send nothing: a
// credit update earns the peer no credit to return, so none bounces back.
func TestIdleBlockedReadersQuiet(t *testing.T) {
	client, server, ln := connPair(t, nil)
	defer ln.Close()
	defer server.Close()
	defer client.Close()
	// Some traffic first, so both sides have credits to return.
	go io.Copy(server, server)
	for i := range 10 {
		if err := echo(client, i); err != nil {
			t.Fatal(err)
		}
	}
	go client.Read(make([]byte, 1)) // both readers now block
	time.Sleep(rdmatest.Scale(100 * time.Millisecond))
	c0, s0 := client.Stats(), server.Stats()
	time.Sleep(rdmatest.Scale(300 * time.Millisecond))
	c1, s1 := client.Stats(), server.Stats()
	t.Logf("sends while idle: client %d, server %d", c1.SendWRs-c0.SendWRs, s1.SendWRs-s0.SendWRs)
	if c1.SendWRs != c0.SendWRs || s1.SendWRs != s0.SendWRs {
		t.Errorf("idle connection kept sending: client %d, server %d work requests", c1.SendWRs-c0.SendWRs, s1.SendWRs-s0.SendWRs)
	}
}

// A large message whose rendezvous reserve and READ buffer both need a new
// arena: the Send waits while the pool grows off the data path, the
// receiver's READ waits for its buffer off the poller, and the message
// arrives intact; no arena is mapped by a Get on either path.
func TestRendezvousWhilePoolGrows(t *testing.T) {
	client, server, ln := connPair(t, nil)
	defer ln.Close()
	defer server.Close()
	defer client.Close()
	const size = 100 << 10 // above a receive buffer: rendezvous
	msg, err := client.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	for i := range msg.Bytes() {
		msg.Bytes()[i] = byte(i*7 + i>>10)
	}
	want := bytes.Clone(msg.Bytes())
	// Take every free buffer of the rings' class (the reserve's) and of the
	// message's class (the READ's), as other connections' traffic would.
	pool := client.dev.Pool
	var held []buffer.Buf
	defer func() {
		for _, b := range held {
			b.Release()
		}
	}()
	for _, n := range []int{client.ep.bufSize, size} {
		for {
			b, err := pool.TryGet(n)
			if err != nil {
				break
			}
			held = append(held, b)
		}
	}
	st0 := pool.Stats()
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(20*time.Second))
	defer cancel()
	if err := client.Send(ctx, msg); err != nil {
		t.Fatal(err)
	}
	got, err := server.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Error("the message differs")
	}
	got.Release()
	st1 := pool.Stats()
	t.Logf("held %d free buffers; arenas mapped: %d by Grow, %d by Get", len(held), st1.Grows-st0.Grows, st1.Misses-st0.Misses)
	if st1.Misses != st0.Misses || st1.Grows-st0.Grows < 2 {
		t.Errorf("want the two classes grown by Grow (off the data path), none by Get")
	}
	// The kernel lists an MR under the thread that registered it, and not
	// at all once that thread is gone: the arenas Grow registered must
	// still show as this process's (a thread per registration that exited
	// after it would hide them).
	if live := rdmatest.Resources(t); live["mr"] < st1.Arenas {
		t.Errorf("rdma resource show lists %d MRs for this process; its pool has %d arenas", live["mr"], st1.Arenas)
	}
}
