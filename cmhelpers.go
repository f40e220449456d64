//go:build linux && cgo

package rdma

// rdma_cm helpers shared by Conn (dial and accept), Listener and
// PacketConn: event channels and ids, waiting for an event, the errors
// of events that end a set-up, and rejects.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/verbline/rdma/internal/hints"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/wire"
)

// CM reject reasons from the IB spec that rdma_cm passes up as event status.
const (
	cmRejInvalidServiceID = 8  // nobody listens on that port
	cmRejConsumerDefined  = 28 // the listener refused; the reason is in the private data
)

// newChannel opens an rdma_cm event channel; without rdma_cm (no
// /dev/infiniband/rdma_cm) the error is ErrNoDevice, with its hint.
func newChannel() (*rdmacm.Channel, error) {
	ch, err := rdmacm.NewChannel()
	if errors.Is(err, rdmacm.ErrNoCM) {
		return nil, hints.Add(fmt.Errorf("%w (%w)", ErrNoDevice, err))
	}
	return ch, err
}

// newChannelID creates an event channel and an id on it: what every dial and
// listen starts from.
func newChannelID() (*rdmacm.Channel, *rdmacm.ID, error) {
	ch, err := newChannel()
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

// waitEvent waits for the next CM event on ch, bounded by ctx; past ctx's
// deadline the error is os.ErrDeadlineExceeded, as a net.Conn's.
func waitEvent(ctx context.Context, ch *rdmacm.Channel) (rdmacm.Event, error) {
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

// expect waits for event want; any other event becomes a descriptive error.
func expect(ctx context.Context, ch *rdmacm.Channel, want rdmacm.EventType, what string) (rdmacm.Event, error) {
	ev, err := waitEvent(ctx, ch)
	if err != nil {
		return ev, err
	}
	return ev, checkEvent(ev, want, what)
}

// checkEvent is nil if ev is the event wanted, else a descriptive error.
func checkEvent(ev rdmacm.Event, want rdmacm.EventType, what string) error {
	traceDelivery(ev, "")
	if ev.Type == want {
		return nil
	}
	return eventError(ev, what)
}

// newUDChannel is newChannel for PacketConn's datagram ids.
func newUDChannel() (*rdmacm.UDChannel, error) {
	ch, err := rdmacm.NewUDChannel()
	if errors.Is(err, rdmacm.ErrNoCM) {
		return nil, hints.Add(fmt.Errorf("%w (%w)", ErrNoDevice, err))
	}
	return ch, err
}

// resolveError is the error of an address or route resolution that
// failed (EventAddrError, EventRouteError; ok false for other events),
// toward dst ("" when the caller's text names it). An address no RDMA
// device serves is ErrNotRDMAAddress, with its hint.
func resolveError(typ rdmacm.EventType, status int, dst string) (err error, ok bool) {
	errno := syscall.Errno(-status)
	if dst != "" {
		dst = " " + dst
	}
	switch typ {
	case rdmacm.EventAddrError:
		if errno == syscall.ENODEV || errno == syscall.EADDRNOTAVAIL {
			return hints.Add(fmt.Errorf("%w: %w", ErrNotRDMAAddress, errno)), true
		}
		return fmt.Errorf("resolving address%s: %w", dst, errno), true
	case rdmacm.EventRouteError:
		return fmt.Errorf("resolving route%s: %w", dst, errno), true
	}
	return nil, false
}

// eventError is the error of an event that ends a connection's set-up
// while it waited for what.
func eventError(ev rdmacm.Event, what string) error {
	if err, ok := resolveError(ev.Type, ev.Status, ""); ok {
		return err
	}
	switch ev.Type {
	case rdmacm.EventRejected:
		switch ev.Status {
		case cmRejInvalidServiceID:
			return syscall.ECONNREFUSED
		case cmRejConsumerDefined:
			if rej, err := wire.ParseReject(ev.PrivateData); err == nil {
				return fmt.Errorf("%w: listener refused the connection: %s (%s)", ErrHandshake, rej.Reason, rej.Code)
			}
			return fmt.Errorf("%w: peer refused the connection (not a verbline listener?)", ErrHandshake)
		}
		return fmt.Errorf("connection rejected (CM reason %d): %w", ev.Status, syscall.ECONNREFUSED)
	case rdmacm.EventUnreachable, rdmacm.EventConnectError:
		return fmt.Errorf("peer unreachable (%s, status %d): %w", ev.Type, ev.Status, syscall.EHOSTUNREACH)
	}
	return fmt.Errorf("unexpected rdma_cm event %s (status %d) while %s", ev.Type, ev.Status, what)
}

// msUntil is the time left before ctx's deadline in milliseconds, as
// rdma_resolve_addr and rdma_resolve_route take it (15 s without one).
func msUntil(ctx context.Context) int {
	if d, ok := ctx.Deadline(); ok {
		return max(1, int(time.Until(d)/time.Millisecond))
	}
	return 15000
}

// classifyResolve makes a resolution that no RDMA device can serve
// (ENODEV, EADDRNOTAVAIL) ErrNotRDMAAddress, with its hint.
func classifyResolve(err error) error {
	if errors.Is(err, syscall.ENODEV) || errors.Is(err, syscall.EADDRNOTAVAIL) {
		return hints.Add(fmt.Errorf("%w: %w", ErrNotRDMAAddress, err))
	}
	return err
}

// reject refuses the connection of id with a reject message and destroys id.
func reject(id *rdmacm.ID, code wire.RejectCode, reason string) {
	sendReject(id, code, reason)
	id.Destroy()
}

// sendReject refuses the connection of id (a request, or a response the
// dialer cannot accept) with the wire's reject message: code, this side's
// version and reason.
func sendReject(id *rdmacm.ID, code wire.RejectCode, reason string) {
	id.Reject((&wire.Reject{Code: code, Version: wire.Version, Reason: reason}).AppendTo(nil))
}
