//go:build linux && cgo

package rdma

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/verbs"
)

// The atomics inside Soft-RoCE (atomics.go): results, contention through
// one device, the depth negotiation, and every refusal, local or by the
// peer's NIC.

func word(b buffer.Buf, off int) uint64 { return binary.NativeEndian.Uint64(b.Bytes()[off:]) }

// atomicsOnDevice reports whether the test device executes RDMA atomics.
// Where it does not (iWARP), it checks that they are refused as documented,
// locally and before anything is posted (Export with RemoteAtomic, and
// each atomic, fail with errors.ErrUnsupported), and the caller's test ends
// there: that refusal is what the device's users get.
func atomicsOnDevice(t *testing.T, c, s *Conn) bool {
	t.Helper()
	if s.dev.Caps.Atomics != verbs.AtomicNone {
		return true
	}
	b := mustAlloc(t, s, 8)
	defer b.Release()
	if _, err := s.Export(b, RemoteAtomic); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Export with RemoteAtomic on a device without atomics: %v, want errors.ErrUnsupported", err)
	}
	r := RemoteBuf{Addr: b.Addr(), Len: 8, RKey: 1}
	if _, err := c.FetchAdd(atomicCtx(t), r, 0, 1); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("FetchAdd on a device without atomics: %v, want errors.ErrUnsupported", err)
	}
	if err := c.PostCompareAndSwap(r, 0, 0, 1, 1); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("PostCompareAndSwap on a device without atomics: %v, want errors.ErrUnsupported", err)
	}
	t.Logf("device %s has no atomics: refused as documented", s.dev.Name())
	return false
}

func atomicCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(60*time.Second))
	t.Cleanup(cancel)
	return ctx
}

