//go:build linux && cgo

package cmsetup

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	cerrors "github.com/cockroachdb/errors"

	"github.com/verbline/rdma/internal/errs"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/wire"
)

// Host tests: the events are built by hand, so they need no device (an
// Event's ID stays nil).

// The rdma_cm events a dial or accept can end with, mapped to the errors the
// rdma package documents (EventError), and resolution errors
// (ClassifyResolve).
func TestEventErrors(t *testing.T) {
	reject := func(code wire.RejectCode, reason string) []byte {
		r := wire.Reject{Code: code, Reason: reason}
		return append(r.AppendTo(nil), make([]byte, 20)...) // IB pads private data with zeros
	}
	for _, tc := range []struct {
		name  string
		ev    rdmacm.Event
		is    []error // errors.Is targets
		not   []error // errors.Is must not match these
		words []string
		hint  bool // carries a hint for this machine
	}{
		{"address on no RDMA netdev", rdmacm.Event{Type: rdmacm.EventAddrError, Status: -int(syscall.ENODEV)},
			[]error{errs.ErrNotRDMAAddress, syscall.ENODEV}, nil, []string{syscall.ENODEV.Error()}, true},
		{"address not available", rdmacm.Event{Type: rdmacm.EventAddrError, Status: -int(syscall.EADDRNOTAVAIL)},
			[]error{errs.ErrNotRDMAAddress, syscall.EADDRNOTAVAIL}, nil, nil, true},
		{"address error", rdmacm.Event{Type: rdmacm.EventAddrError, Status: -int(syscall.ETIMEDOUT)},
			[]error{syscall.ETIMEDOUT}, []error{errs.ErrNotRDMAAddress}, []string{"resolving address"}, false},
		{"route error", rdmacm.Event{Type: rdmacm.EventRouteError, Status: -int(syscall.ENETUNREACH)},
			[]error{syscall.ENETUNREACH}, []error{errs.ErrNotRDMAAddress}, []string{"resolving route"}, false},
		{"nobody listening", rdmacm.Event{Type: rdmacm.EventRejected, Status: RejInvalidServiceID},
			[]error{syscall.ECONNREFUSED}, []error{errs.ErrHandshake}, nil, false},
		{"listener refused", rdmacm.Event{Type: rdmacm.EventRejected, Status: RejConsumerDefined,
			PrivateData: reject(wire.RejectVersion, "version 9 not supported")},
			[]error{errs.ErrHandshake}, []error{syscall.ECONNREFUSED},
			[]string{"listener refused the connection: version 9 not supported (" + wire.RejectVersion.String() + ")"}, false},
		{"listener overloaded", rdmacm.Event{Type: rdmacm.EventRejected, Status: RejConsumerDefined,
			PrivateData: reject(wire.RejectOverloaded, "accept backlog of 8 is full")},
			[]error{errs.ErrHandshake}, nil, []string{"accept backlog of 8 is full", wire.RejectOverloaded.String()}, false},
		{"foreign listener refused", rdmacm.Event{Type: rdmacm.EventRejected, Status: RejConsumerDefined,
			PrivateData: []byte("not ours")}, []error{errs.ErrHandshake}, nil, []string{"not a verbline listener"}, false},
		{"nobody listening (iWARP: the TCP connection refused)", rdmacm.Event{Type: rdmacm.EventRejected, Status: -int(syscall.ECONNREFUSED)},
			[]error{syscall.ECONNREFUSED}, []error{errs.ErrHandshake}, nil, false},
		{"listener refused (iWARP: an MPA reject)", rdmacm.Event{Type: rdmacm.EventRejected, Status: -int(syscall.ECONNRESET),
			PrivateData: reject(wire.RejectIncompatible, "no trailers")},
			[]error{errs.ErrHandshake}, []error{syscall.ECONNREFUSED},
			[]string{"listener refused the connection: no trailers (" + wire.RejectIncompatible.String() + ")"}, false},
		{"other reject", rdmacm.Event{Type: rdmacm.EventRejected, Status: 13},
			[]error{syscall.ECONNREFUSED}, []error{errs.ErrHandshake}, []string{"CM reason 13"}, false},
		{"unreachable", rdmacm.Event{Type: rdmacm.EventUnreachable, Status: -int(syscall.ETIMEDOUT)},
			[]error{syscall.EHOSTUNREACH}, nil, []string{"peer unreachable"}, false},
		{"connect error", rdmacm.Event{Type: rdmacm.EventConnectError, Status: -int(syscall.ECONNRESET)},
			[]error{syscall.EHOSTUNREACH}, nil, nil, false},
		{"unexpected event", rdmacm.Event{Type: rdmacm.EventDeviceRemoval}, nil,
			[]error{errs.ErrNoDevice, errs.ErrHandshake}, []string{"unexpected rdma_cm event", "while connecting"}, false},
	} {
		err := EventError(tc.ev, "connecting")
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		for _, target := range tc.is {
			if !errors.Is(err, target) {
				t.Errorf("%s: %v is not %v", tc.name, err, target)
			}
		}
		for _, target := range tc.not {
			if errors.Is(err, target) {
				t.Errorf("%s: %v matches %v", tc.name, err, target)
			}
		}
		for _, w := range tc.words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tc.name, err, w)
			}
		}
		if hints := cerrors.GetAllHints(err); (len(hints) == 1) != tc.hint {
			t.Errorf("%s: hints %q, want a hint: %v", tc.name, hints, tc.hint)
		}
	}

	for _, errno := range []syscall.Errno{syscall.ENODEV, syscall.EADDRNOTAVAIL} {
		if err := ClassifyResolve(errno, netip.Addr{}); !errors.Is(err, errs.ErrNotRDMAAddress) || !strings.Contains(err.Error(), errno.Error()) {
			t.Errorf("ClassifyResolve(%v) = %v, want ErrNotRDMAAddress naming the errno", errno, err)
		}
		// Wrapped as rdma_bind_addr's errors are, and again as Dial's.
		err := &net.OpError{Op: "dial", Net: "rdma", Err: ClassifyResolve(fmt.Errorf("rdma_bind_addr: %w", errno), netip.Addr{})}
		if !errors.Is(err, errs.ErrNotRDMAAddress) || !errors.Is(err, errno) || !strings.Contains(cerrors.FlattenHints(err), "rdma link add") {
			t.Errorf("ClassifyResolve(rdma_bind_addr: %v) in a *net.OpError = %v (hint %q), want ErrNotRDMAAddress, the errno and a hint",
				errno, err, cerrors.FlattenHints(err))
		}
	}
	peer := netip.MustParseAddr("192.0.2.7")
	if err := ClassifyResolve(syscall.EINVAL, peer); err != syscall.EINVAL {
		t.Errorf("ClassifyResolve(EINVAL, %v) = %v, want it unchanged", peer, err)
	}
	// rdma_cm's answer for a loopback destination where only iWARP
	// devices are.
	for _, lo := range []string{"127.0.0.1", "::1"} {
		if err := ClassifyResolve(syscall.EINVAL, netip.MustParseAddr(lo)); !errors.Is(err, errs.ErrNotRDMAAddress) {
			t.Errorf("ClassifyResolve(EINVAL, %s) = %v, want ErrNotRDMAAddress", lo, err)
		}
	}
}

