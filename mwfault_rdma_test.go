//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/rdmatest"
)

// TestWindowFaultQPNotPooled: a connection on whose QP a memory window
// failed to deallocate (an export's window closed by the user, or a
// rendezvous window closed with the connection) destroys its QP at Close
// instead of pooling it for another connection; the same connection with
// its windows deallocated pools its QP. The failure is made by
// mwCloseFault (the window is deallocated, and reported as failed).
func TestWindowFaultQPNotPooled(t *testing.T) {
	if !testDeviceCaps(t).MemoryWindows {
		// No window can fail: an export is a registration of its own.
		c, s, ln := connPair(t, nil)
		defer ln.Close()
		defer s.Close()
		defer c.Close()
		b := mustAlloc(t, s, 4096)
		defer b.Release()
		exp, err := s.Export(b, RemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		defer exp.Close()
		if exp.mw != nil || exp.mr == nil {
			t.Fatalf("export on a device without windows: window %v, registration %v", exp.mw, exp.mr)
		}
		t.Logf("device %s has no memory windows: exports and large messages use registrations of their own", s.dev.Name())
		return
	}
	for _, tc := range []struct {
		name  string
		fault bool
		use   func(t *testing.T, ctx context.Context, c, s *Conn, fault func())
	}{
		{"export", false, useExport},
		{"export", true, useExport},
		{"rendezvous", false, useRendezvous},
		{"rendezvous", true, useRendezvous},
	} {
		name := tc.name + "/dealloc ok"
		if tc.fault {
			name = tc.name + "/dealloc fails"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(20*time.Second))
			defer cancel()
			c, s, ln := connPair(t, nil)
			defer ln.Close()
			defer s.Close()
			defer c.Close()
			if !c.dev.Caps.MemoryWindows {
				t.Fatal("the device has no type 2 memory windows")
			}
			d := c.dev
			num, peerNum := c.ep.qp.Num, s.ep.qp.Num
			fault := func() {
				if tc.fault {
					err := error(errors.New("ibv_dealloc_mw: injected failure"))
					mwCloseFault.Store(&err)
				}
			}
			t.Cleanup(func() { mwCloseFault.Store(nil) })
			tc.use(t, ctx, c, s, fault)
			c.Close()
			mwCloseFault.Store(nil)
			s.Close()
			if got := c.ep.noReuse.Load(); got != tc.fault {
				t.Fatalf("the connection's QP marked not reusable: %v, want %v", got, tc.fault)
			}
			// The peer's QP returns at its TIMEWAIT_EXIT; ours returns too
			// unless a window failed.
			waitPool(t, d, "the peer's QP returned", func(device.QPPoolStats, int) bool {
				p := pooledNums(d)
				return p[peerNum] && (tc.fault || p[num])
			})
			if pooled := pooledNums(d)[num]; pooled == tc.fault {
				t.Fatalf("QP 0x%x pooled: %v, want %v (pool %v)", num, pooled, !tc.fault, pooledNums(d))
			}
			if tc.fault && c.ep.parkDev != nil {
				t.Fatal("the connection's QP was parked for the pool")
			}
		})
	}
}

// useExport exports a buffer of c's with a window and closes the export
// (with the fault on): its error is the window's.
func useExport(t *testing.T, ctx context.Context, c, s *Conn, fault func()) {
	b := mustAlloc(t, c, 4096)
	defer b.Release()
	exp, err := c.Export(b, RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if exp.mw == nil {
		t.Fatal("the export has no memory window")
	}
	fault()
	err = exp.Close()
	if want := mwCloseFault.Load() != nil; (err != nil) != want {
		t.Fatalf("Export.Close: %v, want an error: %v", err, want)
	}
}

// useRendezvous sends s one message larger than its receive buffers
// (lent through a window of c's), which stays allocated for the
// connection's next large message and is deallocated at c's Close.
func useRendezvous(t *testing.T, ctx context.Context, c, s *Conn, fault func()) {
	b := mustAlloc(t, c, 2*c.peerBufSize)
	if err := c.Send(ctx, b); err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.Len() != 2*c.peerBufSize {
		t.Fatalf("received %d bytes, want %d", m.Len(), 2*c.peerBufSize)
	}
	m.Release()
	c.mu.Lock()
	windows := 0
	for _, mw := range c.rdv.mw {
		if mw != nil {
			windows++
		}
	}
	c.mu.Unlock()
	if windows == 0 {
		t.Fatal("the large message went without a window")
	}
	fault()
}