// TestAtomicFetchAddTwoConnections: two connections FetchAdd 5,000 times
// each on one word exported to both: the word ends at 10,000 and the old
// values returned are exactly 0..9,999, once each (every add executed
// once, atomically against the other connection's).
func TestAtomicFetchAddTwoConnections(t *testing.T) {
	c1, s1, ln := connPair(t, nil)
	if !atomicsOnDevice(t, c1, s1) {
		c1.Close()
		s1.Close()
		ln.Close()
		return
	}
	defer ln.Close()
	defer c1.Close()
	defer s1.Close()
	c2, s2 := dialAgain(t, ln, nil)
	defer c2.Close()
	defer s2.Close()
	target := mustAlloc(t, s1, 64)
	defer target.Release()
	clear(target.Bytes())
	var exps [2]*Export
	for i, s := range []*Conn{s1, s2} {
		e, err := s.Export(target, RemoteAtomic)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		exps[i] = e
	}
	const each = 5000
	ctx := atomicCtx(t)
	olds := make([][]uint64, 2)
	var wg sync.WaitGroup
	for i, c := range []*Conn{c1, c2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				old, err := c.FetchAdd(ctx, exps[i].Remote(), 8, 1)
				if err != nil {
					t.Error(err)
					return
				}
				olds[i] = append(olds[i], old)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if got := word(target, 8); got != 2*each {
		t.Fatalf("the word is %d after 2 x %d adds of 1, want %d", got, each, 2*each)
	}
	seen := make([]bool, 2*each)
	for i, list := range olds {
		for _, v := range list {
			if v >= 2*each || seen[v] {
				t.Fatalf("connection %d: old value %d returned twice or out of range", i+1, v)
			}
			seen[v] = true
		}
	}
	if word(target, 0) != 0 || word(target, 16) != 0 {
		t.Fatal("the words around the target changed")
	}
}

// TestAtomicCASLock: a lock word taken with CompareAndSwap(0, id) and
// released with CompareAndSwap(id, 0), contended by two connections, guards
// a plain counter that each updates with ReadRemote and WriteRemote: no
// update is lost.
func TestAtomicCASLock(t *testing.T) {
	c1, s1, ln := connPair(t, nil)
	if !atomicsOnDevice(t, c1, s1) {
		c1.Close()
		s1.Close()
		ln.Close()
		return
	}
	defer ln.Close()
	defer c1.Close()
	defer s1.Close()
	c2, s2 := dialAgain(t, ln, nil)
	defer c2.Close()
	defer s2.Close()
	shared := mustAlloc(t, s1, 16) // the lock at 0, the counter at 8
	defer shared.Release()
	clear(shared.Bytes())
	var exps [2]*Export
	for i, s := range []*Conn{s1, s2} {
		e, err := s.Export(shared, RemoteAtomic|RemoteRead|RemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		exps[i] = e
	}
	const rounds = 200
	ctx := atomicCtx(t)
	var wg sync.WaitGroup
	var contended [2]int
	for i, c := range []*Conn{c1, c2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := uint64(i + 1)
			remote := exps[i].Remote()
			local := mustAlloc(t, c, 8)
			defer local.Release()
			for range rounds {
				for {
					old, err := c.CompareAndSwap(ctx, remote, 0, 0, id)
					if err != nil {
						t.Error(err)
						return
					}
					if old == 0 {
						break
					}
					contended[i]++
				}
				if err := c.ReadRemote(ctx, local, remote, 8); err != nil {
					t.Error(err)
					return
				}
				binary.NativeEndian.PutUint64(local.Bytes(), binary.NativeEndian.Uint64(local.Bytes())+1)
				if err := c.WriteRemote(ctx, local, remote, 8); err != nil {
					t.Error(err)
					return
				}
				if old, err := c.CompareAndSwap(ctx, remote, 0, id, 0); err != nil || old != id {
					t.Errorf("release by %d: old %d, %v; want %d", id, old, err, id)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if got := word(shared, 8); got != 2*rounds {
		t.Fatalf("counter %d after 2 x %d locked increments, want %d", got, rounds, 2*rounds)
	}
	if word(shared, 0) != 0 {
		t.Fatalf("the lock is held (%d) after both released it", word(shared, 0))
	}
	t.Logf("failed acquisitions: %d and %d", contended[0], contended[1])
}

// TestAtomicRefusedLocally: a misaligned or out-of-range offset is refused
// with ErrRemoteAccess before anything is posted; the connection goes on,
// and CompareAndSwap and the Post forms return what they should.
func TestAtomicRefusedLocally(t *testing.T) {
	c, s, ln := connPair(t, nil)
	if !atomicsOnDevice(t, c, s) {
		c.Close()
		s.Close()
		ln.Close()
		return
	}
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	target := mustAlloc(t, s, 32)
	defer target.Release()
	clear(target.Bytes())
	exp, err := s.Export(target, RemoteAtomic)
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Close()
	ctx := atomicCtx(t)
	r := exp.Remote()
	for _, off := range []uint64{4, 28, 32, 40, 1 << 63} {
		if _, err := c.FetchAdd(ctx, r, off, 1); !errors.Is(err, ErrRemoteAccess) {
			t.Errorf("FetchAdd at offset %d of 32 bytes: %v, want ErrRemoteAccess", off, err)
		}
		if err := c.PostCompareAndSwap(r, off, 0, 1, 7); !errors.Is(err, ErrRemoteAccess) {
			t.Errorf("PostCompareAndSwap at offset %d of 32 bytes: %v, want ErrRemoteAccess", off, err)
		}
	}
	if old, err := c.FetchAdd(ctx, r, 24, 5); err != nil || old != 0 {
		t.Fatalf("FetchAdd at the last word after the refusals: %d, %v", old, err)
	}
	if old, err := c.CompareAndSwap(ctx, r, 24, 4, 9); err != nil || old != 5 {
		t.Fatalf("CompareAndSwap(4, 9) of 5: old %d, %v; want 5 and no swap", old, err)
	}
	if old, err := c.CompareAndSwap(ctx, r, 24, 5, 9); err != nil || old != 5 || word(target, 24) != 9 {
		t.Fatalf("CompareAndSwap(5, 9) of 5: old %d, %v, word %d; want 5, swapped to 9", old, err, word(target, 24))
	}
	if err := c.PostFetchAdd(r, 24, 1, 41); err != nil {
		t.Fatal(err)
	}
	if err := c.PostCompareAndSwap(r, 24, 10, 100, 42); err != nil {
		t.Fatal(err)
	}
	for _, want := range []OpCompletion{{ID: 41, Value: 9}, {ID: 42, Value: 10}} {
		got, err := c.RecvCompletion(ctx)
		if err != nil || got != want {
			t.Fatalf("completion %+v, %v; want %+v", got, err, want)
		}
	}
	if word(target, 24) != 100 {
		t.Fatalf("word %d after FetchAdd 1 and CompareAndSwap(10, 100) of 9, want 100", word(target, 24))
	}
	exchange(t, c, s)
}

// TestAtomicRefusedByPeer: an export without RemoteAtomic, another
// connection's descriptor and a closed export are each refused by the
// peer's NIC with ErrRemoteAccess, which ends the connection (each case on
// a connection of its own); the word is unchanged.
func TestAtomicRefusedByPeer(t *testing.T) {
	c, s, ln := connPair(t, nil)
	if !atomicsOnDevice(t, c, s) {
		c.Close()
		s.Close()
		ln.Close()
		return
	}
	defer ln.Close()
	defer func() { c.Close(); s.Close() }()
	target := mustAlloc(t, s, 64)
	defer target.Release()
	for i := range 8 {
		binary.NativeEndian.PutUint64(target.Bytes()[8*i:], 77)
	}
	unchanged := func(what string) {
		t.Helper()
		for i := range 8 {
			if v := word(target, 8*i); v != 77 {
				t.Fatalf("%s: word %d changed to %d", what, i, v)
			}
		}
	}
	ctx := atomicCtx(t)
	refused := func(what string, c *Conn, r RemoteBuf) {
		t.Helper()
		if _, err := c.FetchAdd(ctx, r, 8, 1); !errors.Is(err, ErrRemoteAccess) {
			t.Fatalf("%s: %v, want ErrRemoteAccess", what, err)
		}
		if _, err := c.Write([]byte("x")); err == nil {
			t.Fatalf("%s: the connection still writes after the NIC's refusal", what)
		}
		unchanged(what)
	}

	noAtomic, err := s.Export(target, RemoteRead|RemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	refused("an export without RemoteAtomic", c, noAtomic.Remote())
	noAtomic.Close()
	c.Close()
	s.Close()

	c, s = dialAgain(t, ln, nil)
	c2, s2 := dialAgain(t, ln, nil)
	defer c2.Close()
	defer s2.Close()
	exp, err := s.Export(target, RemoteAtomic)
	if err != nil {
		t.Fatal(err)
	}
	refused("another connection's descriptor", c2, exp.Remote())
	// The export's own connection may.
	if old, err := c.FetchAdd(ctx, exp.Remote(), 8, 1); err != nil || old != 77 {
		t.Fatalf("FetchAdd through the export's connection: %d, %v", old, err)
	}
	if old, err := c.FetchAdd(ctx, exp.Remote(), 8, ^uint64(0)); err != nil || old != 78 { // -1: back to 77
		t.Fatalf("FetchAdd of -1: %d, %v", old, err)
	}
	exp.Close()
	refused("a closed export", c, exp.Remote())
}

// TestAtomicDepth: each side's ReadDepth, negotiated through rdma_cm, is
// what both QPs hold (the smaller of the two in each direction), and the
// default is 16; more atomics posted than the depth all complete.
func TestAtomicDepth(t *testing.T) {
	client, server, ln := pairWith(t, Config{ReadDepth: 2}, Config{ReadDepth: 5})
	if !atomicsOnDevice(t, client, server) {
		client.Close()
		server.Close()
		ln.Close()
		return
	}
	defer ln.Close()
	defer server.Close()
	defer client.Close()
	for _, side := range []struct {
		name string
		c    *Conn
	}{{"dialer", client}, {"listener", server}} {
		info := qpInfo(t, side.c)
		if !info.RemoteAtomic {
			t.Errorf("%s: the QP does not accept the peer's atomics", side.name)
		}
		if info.MaxRdAtomic != 2 || info.MaxDestRdAtomic != 2 {
			t.Errorf("%s: max_rd_atomic %d, max_dest_rd_atomic %d; want 2 and 2 (ReadDepth 2 and 5)",
				side.name, info.MaxRdAtomic, info.MaxDestRdAtomic)
		}
	}
	target := mustAlloc(t, server, 8)
	defer target.Release()
	clear(target.Bytes())
	exp, err := server.Export(target, RemoteAtomic)
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Close()
	const n = 48
	ctx := atomicCtx(t)
	done := make(chan []uint64, 1)
	go func() {
		var olds []uint64
		for range n {
			oc, err := client.RecvCompletion(ctx)
			if err != nil || oc.Err != nil {
				t.Errorf("completion: %+v, %v", oc, err)
				break
			}
			olds = append(olds, oc.Value)
		}
		done <- olds
	}()
	for i := range n {
		if err := client.PostFetchAdd(exp.Remote(), 0, 1, uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	olds := <-done
	seen := make(map[uint64]bool)
	for _, v := range olds {
		seen[v] = true
	}
	if len(olds) != n || len(seen) != n || word(target, 0) != n {
		t.Fatalf("%d completions, %d distinct old values, word %d; want %d of each", len(olds), len(seen), word(target, 0), n)
	}

	c2, s2 := dialAgain(t, ln, nil) // the listener's 5 against the default 16
	defer c2.Close()
	defer s2.Close()
	want := 5
	if strings.HasPrefix(rdmatest.Require(t).Device, "rxe") {
		want = 8 // Soft-RoCE rounds both depths up to a power of two
	}
	for _, c := range []*Conn{c2, s2} {
		if info := qpInfo(t, c); info.MaxRdAtomic != want || info.MaxDestRdAtomic != want {
			t.Errorf("ReadDepth 5 against the default: max_rd_atomic %d, max_dest_rd_atomic %d; want %d",
				info.MaxRdAtomic, info.MaxDestRdAtomic, want)
		}
	}
	c3, s3, ln3 := connPair(t, nil)
	defer ln3.Close()
	defer c3.Close()
	defer s3.Close()
	if info := qpInfo(t, c3); info.MaxRdAtomic != defaultReadDepth || info.MaxDestRdAtomic != defaultReadDepth {
		t.Errorf("defaults: max_rd_atomic %d, max_dest_rd_atomic %d; want %d",
			info.MaxRdAtomic, info.MaxDestRdAtomic, defaultReadDepth)
	}
}

// TestAtomicOlderPeer: against a peer whose Hello announces no atomics
// (1.0's, as a release without them sends), the atomics and an export with
// RemoteAtomic fail locally with errors.ErrUnsupported, and the connection
// goes on carrying data.
func TestAtomicOlderPeer(t *testing.T) {
	checkLeaksAtEnd(t)
	ln := listenTest(t, nil)
	defer ln.Close()
	accepted := acceptAsync(ln)
	oldSide, err := dialTest(ln.Addr().String(), older)
	if err != nil {
		t.Fatal(err)
	}
	defer oldSide.Close()
	s := <-accepted
	if s == nil {
		t.Fatal("listener accepted nothing")
	}
	defer s.Close()
	b := mustAlloc(t, s, 8)
	defer b.Release()
	if _, err := s.Export(b, RemoteAtomic); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Export with RemoteAtomic to an older peer: %v, want errors.ErrUnsupported", err)
	}
	r := RemoteBuf{Addr: b.Addr(), Len: 8, RKey: 1}
	if _, err := s.FetchAdd(atomicCtx(t), r, 0, 1); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("FetchAdd against an older peer: %v, want errors.ErrUnsupported", err)
	} else {
		t.Log(err)
	}
	if err := oldSide.PostCompareAndSwap(r, 0, 0, 1, 1); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("the older-Hello side's PostCompareAndSwap: %v, want errors.ErrUnsupported", err)
	}
	for _, c := range []*Conn{s, oldSide} {
		if qpInfo(t, c).RemoteAtomic {
			t.Errorf("a QP grants remote atomics on a connection that did not negotiate them")
		}
	}
	exchange(t, oldSide, s)
}
