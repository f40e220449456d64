//go:build linux && cgo

package device

import (
	"errors"
	"sync"
	"syscall"
	"testing"

	"github.com/verbline/rdma/internal/errs"
	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/verbs"
)

// fakeMember records the errors the device fails it with.
type fakeMember struct {
	qpn  uint32
	port uint8
	p    *poller.Poller
	mu   sync.Mutex
	errs []error
}

func (m *fakeMember) FaultScope() (uint32, uint8, *poller.Poller) { return m.qpn, m.port, m.p }
func (m *fakeMember) DeviceFailed(err error) {
	m.mu.Lock()
	m.errs = append(m.errs, err)
	m.mu.Unlock()
}
func (m *fakeMember) failed() []error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]error(nil), m.errs...)
}

func TestFaultFanOut(t *testing.T) {
	d := testDevice(t, 201, 0)
	var fatalKey uintptr
	var fatalErr error
	d.cfg.OnFatal = func(key uintptr, err error) { fatalKey, fatalErr = key, err }
	f := &fakePorts{mtu: verbs.MTU1024}
	d.Ports.query = f.query
	p1, p2 := new(poller.Poller), new(poller.Poller)
	a := &fakeMember{qpn: 10, port: 1, p: p1}
	b := &fakeMember{qpn: 11, port: 1, p: p2}
	c := &fakeMember{qpn: 12, port: 2, p: p2}
	gone := &fakeMember{qpn: 10, port: 1, p: p1}
	for _, m := range []*fakeMember{a, b, c, gone} {
		d.Add(m)
	}
	d.Remove(gone)
	count := func(want ...int) {
		t.Helper()
		for i, m := range []*fakeMember{a, b, c, gone} {
			if got := len(m.failed()); got != want[i] {
				t.Fatalf("member %d failed %d times, want %d", i, got, want[i])
			}
		}
	}

	// A QP's fault fails its connection only.
	d.HandleAsync(verbs.AsyncEvent{Type: verbs.EventQPFatal, QPN: 10})
	count(1, 0, 0, 0)
	if !errors.Is(a.failed()[0], syscall.ECONNABORTED) {
		t.Fatalf("QP fatal: %v, want ECONNABORTED", a.failed()[0])
	}

	// A failed poller fails the connections on its CQ.
	d.pollerFailed(p2, errors.New("poller failed"))
	count(1, 1, 1, 0)

	// A port going down fails its connections and new ones on it, and
	// drops its cached limits; port active makes it usable again.
	d.Ports.Limits(1, false)
	d.HandleAsync(verbs.AsyncEvent{Type: verbs.EventPortErr, Port: 1})
	count(2, 2, 1, 0)
	if err := d.Usable(1); !errors.Is(err, syscall.ENETDOWN) {
		t.Fatalf("Usable(1) with the port down: %v, want ENETDOWN", err)
	}
	if err := d.Usable(2); err != nil {
		t.Fatalf("Usable(2): %v", err)
	}
	if _, ok := d.Ports.Cached(1); ok {
		t.Fatal("a port event left the port's limits cached")
	}
	d.HandleAsync(verbs.AsyncEvent{Type: verbs.EventPortActive, Port: 1})
	if err := d.Usable(1); err != nil {
		t.Fatalf("Usable(1) after port active: %v", err)
	}
	count(2, 2, 1, 0)

	// A fatal device error fails everything, for good.
	d.HandleAsync(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
	count(3, 3, 2, 0)
	var df *errs.DeviceFailed
	if err := d.Usable(2); !errors.As(err, &df) || !errors.Is(err, errs.ErrNoDevice) {
		t.Fatalf("Usable after a fatal error: %v, want an errs.DeviceFailed (ErrNoDevice)", err)
	}
	if Fatal(201) == nil || fatalKey != 201 || fatalErr == nil {
		t.Fatalf("fatal record %v, OnFatal(%d, %v)", Fatal(201), fatalKey, fatalErr)
	}
	if d.Events() != 4 {
		t.Fatalf("%d events counted, want 4", d.Events())
	}
	ForgetFatal(201)
	if Fatal(201) != nil {
		t.Fatal("ForgetFatal kept the record")
	}
}

// Members come and go while faults fan out.
func TestFaultFanOutConcurrent(t *testing.T) {
	d := testDevice(t, 202, 0)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 200 {
				m := &fakeMember{qpn: uint32(i*1000 + j), port: 1}
				d.Add(m)
				d.Remove(m)
			}
		}()
	}
	for range 200 {
		d.HandleAsync(verbs.AsyncEvent{Type: verbs.EventQPFatal, QPN: 5})
		d.HandleAsync(verbs.AsyncEvent{Type: verbs.EventPortErr, Port: 1})
		d.HandleAsync(verbs.AsyncEvent{Type: verbs.EventPortActive, Port: 1})
	}
	wg.Wait()
}
