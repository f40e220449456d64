//go:build linux && cgo

// Package cmsetup holds the rdma_cm steps that connections (dial and
// accept), listeners and datagram endpoints share while they set up:
// event channels and ids, waiting for an event, the errors of the events
// that end a set-up, and rejects. Its errors wrap internal/errs' sentinels
// (ErrNoDevice, ErrNotRDMAAddress with their hints, ErrHandshake) and the
// errno behind them, so errors.Is matches both.
package cmsetup

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/verbline/rdma/internal/errs"
	"github.com/verbline/rdma/internal/hints"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/wire"
)

// CM reject reasons from the IB spec that rdma_cm passes up as event status.
const (
	RejInvalidServiceID = 8  // nobody listens on that port
	RejConsumerDefined  = 28 // the listener refused; the reason is in the private data
)

// NewChannel opens an rdma_cm event channel; without rdma_cm (no
// /dev/infiniband/rdma_cm) the error is errs.ErrNoDevice, with its hint.
func NewChannel() (*rdmacm.Channel, error) {
	ch, err := rdmacm.NewChannel()
	if err != nil {
		return nil, noCM(err)
	}
	return ch, nil
}

// noCM makes rdma_cm's missing device (rdmacm.ErrNoCM) ErrNoDevice, with
// its hint; other errors pass unchanged.
func noCM(err error) error {
	if errors.Is(err, rdmacm.ErrNoCM) {
		return hints.Add(fmt.Errorf("%w (%w)", errs.ErrNoDevice, err))
	}
	return err
}

// NewChannelID creates an event channel and an id on it: what every dial and
// listen starts from.
func NewChannelID() (*rdmacm.Channel, *rdmacm.ID, error) {
	ch, err := NewChannel()
	if err != nil {
		return nil, nil, err
	}
	id, err := ch.CreateID()
	if err != nil {
		ch.Close()
		return nil, nil, err
	}
	return ch, id, nil
}

// WaitEvent waits for the next CM event on ch, bounded by ctx; past ctx's
// deadline the error is os.ErrDeadlineExceeded, as a net.Conn's.
func WaitEvent(ctx context.Context, ch *rdmacm.Channel) (rdmacm.Event, error) {
	ev, err := ch.Next(ctx)
	switch {
	case err == nil:
		return ev, nil
	case errors.Is(err, context.DeadlineExceeded):
		return ev, os.ErrDeadlineExceeded
	case errors.Is(err, rdmacm.ErrChannelClosed):
		return ev, errors.New("rdma_cm event channel closed")
	}
	return ev, err
}

// Expect waits for event want; any other event becomes a descriptive error.
func Expect(ctx context.Context, ch *rdmacm.Channel, want rdmacm.EventType, what string) (rdmacm.Event, error) {
	ev, err := WaitEvent(ctx, ch)
	if err != nil {
		return ev, err
	}
	return ev, CheckEvent(ev, want, what)
}

// CheckEvent is nil if ev is the event wanted, else a descriptive error.
// It first traces ev's delivery (TraceDelivery), if a trace is set.
func CheckEvent(ev rdmacm.Event, want rdmacm.EventType, what string) error {
	TraceDelivery(ev, "")
	if ev.Type == want {
		return nil
	}
	return EventError(ev, what)
}

// NewUDChannel is NewChannel for PacketConn's datagram ids.
func NewUDChannel() (*rdmacm.UDChannel, error) {
	ch, err := rdmacm.NewUDChannel()
	if err != nil {
		return nil, noCM(err)
	}
	return ch, nil
}

// ResolveError is the error of an address or route resolution that
// failed (EventAddrError, EventRouteError; ok false for other events),
// toward dst ("" when the caller's text names it). An address no RDMA
// device serves is errs.ErrNotRDMAAddress, with its hint.
func ResolveError(typ rdmacm.EventType, status int, dst string) (err error, ok bool) {
	errno := syscall.Errno(-status)
	if dst != "" {
		dst = " " + dst
	}
	switch typ {
	case rdmacm.EventAddrError:
		if errno == syscall.ENODEV || errno == syscall.EADDRNOTAVAIL {
			return hints.Add(fmt.Errorf("%w: %w", errs.ErrNotRDMAAddress, errno)), true
		}
		return fmt.Errorf("resolving address%s: %w", dst, errno), true
	case rdmacm.EventRouteError:
		return fmt.Errorf("resolving route%s: %w", dst, errno), true
	}
	return nil, false
}

// EventError is the error of an event that ends a connection's set-up
// while it waited for what.
func EventError(ev rdmacm.Event, what string) error {
	if err, ok := ResolveError(ev.Type, ev.Status, ""); ok {
		return err
	}
	switch ev.Type {
	case rdmacm.EventRejected:
		// InfiniBand's CM gives a reject reason (28 for a listener's
		// reject with private data); iWARP's gives a negative errno: the
		// TCP connection refused where nobody listens, ECONNRESET for an
		// MPA reject, which carries the listener's Reject all the same.
		if ev.Status == RejInvalidServiceID || ev.Status == -int(syscall.ECONNREFUSED) {
			return syscall.ECONNREFUSED
		}
		if rej, err := wire.ParseReject(ev.PrivateData); err == nil {
			return fmt.Errorf("%w: listener refused the connection: %s (%s)", errs.ErrHandshake, rej.Reason, rej.Code)
		}
		if ev.Status == RejConsumerDefined {
			return fmt.Errorf("%w: peer refused the connection (not a verbline listener?)", errs.ErrHandshake)
		}
		return fmt.Errorf("connection rejected (CM reason %d): %w", ev.Status, syscall.ECONNREFUSED)
	case rdmacm.EventUnreachable, rdmacm.EventConnectError:
		return fmt.Errorf("peer unreachable (%s, status %d): %w", ev.Type, ev.Status, syscall.EHOSTUNREACH)
	}
	return fmt.Errorf("unexpected rdma_cm event %s (status %d) while %s", ev.Type, ev.Status, what)
}

// MsUntil is the time left before ctx's deadline in milliseconds, as
// rdma_resolve_addr and rdma_resolve_route take it (15 s without one).
func MsUntil(ctx context.Context) int {
	if d, ok := ctx.Deadline(); ok {
		return max(1, int(time.Until(d)/time.Millisecond))
	}
	return 15000
}

// ClassifyResolve makes a resolution that no RDMA device can serve
// (ENODEV, EADDRNOTAVAIL; EINVAL for a loopback destination, which is
// what rdma_cm answers where only iWARP devices are) errs.ErrNotRDMAAddress,
// with its hint. dst is the address being resolved (zero for a bind).
func ClassifyResolve(err error, dst netip.Addr) error {
	if errors.Is(err, syscall.ENODEV) || errors.Is(err, syscall.EADDRNOTAVAIL) ||
		dst.IsLoopback() && errors.Is(err, syscall.EINVAL) {
		return hints.Add(fmt.Errorf("%w: %w", errs.ErrNotRDMAAddress, err))
	}
	return err
}

// Reject refuses the connection of id with a reject message and destroys id.
func Reject(id *rdmacm.ID, code wire.RejectCode, reason string) {
	SendReject(id, code, reason)
	id.Destroy()
}

// SendReject refuses the connection of id (a request, or a response the
// dialer cannot accept) with the wire's reject message: code, this side's
// version and reason.
func SendReject(id *rdmacm.ID, code wire.RejectCode, reason string) {
	id.Reject((&wire.Reject{Code: code, Version: wire.Version, Reason: reason}).AppendTo(nil))
}
