//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/verbs"
)

// A device's QP pool settings come from its first connection's Config
// (Config.QPPool, Config.DeviceLinger; TestQPPoolConfig); the tests below
// use the defaults (a pool of 64) or change the device's settings directly.

// poolStats returns a copy of d's QP pool counters and its size.
func poolStats(d *device.Device) (device.QPPoolStats, int) { return d.QPs.Stats() }

// waitPool waits until cond holds for d's QP pool counters.
func waitPool(t *testing.T, d *device.Device, what string, cond func(device.QPPoolStats, int) bool) {
	t.Helper()
	deadline := time.Now().Add(rdmatest.Scale(10 * time.Second))
	for {
		st, n := poolStats(d)
		if cond(st, n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for the QP pool: %s: stats %+v, %d pooled", what, st, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// logCMIDs logs the kernel's rdma_cm ids and their states (rdma res show
// cm_id): which side of a connection is stuck in which state.
func logCMIDs(t *testing.T) {
	out, err := exec.Command("rdma", "res", "show", "cm_id").CombinedOutput()
	t.Logf("rdma res show cm_id (%v):\n%s", err, out)
}

// pooledNums is the QP numbers in d's pool.
func pooledNums(d *device.Device) map[uint32]bool {
	m := map[uint32]bool{}
	d.QPs.Each(func(q device.PooledQP) { m[q.QP.Num] = true })
	return m
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// qpPoolOnDevice reports whether the test device's QPs can be pooled.
// Where the CM connects the QP itself (iWARP: Caps.CMConnectsQP) a QP stays
// tied to its connection: it checks that closing c pools nothing, and the
// caller's test ends there.
func qpPoolOnDevice(t *testing.T, c *Conn) bool {
	t.Helper()
	d := c.dev
	if !d.Caps.CMConnectsQP {
		return true
	}
	st0, _ := poolStats(d)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(rdmatest.Scale(200 * time.Millisecond))
	if st, n := poolStats(d); n != 0 || st.Returned != st0.Returned || st.Reused != st0.Reused {
		t.Fatalf("a QP the CM connected was pooled: stats %+v (before %+v), %d pooled", st, st0, n)
	}
	t.Logf("device %s: the CM connects QPs, none is pooled", d.Name())
	return false
}

// dialEcho dials ln, checks one echo and returns the connection. The
// test's end closes it (Close is idempotent) before the echo server is
// waited for, so a test that fails with a connection open does not hang.
func dialEcho(t *testing.T, ln *Listener, i int) *Conn {
	t.Helper()
	c, err := Dial("rdma", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := echo(c, i); err != nil {
		t.Fatal(err)
	}
	return c
}

// heldDevice listens on the test device with an echo server and dials one
// connection that holds the device (its pollers, pool and QP pool) for the
// whole test; the test's end closes the connection, then the listener, and
// waits for the echo server.
func heldDevice(t *testing.T) (*Listener, *Conn) {
	t.Helper()
	ln := listenTest(t, nil)
	wg := echoServer(ln)
	t.Cleanup(wg.Wait)
	t.Cleanup(func() { ln.Close() })
	keep := dialEcho(t, ln, -1)
	t.Cleanup(func() { keep.Close() })
	return ln, keep
}

// TestQPPoolReuse: the QPs of closed connections come back (after their
// TIMEWAIT_EXIT) and the next connections reuse them: QP numbers repeat,
// and data flows on the reused QPs.
func TestQPPoolReuse(t *testing.T) {
	checkLeaksAtEnd(t)
	ln, keep := heldDevice(t)
	if !qpPoolOnDevice(t, keep) {
		return
	}
	d := keep.dev
	st0, _ := poolStats(d)

	a := dialEcho(t, ln, 0)
	num := a.ep.qp.Num
	ep := a.ep
	info, err := a.QPInfo()
	if err != nil {
		t.Fatal(err)
	}
	peerNum := info.DestQPN // the echo server's end of a, on this device too
	closedAt := time.Now()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	// Both ends (dialer and the echo server's) are on this device.
	// Each end's QP returns at its own id's TIMEWAIT_EXIT: wait for both,
	// or the next dial could take the second as it arrives.
	waitPool(t, d, "the closed connection's QPs returned", func(device.QPPoolStats, int) bool {
		p := pooledNums(d)
		return p[num] && p[peerNum]
	})
	t.Logf("QP 0x%x: TIMEWAIT_EXIT seen %v after Close; pool %v", num, time.Since(closedAt), pooledNums(d))
	if !closed(ep.twExit) {
		t.Fatal("a QP was pooled before its connection's TIMEWAIT_EXIT")
	}
	inPool := pooledNums(d)
	if !inPool[num] {
		t.Fatalf("QP 0x%x of the closed connection is not in the pool %v", num, inPool)
	}
	b := dialEcho(t, ln, 1)
	defer b.Close()
	if !b.ep.reused || !inPool[b.ep.qp.Num] {
		t.Fatalf("the next connection got QP 0x%x (reused %v), not one of the pool's %v", b.ep.qp.Num, b.ep.reused, inPool)
	}
	if st, _ := poolStats(d); st.Reused < st0.Reused+2 {
		t.Fatalf("both ends of the new connection should reuse pooled QPs: %+v", st)
	}
	// The reused QP carries more than one message each way.
	for i := 2; i < 20; i++ {
		if err := echo(b, i); err != nil {
			t.Fatal(err)
		}
	}
	// The closed connection's endpoint no longer reaches the QP.
	if _, _, err := ep.qp.QueryAttr(); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("the closed connection's QP handle still works after the hand-off: %v", err)
	}
}

// TestQPPoolNotBeforeTimewait: a closed connection's QP is never in the
// pool before its id reported TIMEWAIT_EXIT, a dial right after a close does
// not get it early, and a QP whose TIMEWAIT_EXIT does not come in time is
// destroyed, not pooled.
//
// The kernel's CM resends a disconnect request whose reply it does not see
// only after its response timeout (about 6 s on RoCE, up to 15 times), so
// a MAD the emulated device drops delays TIMEWAIT_EXIT past qpTimewaitMax.
// Each round ends at TIMEWAIT_EXIT or when the pool has given up on the QP
// and destroyed it; either way the QP was never pooled early.
func TestQPPoolNotBeforeTimewait(t *testing.T) {
	checkLeaksAtEnd(t)
	ln, keep := heldDevice(t)
	if !qpPoolOnDevice(t, keep) {
		return
	}
	d := keep.dev

	for i := range 3 {
		a := dialEcho(t, ln, i)
		ep, num := a.ep, a.ep.qp.Num
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		b := dialEcho(t, ln, 100+i) // at once: the old QP is still in timewait
		if b.ep.qp.Num == num && !closed(ep.twExit) {
			t.Fatalf("QP 0x%x reused before its connection's TIMEWAIT_EXIT", num)
		}
		parked := ep.parked.QP
		if parked == nil {
			t.Fatalf("QP 0x%x of a cleanly closed connection was not parked for the pool", num)
		}
		logAt := time.Now().Add(5 * time.Second) // before qpTimewaitMax gives up on it
		giveUp := time.Duration(qpTimewaitMax.Load())
		for deadline := time.Now().Add(giveUp + rdmatest.Scale(10*time.Second)); !closed(ep.twExit); {
			if !logAt.IsZero() && time.Now().After(logAt) {
				t.Logf("QP 0x%x: no TIMEWAIT_EXIT 5 s after Close", num)
				logCMIDs(t)
				logAt = time.Time{}
			}
			if pooledNums(d)[num] && !closed(ep.twExit) {
				t.Fatalf("QP 0x%x pooled before its connection's TIMEWAIT_EXIT", num)
			}
			if _, _, err := parked.QueryAttr(); errors.Is(err, verbs.ErrClosed) {
				t.Logf("QP 0x%x: no TIMEWAIT_EXIT within %v of Close (the CM resends a lost disconnect MAD only after its response timeout); the pool destroyed it", num, giveUp)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("QP 0x%x: neither TIMEWAIT_EXIT nor the pool giving up on it within %v of Close", num, giveUp)
			}
			time.Sleep(time.Millisecond)
		}
		b.Close()
	}

	// No TIMEWAIT_EXIT in time: destroyed.
	old := qpTimewaitMax.Swap(1)
	defer qpTimewaitMax.Store(old)
	st0, _ := poolStats(d)
	a := dialEcho(t, ln, 200)
	num := a.ep.qp.Num
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	waitPool(t, d, "the client's QP destroyed", func(st device.QPPoolStats, _ int) bool { return st.Destroyed > st0.Destroyed })
	if pooledNums(d)[num] {
		t.Fatalf("QP 0x%x pooled without its TIMEWAIT_EXIT", num)
	}
}

// TestQPPoolCrossedDisconnect: when both ends send their disconnect
// requests at once, the CM cancels each side's request and waits for a
// reply to the peer's; each side answers, so both ids reach timewait,
// report TIMEWAIT_EXIT, and both QPs return to the pool.
func TestQPPoolCrossedDisconnect(t *testing.T) {
	client, server, ln := connPair(t, nil)
	defer ln.Close()
	if !qpPoolOnDevice(t, client) {
		server.Close()
		return
	}
	for i := 0; i < 3; i++ { // traffic first: the QPs are in use
		if _, err := client.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(server, buf); err != nil {
			t.Fatal(err)
		}
	}
	d := client.dev
	st0, _ := poolStats(d)
	// Both requests leave before either arrives (a round trip in the
	// emulated device is far longer than two calls).
	client.mu.Lock()
	server.mu.Lock()
	client.disconnectLocked()
	server.disconnectLocked()
	server.mu.Unlock()
	client.mu.Unlock()
	cep, sep := client.ep, server.ep
	client.Close()
	server.Close()
	deadline := time.After(rdmatest.Scale(10 * time.Second))
	for _, w := range []struct {
		side string
		ep   *endpoint
	}{{"client", cep}, {"server", sep}} {
		select {
		case <-w.ep.twExit:
			if w.ep.twLost.Load() {
				t.Errorf("%s: its id's events were lost", w.side)
			}
		case <-deadline:
			logCMIDs(t)
			t.Fatalf("%s: no TIMEWAIT_EXIT within 10 s (scaled) of crossed disconnect requests", w.side)
		}
	}
	waitPool(t, d, "both QPs returned", func(st device.QPPoolStats, _ int) bool { return st.Returned >= st0.Returned+2 })
}

// TestQPPoolFailedConnReset: the QP of a connection that failed (its QP in
// ERR) goes through RESET before the pool keeps it, the device confirms
// RESET, and a new connection works on it.
func TestQPPoolFailedConnReset(t *testing.T) {
	checkLeaksAtEnd(t)
	ln, keep := heldDevice(t)
	if !qpPoolOnDevice(t, keep) {
		return
	}
	d := keep.dev
	st0, _ := poolStats(d)

	a := dialEcho(t, ln, 0)
	num := a.ep.qp.Num
	a.mu.Lock()
	a.failLocked(errors.New("test: connection failed"))
	a.mu.Unlock()
	if s, err := a.ep.qp.Query(); err != nil || s != verbs.StateErr {
		t.Fatalf("the failed connection's QP is in %v (%v), want ERR", s, err)
	}
	a.Close() // its error is the test's
	waitPool(t, d, "the failed connection's QP returned", func(st device.QPPoolStats, _ int) bool {
		return st.Returned > st0.Returned && pooledNums(d)[num]
	})
	// Every pooled QP is in RESET on the device, not only in our records.
	var notReset []string
	d.QPs.Each(func(q device.PooledQP) {
		if s, err := q.QP.Query(); err != nil || s != verbs.StateReset {
			notReset = append(notReset, fmt.Sprintf("pooled QP 0x%x is in %v (%v) on the device", q.QP.Num, s, err))
		}
	})
	if len(notReset) > 0 {
		t.Fatal(strings.Join(notReset, "; "))
	}
	// Dial until the failed connection's QP leaves the pool: the dialer
	// or the echo server's end of that connection took it (both ends are
	// on this device), and the echoes below go through it either way.
	var got []*Conn
	defer func() {
		for _, c := range got {
			c.Close()
		}
	}()
	for i := 0; pooledNums(d)[num]; i++ {
		if i > 64 {
			t.Fatalf("QP 0x%x of the failed connection stayed in the pool over %d dials", num, i)
		}
		got = append(got, dialEcho(t, ln, 1))
	}
	c := got[len(got)-1]
	if c.ep.qp.Num == num && !c.ep.reused {
		t.Fatalf("QP 0x%x: same number but not from the pool", num)
	}
	t.Logf("QP 0x%x of the failed connection reused by dial %d (dialer's QP 0x%x)", num, len(got), c.ep.qp.Num)
	for i := 2; i < 10; i++ {
		if err := echo(c, i); err != nil {
			t.Fatalf("on the connection that reused the reset QP 0x%x: %v", num, err)
		}
	}
}

// TestQPPoolBoundedAndDrained: the pool keeps at most its size of QPs (the
// others are destroyed), the device lingers after its last connection so
// the next dial reuses its pool, and tearing the device down destroys
// every pooled QP (checkLeaksAtEnd counts the kernel's QPs).
func TestQPPoolBoundedAndDrained(t *testing.T) {
	checkLeaksAtEnd(t)
	ln := listenTest(t, nil)
	wg := echoServer(ln)
	var conns []*Conn
	for i := range 4 {
		conns = append(conns, dialEcho(t, ln, i))
	}
	if !qpPoolOnDevice(t, conns[0]) {
		for _, c := range conns {
			c.Close()
		}
		ln.Close()
		wg.Wait()
		return
	}
	d := conns[0].dev
	d.QPMax.Store(3)
	d.LingerFor.Store(int64(time.Hour)) // the linger ends by device.FlushLingering below
	for _, c := range conns {
		c.Close()
	}
	ln.Close()
	wg.Wait()
	// 8 QPs (both ends of 4 connections) retire: 3 kept, 5 destroyed.
	waitPool(t, d, "all 8 QPs retired", func(st device.QPPoolStats, _ int) bool { return st.Returned+st.Destroyed >= 8 })
	st, n := poolStats(d)
	if n != 3 || st.Returned != 3 || st.Destroyed != 5 {
		t.Fatalf("pool bounded at 3: %d pooled, %+v", n, st)
	}
	settle := rdmatest.Settle
	rdmatest.Settle = func() {} // settling would end the device's linger
	defer func() { rdmatest.Settle = settle }()
	qps := rdmatest.Resources(t)["qp"]

	// No connection is left: the device lingers with its pool.
	if !d.Lingering() {
		t.Fatal("the device did not linger after its last connection")
	}
	ln2 := listenTest(t, nil)
	wg2 := echoServer(ln2)
	c := dialEcho(t, ln2, 10)
	if c.dev != d || !c.ep.reused {
		t.Fatalf("a dial after the last close did not reuse the lingering device's pool (same device %v, reused %v)",
			c.dev == d, c.ep.reused)
	}
	if got := rdmatest.Resources(t)["qp"]; got > qps {
		t.Errorf("kernel QPs went from %d to %d for a connection on pooled QPs", qps, got)
	}
	c.Close()
	ln2.Close()
	wg2.Wait()
	waitPool(t, d, "the QPs back", func(_ device.QPPoolStats, n int) bool { return n == 3 })
	rdmatest.Settle = settle
	device.FlushLingering() // as the linger's end does
	deadline := time.Now().Add(rdmatest.Scale(5 * time.Second))
	for {
		poolClosed := d.QPs.Closed()
		if st, n := poolStats(d); n == 0 && st.Drained == 3 && poolClosed {
			break
		}
		if time.Now().After(deadline) {
			st, n := poolStats(d)
			t.Fatalf("the device's teardown did not drain its pool: %d left, %+v", n, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pooledQPs is how many reset QPs the devices' pools hold: owned by the
// devices, not leaked (the leak checks subtract them from the QP count).
func pooledQPs() int {
	n := 0
	for _, d := range device.All() {
		n += d.QPs.Len()
	}
	return n
}

// TestQPPoolConfig: the device takes its pool size and linger from its
// first connection's Config; QPPool < 0 keeps no QP, DeviceLinger < 0 tears
// the device down with its last connection.
func TestQPPoolConfig(t *testing.T) {
	checkLeaksAtEnd(t)
	settleDevices(rdmatest.Scale(15 * time.Second)) // a fresh device takes this test's Config
	cfg := Config{QPPool: -1, DeviceLinger: -1}
	ln := listenTest(t, &cfg)
	wg := echoServer(ln)
	defer wg.Wait()
	defer ln.Close()
	dl := Dialer{Config: cfg}
	nc, err := dl.DialContext(context.Background(), "rdma", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := nc.(*Conn)
	if err := echo(c, 0); err != nil {
		t.Fatal(err)
	}
	d := c.dev
	if d.QPMax.Load() != 0 || d.LingerFor.Load() != 0 {
		t.Fatalf("device settings: pool %d, linger %v; want 0, 0", d.QPMax.Load(), time.Duration(d.LingerFor.Load()))
	}
	c.Close()
	// Both ends closed, nothing pooled, nothing lingers: the device goes.
	deadline := time.Now().Add(rdmatest.Scale(5 * time.Second))
	for {
		if !d.Registered() {
			break
		}
		if time.Now().After(deadline) {
			st, n := poolStats(d)
			t.Fatalf("the device outlived its last connection with DeviceLinger < 0 (pool %+v, %d pooled)", st, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st, n := poolStats(d); st.Returned != 0 || n != 0 {
		t.Fatalf("QPPool < 0 pooled QPs: %+v, %d", st, n)
	}

	cfg = Config{QPPool: 5, DeviceLinger: 3 * time.Minute}
	dl = Dialer{Config: cfg}
	nc, err = dl.DialContext(context.Background(), "rdma", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c = nc.(*Conn)
	if d := c.dev; d.QPMax.Load() != 5 || time.Duration(d.LingerFor.Load()) != 3*time.Minute {
		t.Fatalf("device settings: pool %d, linger %v; want 5, 3m", d.QPMax.Load(), time.Duration(d.LingerFor.Load()))
	}
}
