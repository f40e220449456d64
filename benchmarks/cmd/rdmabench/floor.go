//go:build linux && cgo

package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/verbs"
)

// The Go floor (case go-floor): ib_send_lat's send/receive ping-pong written
// straight against the verbs calls the library's data path makes
// (internal/verbs, through its fast calls unless VERBLINE_CGO=safe), with
// none of the library's logic (rings, credits, locks, waiters) on the path:
// what a Go program pays per round trip for the calls alone, measured in
// two processes pinned as perftest's.
//
// As with ib_send_lat -R, the two processes connect through rdma_cm. Each
// has one PD, one MR over its send and receive buffers, one CQ for both
// directions and an RC QP that rdma_cm's attributes move to RTS. Every send
// is signaled, and inline when the size fits ib_send_lat's default inline
// size; each side busy-polls its CQ on a locked thread until the peer's
// message and its own send's completion have both arrived, and reposts its
// receive in the same call into C as its next send. The client times each
// round trip from its post to the reply; the server answers each message
// with one of the same size.

const (
	floorInline  = 236              // ib_send_lat's default inline size for an RC send
	floorQueue   = 16               // send and receive queue sizes (one of each is in flight)
	floorTimeout = 30 * time.Second // a connection step, or a wait with no completion
	floorRetry   = 7                // ConnParam retry and RNR retry counts, as perftest's
	// floorIWARPSettle is how long an iWARP client waits after ESTABLISHED
	// before its first message.
	floorIWARPSettle = 20 * time.Millisecond
	floorWRSend      = 1
	floorWRRecv      = 2
)

// runFloorChild is runChild for the floor: "-serve" listens through rdma_cm
// on addr (port 0), prints "ready ADDR" and serves one connection;
// "-client ADDR" connects and prints "result {json Sample}".
func runFloorChild(serve bool, connect string, a childArgs, addr string) error {
	stop, err := startProfile(serve)
	if err != nil {
		return err
	}
	defer stop()
	if serve {
		return floorServe(a, addr, func(ready netip.AddrPort) { fmt.Printf("ready %s\n", ready) })
	}
	s, err := floorClient(a, connect)
	if err != nil {
		return err
	}
	printResult(s)
	return nil
}

// floorServe listens on addr, calls ready with the address to connect to,
// accepts one connection and answers a.warmup+a.iters messages.
func floorServe(a childArgs, addr string, ready func(netip.AddrPort)) (err error) {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return fmt.Errorf("-addr %q: %w", addr, err)
	}
	ch, err := rdmacm.NewChannel()
	if err != nil {
		return err
	}
	defer ch.Close()
	lid, err := ch.CreateID()
	if err != nil {
		return err
	}
	defer lid.Destroy()
	if err := lid.BindAddr(netip.AddrPortFrom(ip, 0)); err != nil {
		return fmt.Errorf("listen on %s: %w", ip, err)
	}
	if err := lid.Listen(1); err != nil {
		return fmt.Errorf("listen on %s: %w", ip, err)
	}
	ready(lid.LocalAddr())
	req, err := floorEvent(ch, rdmacm.EventConnectRequest, 0)
	if err != nil {
		return err
	}
	id := req.ID
	ch.Adopt(id)
	defer id.Destroy()
	if err := lid.Destroy(); err != nil {
		return err
	}
	e, err := newFloorEnd(id, a.size)
	if err != nil {
		id.Reject(nil)
		return err
	}
	defer e.close()
	states := []verbs.QPState{verbs.StateInit, verbs.StateRTR, verbs.StateRTS}
	if e.iwarp {
		states = states[:1] // the iWARP CM takes the QP to RTS at accept
	}
	if err := e.moveTo(states...); err != nil {
		id.Reject(nil)
		return err
	}
	if err := e.qp.PostRecv(e.recv); err != nil {
		id.Reject(nil)
		return err
	}
	if err := id.Accept(rdmacm.ConnParam{ResponderResources: 1, InitiatorDepth: 1,
		RetryCount: floorRetry, RNRRetryCount: floorRetry, QPNum: e.qp.Num, Blocking: e.iwarp}); err != nil {
		return err
	}
	if _, err := floorEvent(ch, rdmacm.EventEstablished, floorTimeout); err != nil {
		return err
	}
	if e.iwarp {
		e.qp.ConnectedByCM()
	}
	if err := e.serve(a.warmup + a.iters); err != nil {
		return err
	}
	if _, err := floorEvent(ch, rdmacm.EventDisconnected, floorTimeout); err != nil {
		return err
	}
	if err := id.Disconnect(); err != nil {
		return err
	}
	return errors.Join(e.close(), id.Destroy())
}