func TestMsUntil(t *testing.T) {
	if got := MsUntil(context.Background()); got != 15000 {
		t.Errorf("no deadline: %d ms, want 15000", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if got := MsUntil(ctx); got <= 3590_000 || got > 3600_000 {
		t.Errorf("an hour: %d ms", got)
	}
	past, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	if got := MsUntil(past); got != 1 {
		t.Errorf("a deadline passed: %d ms, want 1", got)
	}
}

// ResolveError names the destination it was given, and answers only for
// the two resolution events.
func TestResolveError(t *testing.T) {
	err, ok := ResolveError(rdmacm.EventRouteError, -int(syscall.ENETUNREACH), "to 10.0.0.2")
	if !ok || !errors.Is(err, syscall.ENETUNREACH) || err.Error() != "resolving route to 10.0.0.2: "+syscall.ENETUNREACH.Error() {
		t.Errorf("route error: %v, %v", err, ok)
	}
	err, ok = ResolveError(rdmacm.EventAddrError, -int(syscall.ETIMEDOUT), "to 10.0.0.2")
	if !ok || !errors.Is(err, syscall.ETIMEDOUT) || !strings.HasPrefix(err.Error(), "resolving address to 10.0.0.2: ") {
		t.Errorf("address error: %v, %v", err, ok)
	}
	for _, typ := range []rdmacm.EventType{rdmacm.EventAddrResolved, rdmacm.EventRouteResolved, rdmacm.EventRejected, rdmacm.EventUnreachable} {
		if err, ok := ResolveError(typ, -int(syscall.ENODEV), ""); ok || err != nil {
			t.Errorf("%s: %v, %v, want no answer", typ, err, ok)
		}
	}
}

// CheckEvent passes the event wanted, turns any other into EventError's
// error, and traces each one's delivery first (events read off a channel
// only: Read set).
func TestCheckEvent(t *testing.T) {
	var seen []rdmacm.EventType
	SetEventTrace(func(ev rdmacm.Event) { seen = append(seen, ev.Type) })
	t.Cleanup(func() { SetEventTrace(nil) })
	read := time.Now()
	if err := CheckEvent(rdmacm.Event{Type: rdmacm.EventEstablished, Read: read}, rdmacm.EventEstablished, "waiting"); err != nil {
		t.Errorf("the event wanted: %v", err)
	}
	err := CheckEvent(rdmacm.Event{Type: rdmacm.EventRejected, Status: RejInvalidServiceID, Read: read}, rdmacm.EventEstablished, "waiting")
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a reject instead: %v, want ECONNREFUSED", err)
	}
	if len(seen) != 2 || seen[0] != rdmacm.EventEstablished || seen[1] != rdmacm.EventRejected {
		t.Errorf("the trace saw %v, want both events in order", seen)
	}
	if err := CheckEvent(rdmacm.Event{Type: rdmacm.EventEstablished}, rdmacm.EventEstablished, "waiting"); err != nil || len(seen) != 2 {
		t.Errorf("an event not read off a channel: %v, trace calls %d, want 2", err, len(seen))
	}
	SetEventTrace(nil)
	if err := CheckEvent(rdmacm.Event{Type: rdmacm.EventEstablished, Read: read}, rdmacm.EventEstablished, "waiting"); err != nil || len(seen) != 2 {
		t.Errorf("without a trace: %v, trace calls %d", err, len(seen))
	}
}

// Steps report each step's duration to the step trace, and nothing
// without one.
func TestSteps(t *testing.T) {
	type rep struct{ side, step string }
	var got []rep
	SetStepTrace(func(side, step string, d time.Duration) {
		if d < 0 {
			t.Errorf("step %s: negative duration %v", step, d)
		}
		got = append(got, rep{side, step})
	})
	st := StartSteps("dial")
	st.Step("resolve addr")
	st.Step("connect")
	TraceDelivery(rdmacm.Event{Type: rdmacm.EventEstablished, Read: time.Now()}, " (via)")
	SetStepTrace(nil)
	st2 := StartSteps("accept")
	st2.Step("never reported")
	want := []rep{{"dial", "resolve addr"}, {"dial", "connect"}, {"event", "delivery " + rdmacm.EventEstablished.String() + " (via)"}}
	if !slices.Equal(got, want) {
		t.Errorf("reports %v, want %v", got, want)
	}
}

// rdma_cm's missing device becomes ErrNoDevice, which keeps rdma_cm's own
// error and carries a hint (what it says depends on the machine, which
// internal/hints tests); other errors pass unchanged.
func TestNoCMIsNoDevice(t *testing.T) {
	err := noCM(fmt.Errorf("open: %w", rdmacm.ErrNoCM))
	if !errors.Is(err, errs.ErrNoDevice) || !errors.Is(err, rdmacm.ErrNoCM) {
		t.Errorf("%v, want ErrNoDevice and rdmacm.ErrNoCM", err)
	}
	if hint := cerrors.FlattenHints(err); hint == "" {
		t.Errorf("%v carries no hint", err)
	}
	other := syscall.EACCES
	if err := noCM(other); err != other {
		t.Errorf("noCM(EACCES) = %v, want EACCES unchanged", err)
	}
}

// Opening a channel: without /dev/infiniband/rdma_cm (a host without RDMA)
// each constructor fails with ErrNoDevice and rdma_cm's error, with the
// hint; with it (inside Soft-RoCE) each one opens.
func TestNewChannels(t *testing.T) {
	_, statErr := os.Stat("/dev/infiniband/rdma_cm")
	haveCM := statErr == nil
	for name, open := range map[string]func() error{
		"NewChannel": func() error {
			ch, err := NewChannel()
			if err == nil {
				ch.Close()
			}
			return err
		},
		"NewChannelID": func() error {
			ch, id, err := NewChannelID()
			if err == nil {
				id.Destroy()
				ch.Close()
			}
			return err
		},
		"NewUDChannel": func() error {
			ch, err := NewUDChannel()
			if err == nil {
				ch.Close()
			}
			return err
		},
	} {
		err := open()
		switch {
		case haveCM && err != nil:
			t.Errorf("%s with rdma_cm present: %v", name, err)
		case !haveCM && (!errors.Is(err, errs.ErrNoDevice) || !errors.Is(err, rdmacm.ErrNoCM)):
			t.Errorf("%s without rdma_cm: %v, want ErrNoDevice and rdmacm.ErrNoCM", name, err)
		case !haveCM && !strings.Contains(cerrors.FlattenHints(err), "rdma_ucm"):
			t.Errorf("%s without rdma_cm: hint %q does not say to load rdma_ucm", name, cerrors.FlattenHints(err))
		}
	}
}
