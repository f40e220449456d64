//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/wire"
)

// The rdma_cm events a dial or accept can end with, mapped to the errors the
// package documents (eventError) and resolution errors (classifyResolve).
func TestEventErrors(t *testing.T) {
	reject := func(code wire.RejectCode, reason string) []byte {
		r := wire.Reject{Code: code, Reason: reason}
		return append(r.AppendTo(nil), make([]byte, 20)...) // IB pads private data with zeros
	}
	for _, tc := range []struct {
		name  string
		ev    rdmacm.Event
		is    []error // errors.Is targets
		words []string
	}{
		{"address on no RDMA netdev", rdmacm.Event{Type: rdmacm.EventAddrError, Status: -int(syscall.ENODEV)},
			[]error{ErrNotRDMAAddress}, []string{syscall.ENODEV.Error()}},
		{"address not available", rdmacm.Event{Type: rdmacm.EventAddrError, Status: -int(syscall.EADDRNOTAVAIL)},
			[]error{ErrNotRDMAAddress}, nil},
		{"address error", rdmacm.Event{Type: rdmacm.EventAddrError, Status: -int(syscall.ETIMEDOUT)},
			[]error{syscall.ETIMEDOUT}, []string{"resolving address"}},
		{"route error", rdmacm.Event{Type: rdmacm.EventRouteError, Status: -int(syscall.ENETUNREACH)},
			[]error{syscall.ENETUNREACH}, []string{"resolving route"}},
		{"nobody listening", rdmacm.Event{Type: rdmacm.EventRejected, Status: cmRejInvalidServiceID},
			[]error{syscall.ECONNREFUSED}, nil},
		{"listener refused", rdmacm.Event{Type: rdmacm.EventRejected, Status: cmRejConsumerDefined,
			PrivateData: reject(wire.RejectVersion, "version 9 not supported")},
			[]error{ErrHandshake}, []string{"version 9 not supported", "version"}},
		{"foreign listener refused", rdmacm.Event{Type: rdmacm.EventRejected, Status: cmRejConsumerDefined,
			PrivateData: []byte("not ours")}, []error{ErrHandshake}, []string{"not a verbline listener"}},
		{"other reject", rdmacm.Event{Type: rdmacm.EventRejected, Status: 13},
			[]error{syscall.ECONNREFUSED}, []string{"CM reason 13"}},
		{"unreachable", rdmacm.Event{Type: rdmacm.EventUnreachable, Status: -int(syscall.ETIMEDOUT)},
			[]error{syscall.EHOSTUNREACH}, []string{"peer unreachable"}},
		{"connect error", rdmacm.Event{Type: rdmacm.EventConnectError, Status: -int(syscall.ECONNRESET)},
			[]error{syscall.EHOSTUNREACH}, nil},
		{"unexpected event", rdmacm.Event{Type: rdmacm.EventDeviceRemoval}, nil, []string{"unexpected rdma_cm event", "while connecting"}},
	} {
		err := eventError(tc.ev, "connecting")
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		for _, target := range tc.is {
			if !errors.Is(err, target) {
				t.Errorf("%s: %v is not %v", tc.name, err, target)
			}
		}
		for _, w := range tc.words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tc.name, err, w)
			}
		}
	}

	for _, errno := range []syscall.Errno{syscall.ENODEV, syscall.EADDRNOTAVAIL} {
		if err := classifyResolve(errno); !errors.Is(err, ErrNotRDMAAddress) || !strings.Contains(err.Error(), errno.Error()) {
			t.Errorf("classifyResolve(%v) = %v, want ErrNotRDMAAddress naming the errno", errno, err)
		}
	}
	if err := classifyResolve(syscall.EINVAL); err != syscall.EINVAL {
		t.Errorf("classifyResolve(EINVAL) = %v, want it unchanged", err)
	}
}

func TestMsUntil(t *testing.T) {
	if got := msUntil(context.Background()); got != 15000 {
		t.Errorf("no deadline: %d ms, want 15000", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if got := msUntil(ctx); got <= 3590_000 || got > 3600_000 {
		t.Errorf("an hour: %d ms", got)
	}
	past, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	if got := msUntil(past); got != 1 {
		t.Errorf("a deadline passed: %d ms, want 1", got)
	}
}