// floorClient connects to connect ("ip:port"), runs a.warmup untimed and
// a.iters timed round trips and returns their one-way latencies.
func floorClient(a childArgs, connect string) (*Sample, error) {
	dst, err := netip.ParseAddrPort(connect)
	if err != nil {
		return nil, fmt.Errorf("-client %q: %w", connect, err)
	}
	ch, err := rdmacm.NewChannel()
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	id, err := ch.CreateID()
	if err != nil {
		return nil, err
	}
	defer id.Destroy()
	ms := int(floorTimeout / time.Millisecond)
	if err := id.ResolveAddr(netip.AddrPort{}, dst, ms); err != nil {
		return nil, err
	}
	if _, err := floorEvent(ch, rdmacm.EventAddrResolved, floorTimeout); err != nil {
		return nil, err
	}
	if err := id.ResolveRoute(ms); err != nil {
		return nil, err
	}
	if _, err := floorEvent(ch, rdmacm.EventRouteResolved, floorTimeout); err != nil {
		return nil, err
	}
	e, err := newFloorEnd(id, a.size)
	if err != nil {
		return nil, err
	}
	defer e.close()
	if err := e.moveTo(verbs.StateInit); err != nil {
		return nil, err
	}
	if err := e.qp.PostRecv(e.recv); err != nil {
		return nil, err
	}
	if err := id.Connect(rdmacm.ConnParam{ResponderResources: 1, InitiatorDepth: 1,
		RetryCount: floorRetry, RNRRetryCount: floorRetry, QPNum: e.qp.Num, Blocking: e.iwarp}); err != nil {
		return nil, err
	}
	if e.iwarp {
		// The iWARP CM connects the QP itself; the client sends first, as
		// iWARP requires.
		if _, err := floorEvent(ch, rdmacm.EventEstablished, floorTimeout); err != nil {
			return nil, err
		}
		e.qp.ConnectedByCM()
		// Soft-iWARP leaves a message unread that reaches the server
		// while its accept is still handing the socket to the QP (the
		// library repeats its first message for that: docs/devices.md);
		// the floor, which sends its first ping once, gives the accept
		// time to finish instead.
		time.Sleep(floorIWARPSettle)
	} else {
		if _, err := floorEvent(ch, rdmacm.EventConnectResponse, floorTimeout); err != nil {
			return nil, err
		}
		if err := e.moveTo(verbs.StateRTR, verbs.StateRTS); err != nil {
			return nil, err
		}
		if err := id.Establish(); err != nil {
			return nil, err
		}
	}
	rtts, err := e.pingPong(a.warmup, a.iters)
	if err != nil {
		return nil, err
	}
	if err := id.Disconnect(); err != nil {
		return nil, err
	}
	if _, err := floorEvent(ch, rdmacm.EventDisconnected, floorTimeout); err != nil {
		return nil, err
	}
	if err := errors.Join(e.close(), id.Destroy()); err != nil {
		return nil, err
	}
	return latencySample(rtts), nil
}

