//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/cmsetup"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// halfOpen is a raw dialer that sends a valid connect request and then
// never finishes the handshake (no QP behind it, no RTU): what a SYN flood
// is to TCP. Where the CM connects the QPs itself (iWARP) a connect needs
// a real QP, and the handshake ends at the dialer's first message, which
// it never sends.
type halfOpen struct {
	ch *rdmacm.Channel
	id *rdmacm.ID
	qp *verbs.QP // iWARP only
}

var fakeQPN uint32 = 0x4000

// rawQPs makes the half-open dialers' QPs on a device where the CM
// connects QPs (iWARP); nil elsewhere. Made before a test counts what the
// process holds (its device context holds descriptors), closed at the
// test's end.
type rawQPs struct {
	ctx *verbs.Context
	pd  *verbs.PD
	cq  *verbs.CQ
	lim verbs.PortLimits
}

func newRawQPs(t *testing.T) *rawQPs {
	t.Helper()
	if !testDeviceCaps(t).CMConnectsQP {
		return nil
	}
	ctx, err := verbs.OpenDevice(rdmatest.Require(t).Device)
	if err != nil {
		t.Fatal(err)
	}
	r := &rawQPs{ctx: ctx}
	t.Cleanup(func() {
		if r.cq != nil {
			r.cq.Close()
		}
		if r.pd != nil {
			r.pd.Close()
		}
		ctx.Close()
	})
	attr, err := ctx.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	port, err := ctx.QueryPort(1)
	if err != nil {
		t.Fatal(err)
	}
	r.lim = port.Limits(attr)
	if r.pd, err = ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if r.cq, err = ctx.CreateCQ(256, nil); err != nil {
		t.Fatal(err)
	}
	return r
}

