//go:build linux && cgo

package rdmacm

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/verbs"
)

func next(t *testing.T, c *Channel, want EventType) Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(10*time.Second))
	defer cancel()
	ev, err := c.Next(ctx)
	if err != nil {
		t.Fatalf("waiting for %s: %v", want, err)
	}
	if ev.Type != want {
		t.Fatalf("got event %s (status %d), want %s", ev.Type, ev.Status, want)
	}
	return ev
}

// channelID is a new channel and an id on it, destroyed (the id first) and
// closed when t ends.
func channelID(t testing.TB) (*Channel, *ID) {
	t.Helper()
	ch, err := NewChannel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	id, err := ch.CreateID()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { id.Destroy() })
	return ch, id
}

// endpoint is an RC QP on an id's device (newEndpoint); moveTo moves it to
// a state through the validated table with the attributes rdma_cm computes.
type endpoint struct {
	pd    *verbs.PD
	cq    *verbs.CQ
	qp    *verbs.QP
	lim   verbs.PortLimits
	iwarp bool // the CM connects the QP (INIT only here) and a connect may block
}

func newEndpoint(t *testing.T, id *ID) *endpoint {
	ctx := verbs.WrapContext(id.Verbs())
	port, err := ctx.QueryPort(id.PortNum())
	if err != nil {
		t.Fatal(err)
	}
	dev, err := ctx.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	e := &endpoint{lim: port.Limits(dev), iwarp: dev.Transport == verbs.TransportIWARP}
	if e.pd, err = ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.cq, err = ctx.CreateCQ(8, nil); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = e.pd.CreateQP(verbs.QPConfig{Type: verbs.QPTypeRC, SendCQ: e.cq, RecvCQ: e.cq, SendWR: 4, RecvWR: 4,
		IWARP: e.iwarp}); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *endpoint) moveTo(t *testing.T, id *ID, s verbs.QPState) {
	t.Helper()
	attr, mask, err := id.InitQPAttr(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.qp.Modify(&attr, mask, e.lim); err != nil {
		t.Fatal(err)
	}
}

func (e *endpoint) close() {
	e.qp.Close()
	e.cq.Close()
	e.pd.Close()
}

// bothCallForms runs f with the set-up calls in their fast form
// (fastcall.go) and through cgo (VERBLINE_CGO=safe).
func bothCallForms(t *testing.T, f func(t *testing.T)) {
	for _, fast := range []bool{true, false} {
		name := map[bool]string{true: "fast", false: "cgo"}[fast]
		t.Run(name, func(t *testing.T) {
			old := verbs.SetFastCalls(fast)
			defer verbs.SetFastCalls(old)
			f(t)
		})
	}
}

// TestConnectAcceptDisconnect walks the whole rdma_cm life cycle on RDMA_TEST_ADDR:
// listen on port 0, resolve, connect with private data, accept, established,
// disconnect on both sides, in both call forms.
func TestConnectAcceptDisconnect(t *testing.T) {
	env := rdmatest.Require(t)
	bothCallForms(t, func(t *testing.T) { connectAcceptDisconnect(t, env) })
}

// connectAcceptDisconnect drives every set-up call: create, resolve,
// connect with private data, migrate, accept, establish, disconnect.
func connectAcceptDisconnect(t *testing.T, env rdmatest.Env) {
	addr := netip.MustParseAddr(env.Addr)

	lch, lid := channelID(t)
	if err := lid.BindAddr(netip.AddrPortFrom(addr, 0)); err != nil {
		t.Fatal(err)
	}
	if err := lid.Listen(8); err != nil {
		t.Fatal(err)
	}
	laddr := lid.LocalAddr()
	if laddr.Port() == 0 || laddr.Addr() != addr {
		t.Fatalf("listener address %v, want %v with a port", laddr, addr)
	}

	cch, cid := channelID(t)
	if err := cid.ResolveAddr(netip.AddrPort{}, laddr, 2000); err != nil {
		t.Fatal(err)
	}
	next(t, cch, EventAddrResolved)
	if err := cid.ResolveRoute(2000); err != nil {
		t.Fatal(err)
	}
	next(t, cch, EventRouteResolved)
	ce := newEndpoint(t, cid)
	defer ce.close()
	ce.moveTo(t, cid, verbs.StateInit)
	if err := cid.Connect(ConnParam{PrivateData: []byte("hello-req"), ResponderResources: 1, InitiatorDepth: 1,
		RetryCount: 7, RNRRetryCount: 7, QPNum: ce.qp.Num, Blocking: ce.iwarp}); err != nil {
		t.Fatal(err)
	}

	req := next(t, lch, EventConnectRequest)
	if string(req.PrivateData[:9]) != "hello-req" || req.QPNum != ce.qp.Num && !ce.iwarp { // iWARP carries no QP number
		t.Fatalf("request private data %q qpn 0x%x", req.PrivateData, req.QPNum)
	}
	sid := req.ID
	sch, err := NewChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer sch.Close()
	if err := sid.Migrate(sch); err != nil {
		t.Fatal(err)
	}
	defer sid.Destroy()
	se := newEndpoint(t, sid)
	defer se.close()
	states := []verbs.QPState{verbs.StateInit, verbs.StateRTR, verbs.StateRTS}
	if se.iwarp {
		states = states[:1] // the iWARP CM takes the QP to RTS
	}
	for _, s := range states {
		se.moveTo(t, sid, s)
	}
	if err := sid.Accept(ConnParam{PrivateData: []byte("hello-rep"), ResponderResources: 1, InitiatorDepth: 1,
		RNRRetryCount: 7, QPNum: se.qp.Num, Blocking: se.iwarp}); err != nil {
		t.Fatal(err)
	}

	if ce.iwarp {
		// iWARP: the dialer learns the answer from ESTABLISHED; the CM
		// connected its QP.
		rep := next(t, cch, EventEstablished)
		if string(rep.PrivateData[:9]) != "hello-rep" {
			t.Fatalf("response private data %q", rep.PrivateData)
		}
	} else {
		rep := next(t, cch, EventConnectResponse)
		if string(rep.PrivateData[:9]) != "hello-rep" {
			t.Fatalf("response private data %q", rep.PrivateData)
		}
		ce.moveTo(t, cid, verbs.StateRTR)
		ce.moveTo(t, cid, verbs.StateRTS)
		if err := cid.Establish(); err != nil {
			t.Fatal(err)
		}
	}
	next(t, sch, EventEstablished)
	if got := sid.PeerAddr().Addr(); got != addr {
		t.Fatalf("server sees peer %v", got)
	}

	if err := cid.Disconnect(); err != nil {
		t.Fatal(err)
	}
	next(t, sch, EventDisconnected)
	if err := sid.Disconnect(); err != nil {
		t.Fatal(err)
	}
	next(t, cch, EventDisconnected)
}

// TestSetupCallErrors: a set-up call the kernel refuses returns its
// errno, named by the call, in both call forms (the fast form reads errno
// in the same C call, on the same thread): an address resolved twice
// (EINVAL: the id is no longer idle), and a migrate or an establish on an
// id already destroyed (the library's bug: errDestroyed), and an id made
// on or migrated to a closed channel (net.ErrClosed). (Not calls out
// of order on an id bound to no device: librdmacm dereferences the
// device before it checks, in either form, and the library never makes
// them.)
func TestSetupCallErrors(t *testing.T) {
	env := rdmatest.Require(t)
	dst := netip.AddrPortFrom(netip.MustParseAddr(env.Addr), 1)
	bothCallForms(t, func(t *testing.T) {
		ch, err := NewChannel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		id, err := ch.CreateID()
		if err != nil {
			t.Fatal(err)
		}
		if err := id.ResolveAddr(netip.AddrPort{}, dst, 2000); err != nil {
			t.Fatal(err)
		}
		next(t, ch, EventAddrResolved)
		err = id.ResolveAddr(netip.AddrPort{}, dst, 2000)
		if !errors.Is(err, syscall.EINVAL) || !strings.HasPrefix(err.Error(), "rdma_resolve_addr "+dst.String()+": ") {
			t.Errorf("ResolveAddr again: %v, want rdma_resolve_addr %v: EINVAL", err, dst)
		}
		other, err := NewChannel()
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		if err := id.Destroy(); err != nil {
			t.Fatal(err)
		}
		if err := id.Migrate(other); !errors.Is(err, errDestroyed) {
			t.Errorf("Migrate after Destroy: %v, want errDestroyed", err)
		}
		if err := id.Establish(); !errors.Is(err, errDestroyed) {
			t.Errorf("Establish after Destroy: %v, want errDestroyed", err)
		}
		// A closed channel: no id on it, and no migrate to it (librdmacm
		// would make a synchronous id, whose calls wait for the network).
		closed, err := NewChannel()
		if err != nil {
			t.Fatal(err)
		}
		closed.Close()
		if _, err := closed.CreateID(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("CreateID on a closed channel: %v, want net.ErrClosed", err)
		}
		id2, err := ch.CreateID()
		if err != nil {
			t.Fatal(err)
		}
		defer id2.Destroy()
		if err := id2.Migrate(closed); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Migrate to a closed channel: %v, want net.ErrClosed", err)
		}
	})
}

// TestConnectRefused: nobody listens on the port, the request is rejected quickly.
func TestConnectRefused(t *testing.T) {
	env := rdmatest.Require(t)
	ch, id := channelID(t)
	if err := id.ResolveAddr(netip.AddrPort{}, netip.AddrPortFrom(netip.MustParseAddr(env.Addr), 1), 2000); err != nil {
		t.Fatal(err)
	}
	next(t, ch, EventAddrResolved)
	if err := id.ResolveRoute(2000); err != nil {
		t.Fatal(err)
	}
	next(t, ch, EventRouteResolved)
	e := newEndpoint(t, id)
	defer e.close()
	e.moveTo(t, id, verbs.StateInit)
	err := id.Connect(ConnParam{RetryCount: 7, RNRRetryCount: 7, QPNum: e.qp.Num, Blocking: e.iwarp})
	if e.iwarp && errors.Is(err, syscall.ECONNREFUSED) {
		// iWARP: the connect is a TCP connect, which may be refused in the call.
		t.Logf("refused in the call: %v", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	ev := next(t, ch, EventRejected)
	t.Logf("rejected with status %d", ev.Status)
}