// floorEvent waits up to timeout (0: no limit) for ch's next event, which
// must be want.
func floorEvent(ch *rdmacm.Channel, want rdmacm.EventType, timeout time.Duration) (rdmacm.Event, error) {
	ctx := context.Background()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	ev, err := ch.Next(ctx)
	if err != nil {
		return ev, fmt.Errorf("rdma_cm: waiting for %s: %w", want, err)
	}
	if ev.Type != want {
		return ev, fmt.Errorf("rdma_cm: waiting for %s, got %s (status %d)", want, ev.Type, ev.Status)
	}
	return ev, nil
}

// floorEnd is one side's verbs objects on the device of its rdma_cm id.
type floorEnd struct {
	id      *rdmacm.ID
	lim     verbs.PortLimits
	pd      *verbs.PD
	mem     []byte // mmap'd: the send buffer, then the receive buffer
	mr      *verbs.MR
	cq      *verbs.CQ
	qp      *verbs.QP
	size    int
	send    []verbs.SendWR
	recv    []verbs.RecvWR
	wcs     []verbs.WC
	iwarp   bool // the CM connects the QP (iWARP): INIT only, and the client sends first
	pending int  // sends posted whose completion has not been polled
}

// newFloorEnd creates the PD, buffers, MR, CQ and QP (in RESET) of a side
// exchanging size-byte messages.
func newFloorEnd(id *rdmacm.ID, size int) (_ *floorEnd, err error) {
	if size < 1 {
		return nil, fmt.Errorf("message size %d: the floor needs at least 1 byte", size)
	}
	ctx, err := id.Context()
	if err != nil {
		return nil, err
	}
	port, err := ctx.QueryPort(id.PortNum())
	if err != nil {
		return nil, err
	}
	dev, err := ctx.QueryDevice()
	if err != nil {
		return nil, err
	}
	e := &floorEnd{id: id, lim: port.Limits(dev), size: size, wcs: make([]verbs.WC, 16),
		iwarp: dev.Transport == verbs.TransportIWARP}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.pd, err = ctx.AllocPD(); err != nil {
		return nil, err
	}
	slot := (size + 63) &^ 63
	if e.mem, err = unix.Mmap(-1, 0, 2*slot, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", 2*slot, err)
	}
	copy(e.mem, pattern(size))
	if e.mr, err = e.pd.RegMR(e.mem, verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	if e.cq, err = ctx.CreateCQ(2*floorQueue, nil); err != nil {
		return nil, err
	}
	cfg := verbs.QPConfig{Type: verbs.QPTypeRC, SendCQ: e.cq, RecvCQ: e.cq, SendWR: floorQueue, RecvWR: floorQueue,
		InlineData: floorInline, IWARP: e.iwarp}
	if e.qp, err = e.pd.CreateQP(cfg); err != nil {
		// A device with a smaller inline limit: no inline sends.
		cfg.InlineData = 0
		var err0 error
		if e.qp, err0 = e.pd.CreateQP(cfg); err0 != nil {
			return nil, err
		}
		err = nil
	}
	e.send = []verbs.SendWR{{WRID: floorWRSend, Addr: e.mr.Addr(), Len: uint32(size), LKey: e.mr.LKey,
		Opcode: verbs.OpSend, Flags: floorSendFlags(size, e.qp.MaxInline)}}
	e.recv = []verbs.RecvWR{{WRID: floorWRRecv, Addr: e.mr.Addr() + uint64(slot), Len: uint32(size), LKey: e.mr.LKey}}
	return e, nil
}

// floorSendFlags: every send signaled (ib_send_lat's latency test signals
// each), inline when size fits both ib_send_lat's default inline size and
// the QP's inline limit.
func floorSendFlags(size, maxInline int) uint32 {
	if size <= min(floorInline, maxInline) {
		return verbs.SendSignaled | verbs.SendInline
	}
	return verbs.SendSignaled
}

// moveTo moves the QP through states with the attributes rdma_cm computes.
func (e *floorEnd) moveTo(states ...verbs.QPState) error {
	for _, s := range states {
		attr, mask, err := e.id.InitQPAttr(s)
		if err != nil {
			return err
		}
		if err := e.qp.Modify(&attr, mask, e.lim); err != nil {
			return fmt.Errorf("QP to %s: %w", s, err)
		}
	}
	return nil
}

// pingPong is the client: warmup untimed, then iters timed round trips,
// each a post of the message (with the receive for its reply, after the
// first) and a busy poll until the reply and the send's completion.
func (e *floorEnd) pingPong(warmup, iters int) ([]time.Duration, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rtts := make([]time.Duration, 0, iters)
	for i := range warmup + iters {
		start := time.Now()
		phase(phaseSend)
		if err := e.post(i > 0); err != nil {
			return nil, fmt.Errorf("round trip %d: %w", i, err)
		}
		phase(phaseRecv)
		if err := e.await(true); err != nil {
			return nil, fmt.Errorf("round trip %d: %w", i, err)
		}
		d := time.Since(start)
		phase(phaseOther)
		if i >= warmup {
			rtts = append(rtts, d)
		}
	}
	return rtts, nil
}

// serve is the server: n times, a busy poll until the next message and
// the previous answer's completion, then a post of the answer with the
// receive for the next message.
func (e *floorEnd) serve(n int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for i := range n {
		phase(phaseRecv)
		if err := e.await(true); err != nil {
			return fmt.Errorf("message %d of %d: %w", i, n, err)
		}
		phase(phaseSend)
		if err := e.post(i < n-1); err != nil {
			return fmt.Errorf("answer %d of %d: %w", i, n, err)
		}
	}
	phase(phaseOther)
	if err := e.await(false); err != nil {
		return fmt.Errorf("answer %d of %d: %w", n-1, n, err)
	}
	return nil
}

// post posts the message, after the receive for the next one when
// withRecv (one call into C either way).
func (e *floorEnd) post(withRecv bool) error {
	e.pending++
	if withRecv {
		_, err := e.qp.PostRecvSend(e.recv, e.send)
		return err
	}
	return e.qp.PostSend(e.send)
}

// await busy-polls the CQ until every posted send has completed and, with
// recv, the peer's message has arrived. It gives up after floorTimeout
// with no completion (the peer is gone).
func (e *floorEnd) await(recv bool) error {
	var idle int
	var since time.Time
	for recv || e.pending > 0 {
		k, err := e.cq.PollTries(e.wcs, 16)
		if err != nil {
			return err
		}
		if k == 0 {
			if idle++; idle%4096 == 0 {
				if since.IsZero() {
					since = time.Now()
				} else if time.Since(since) > floorTimeout {
					return fmt.Errorf("no completion for %v (the peer is gone?)", floorTimeout)
				}
			}
			continue
		}
		idle, since = 0, time.Time{}
		for i := range e.wcs[:k] {
			wc := &e.wcs[i]
			if err := wc.Err(); err != nil {
				return err
			}
			switch wc.WRID {
			case floorWRSend:
				e.pending--
			case floorWRRecv:
				if int(wc.ByteLen) != e.size {
					return fmt.Errorf("received %d bytes, want %d", wc.ByteLen, e.size)
				}
				recv = false
			}
		}
	}
	return nil
}

// close destroys what newFloorEnd made, QP first. Idempotent.
func (e *floorEnd) close() error {
	var errs []error
	if e.qp != nil {
		errs = append(errs, e.qp.Close())
		e.qp = nil
	}
	if e.cq != nil {
		errs = append(errs, e.cq.Close())
		e.cq = nil
	}
	if e.mr != nil {
		if err := e.mr.Close(); err != nil {
			// The memory stays mapped: the device may still write it.
			return errors.Join(append(errs, err)...)
		}
		e.mr = nil
	}
	if e.mem != nil {
		errs = append(errs, unix.Munmap(e.mem))
		e.mem = nil
	}
	if e.pd != nil {
		errs = append(errs, e.pd.Close())
		e.pd = nil
	}
	return errors.Join(errs...)
}