// qp returns a new QP in INIT, as an iWARP connect needs.
func (r *rawQPs) qp(t *testing.T) *verbs.QP {
	t.Helper()
	qp, err := r.pd.CreateQP(verbs.QPConfig{Type: verbs.QPTypeRC, SendCQ: r.cq, RecvCQ: r.cq, SendWR: 2, RecvWR: 2, IWARP: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.Modify(&verbs.QPAttr{State: verbs.StateInit, AccessFlags: verbs.AccessLocalWrite},
		verbs.AttrState|verbs.AttrAccessFlags, r.lim); err != nil {
		qp.Close()
		t.Fatal(err)
	}
	return qp
}

// openHalf sends the connect request. Each gets its own (made-up) QP
// number: the CM refuses a request naming a QP it already has a
// connection for as stale. With raw (iWARP), the QP is real.
func openHalf(t *testing.T, addr string, raw *rawQPs) *halfOpen {
	t.Helper()
	ch, err := rdmacm.NewChannel()
	if err != nil {
		t.Fatal(err)
	}
	id, err := ch.CreateID()
	if err != nil {
		ch.Close()
		t.Fatal(err)
	}
	h := &halfOpen{ch: ch, id: id}
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(5*time.Second))
	defer cancel()
	step := func(err error, want rdmacm.EventType) {
		t.Helper()
		if err == nil {
			_, err = cmsetup.Expect(ctx, ch, want, "")
		}
		if err != nil {
			h.close()
			t.Fatal(err)
		}
	}
	step(id.ResolveAddr(netip.AddrPort{}, netip.MustParseAddrPort(addr), 2000), rdmacm.EventAddrResolved)
	step(id.ResolveRoute(2000), rdmacm.EventRouteResolved)
	fakeQPN++
	qpn := fakeQPN
	if raw != nil {
		h.qp = raw.qp(t)
		qpn = h.qp.Num
	}
	// It announces what a dialer of this version does (trailers: a
	// listener that needs them, iWARP or RDMA_TEST_TRAILERS, holds it as
	// long as any other).
	hello := wire.Hello{Version: wire.Version, Minor: wire.Minor, Credits: 64, RecvBufSize: 32 << 10, MaxMsgSize: 32 << 10,
		Features: wire.FeatureTrailers | wire.FeatureControlReserve}
	if err := id.Connect(rdmacm.ConnParam{PrivateData: hello.AppendTo(nil), RetryCount: 7, RNRRetryCount: 6,
		QPNum: qpn, Blocking: raw != nil}); err != nil {
		h.close()
		t.Fatal(err)
	}
	return h
}

func (h *halfOpen) close() {
	h.id.Destroy()
	h.ch.Close()
	if h.qp != nil {
		h.qp.Close()
	}
}

// held is what a listener holds for its handshakes in progress: QPs,
// cm_ids, descriptors and goroutines.
type held struct{ qp, cmID, fd, g int }

// holding counts the process's QPs, cm_ids, descriptors (less the event
// channels kept idle for reuse, two descriptors each, which no listener
// holds) and goroutines.
func holding(t *testing.T) held {
	t.Helper()
	res := rdmatest.Resources(t)
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return held{qp: res["qp"], cmID: res["cm_id"], fd: len(ents) - 2*rdmacm.IdleChannels(), g: runtime.NumGoroutine()}
}

// listenerHeld is what the listener holds in now beyond base, with raw
// dialers open: each of them holds one cm_id and one event channel (two
// descriptors) of its own, and no goroutine; rawQPs of them hold a QP.
func listenerHeld(now, base held, raw, rawQPs int) held {
	return held{qp: now.qp - base.qp - rawQPs, cmID: now.cmID - base.cmID - raw, fd: now.fd - base.fd - 2*raw, g: now.g - base.g}
}

// TestHalfOpenFlood: Backlog + 20 dialers that never finish their
// handshake do not lock out a well-behaved one: the oldest half-open
// handshakes are dropped to make room, the listener's resources stay
// bounded by the backlog (the QPs, cm_ids, descriptors and goroutines it
// holds for the flood are at most Backlog times what one half-open
// handshake holds), and a normal Dial made during the flood succeeds;
// the listener keeps serving afterwards.
func TestHalfOpenFlood(t *testing.T) {
	const backlog = 8
	cfg := &Config{Backlog: backlog, HandshakeTimeout: rdmatest.Scale(2 * time.Second)}
	c, s, ln := connPair(t, cfg) // the device stays set up through the flood
	defer ln.Close()
	defer c.Close()
	defer s.Close()
	addr := ln.Addr().String()
	raw := newRawQPs(t)
	var flood []*halfOpen
	defer func() {
		for _, h := range flood {
			h.close()
		}
	}()
	rawQPs := func() int {
		if raw == nil {
			return 0
		}
		return len(flood)
	}
	inProgress := func() int {
		ln.mu.Lock()
		defer ln.mu.Unlock()
		return len(ln.halfOpen)
	}
	base := holding(t)
	// What one half-open handshake holds, once it waits for the dialer's
	// RTU (its QP is created before the listener accepts).
	flood = append(flood, openHalf(t, addr, raw))
	for deadline := time.Now().Add(rdmatest.Scale(5 * time.Second)); ; time.Sleep(20 * time.Millisecond) {
		if one := listenerHeld(holding(t), base, len(flood), rawQPs()); inProgress() == 1 && one.qp == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("one half-open dialer: %d handshakes in progress, listener holds %+v", inProgress(), listenerHeld(holding(t), base, len(flood), rawQPs()))
		}
	}
	one := listenerHeld(holding(t), base, len(flood), rawQPs())
	t.Logf("one half-open handshake holds %+v", one)
	bound := held{qp: backlog * one.qp, cmID: backlog * one.cmID, fd: backlog * one.fd, g: backlog*max(one.g, 1) + 2}
	floodStart := time.Now()
	for len(flood) < backlog+20 {
		flood = append(flood, openHalf(t, addr, raw))
	}
	// The dropped handshakes end at once, not at their HandshakeTimeout:
	// well within it, the listener holds no more than the bound.
	var now held
	for deadline := floodStart.Add(cfg.HandshakeTimeout / 2); ; time.Sleep(20 * time.Millisecond) {
		now = listenerHeld(holding(t), base, len(flood), rawQPs())
		if now.qp <= bound.qp && now.cmID <= bound.cmID && now.fd <= bound.fd && now.g <= bound.g {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d half-open dialers the listener holds %+v, more than Backlog (%d) half-open handshakes (%+v)",
				len(flood), now, backlog, bound)
		}
	}
	dropped := ln.Stats().Dropped
	t.Logf("after %d half-open dialers: listener holds %+v (bound %+v), %d handshakes in progress, %d dropped",
		len(flood), now, bound, inProgress(), dropped)
	if dropped == 0 {
		t.Fatalf("no handshake dropped for %d half-open dialers, backlog %d", len(flood), backlog)
	}
	// A well-behaved dialer gets through during the flood.
	d := Dialer{Config: *cfg, Timeout: rdmatest.Scale(10 * time.Second)}
	accepted := make(chan error, 1)
	go func() {
		a, err := ln.AcceptRDMA()
		if err == nil {
			a.Close()
		}
		accepted <- err
	}()
	start := time.Now()
	nc, err := d.DialContext(context.Background(), "rdma", addr)
	if err != nil {
		t.Fatalf("dial during the flood: %v", err)
	}
	t.Logf("dial during the flood took %v", time.Since(start))
	nc.Close()
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	// More half-opens keep dropping the oldest.
	for i := 0; i < 10; i++ {
		flood = append(flood, openHalf(t, addr, raw))
	}
	n, more := inProgress(), ln.Stats().Dropped-dropped
	if n > backlog || more == 0 {
		t.Fatalf("%d in progress (backlog %d), %d more dropped", n, backlog, more)
	}
	// Once the flood is gone, every half-open handshake ends by the
	// handshake timeout at the latest.
	halfOpened := len(flood)
	for _, h := range flood {
		h.close()
	}
	flood = nil
	deadline := time.Now().Add(cfg.HandshakeTimeout + rdmatest.Scale(3*time.Second))
	for {
		n := inProgress()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d handshakes still in progress after the handshake timeout", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The listener's stats: the pair's and the flood's well-behaved
	// dialer accepted; the half-open handshakes that were not dropped
	// ended as failures (at their timeout, or when their dialer left),
	// the latest with its reason.
	st := ln.Stats()
	t.Logf("listener stats: %+v", st)
	if st.Accepted != 2 || st.Dropped == 0 || st.Failed == 0 || st.LastFailure == nil {
		t.Errorf("listener stats %+v: want Accepted 2 and some dropped and failed handshakes, with the last failure's reason", st)
	}
	if got := st.Dropped + st.Failed; got > uint64(halfOpened) {
		t.Errorf("%d handshakes dropped or failed, more than the %d half-open dialers", got, halfOpened)
	}
}

// TestCloseEndsHalfOpen: a listener's Close ends the handshakes in
// progress at once (their contexts derive from the listener's), not at
// their HandshakeTimeout: with dialers that never finish and a timeout of
// a minute, Close returns well within it.
func TestCloseEndsHalfOpen(t *testing.T) {
	checkLeaksAtEnd(t)
	ln := listenTest(t, &Config{HandshakeTimeout: time.Minute})
	addr := ln.Addr().String()
	raw := newRawQPs(t)
	var flood []*halfOpen
	defer func() {
		for _, h := range flood {
			h.close()
		}
	}()
	for range 4 {
		flood = append(flood, openHalf(t, addr, raw))
	}
	deadline := time.Now().Add(rdmatest.Scale(10 * time.Second))
	for {
		ln.mu.Lock()
		n := len(ln.halfOpen)
		ln.mu.Unlock()
		if n == len(flood) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d handshakes in progress", n, len(flood))
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- ln.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("Close with %d handshakes in progress took %v", len(flood), time.Since(start))
	case <-time.After(rdmatest.Scale(20 * time.Second)):
		t.Fatal("Close waited for the handshakes in progress (HandshakeTimeout 1 min) instead of ending them")
	}
}

// TestAdmitHook: a ListenConfig.Admit that refuses is answered before
// anything is committed to the dialer (no QP is created for it), and the
// dialer reads the hook's reason; one that admits lets it in.
func TestAdmitHook(t *testing.T) {
	env := rdmatest.Require(t)
	checkLeaksAtEnd(t)
	var calls atomic.Int32 // the hook runs on goroutines of its own
	var refuse atomic.Bool
	lc := ListenConfig{Admit: func(remote netip.AddrPort) error {
		calls.Add(1)
		if refuse.Load() {
			return fmt.Errorf("%s is not on the allow list", remote.Addr())
		}
		return nil
	}}
	// Keep the device set up (and its QP count steady) with one connection.
	ln, err := lc.Listen(context.Background(), "rdma", env.Addr+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan *Conn, 4)
	go func() {
		for {
			a, err := ln.AcceptRDMA()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- a
		}
	}()
	d := Dialer{Timeout: rdmatest.Scale(10 * time.Second)}
	keep, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	srv := <-accepted
	defer srv.Close()
	qps := rdmatest.Resources(t)["qp"]

	refuse.Store(true)
	for i := 0; i < 20; i++ {
		_, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
		if err == nil || !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), "not on the allow list") {
			t.Fatalf("refused dial: %v, want ErrHandshake with the hook's reason", err)
		}
		if i == 0 {
			t.Logf("refused: %v", err)
		}
	}
	if got := rdmatest.Resources(t)["qp"]; got != qps {
		t.Fatalf("QPs %d after 20 refused dials, %d before", got, qps)
	}
	refuse.Store(false)
	nc, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	(<-accepted).Close()
	if n := calls.Load(); n != 22 {
		t.Fatalf("Admit called %d times, want 22", n)
	}
}
