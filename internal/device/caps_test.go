//go:build linux && cgo

package device

import (
	"strings"
	"testing"

	"github.com/verbline/rdma/internal/verbs"
)

// TestCapsOfRoCE: a RoCE device with type 2 windows and atomics (Soft-RoCE's
// attributes) has every capability the library uses, and the IB CM's
// private-data room.
func TestCapsOfRoCE(t *testing.T) {
	a := &verbs.DeviceAttr{Transport: verbs.TransportIB, MaxMW: 4096, MemWindow2: true, MemWindow1: true,
		Atomics: verbs.AtomicHCA, MaxSGE: 32, MaxSGERd: 32, MaxSRQ: 64, MaxQPRdAtom: 128, MaxQPInitRdAtom: 128}
	c := CapsOf(a)
	if !c.MemoryWindows || !c.Immediates || !c.UD || !c.SRQ || c.Atomics != verbs.AtomicHCA {
		t.Fatalf("RoCE with windows and atomics: %+v", c)
	}
	if c.ActiveSendsFirst || c.CMConnectsQP || c.ReadSinkRemoteWrite {
		t.Fatalf("iWARP's rules on a RoCE device: %+v", c)
	}
	if c.PrivateDataConnect != 56 || c.PrivateDataAccept != 196 {
		t.Fatalf("IB CM private data %d/%d, want 56/196", c.PrivateDataConnect, c.PrivateDataAccept)
	}
}

// TestCapsOfIWARP: an iWARP device (siw's attributes: no windows, one READ
// sink entry) lacks immediates, UD and atomics whatever its driver reports
// for atomics, and brings iWARP's connection rules.
func TestCapsOfIWARP(t *testing.T) {
	a := &verbs.DeviceAttr{Transport: verbs.TransportIWARP, MaxSGE: 6, MaxSGERd: 1, MaxSRQ: 102400,
		Atomics: verbs.AtomicHCA, MaxQPRdAtom: 128, MaxQPInitRdAtom: 128}
	c := CapsOf(a)
	if c.MemoryWindows || c.Immediates || c.UD || c.Atomics != verbs.AtomicNone {
		t.Fatalf("iWARP: %+v", c)
	}
	if !c.ActiveSendsFirst || !c.CMConnectsQP || !c.ReadSinkRemoteWrite || c.MaxReadSGE != 1 {
		t.Fatalf("iWARP's rules missing: %+v", c)
	}
	if c.PrivateDataConnect != 252 || c.PrivateDataAccept != 252 {
		t.Fatalf("MPA private data %d/%d, want 252/252", c.PrivateDataConnect, c.PrivateDataAccept)
	}
	for _, w := range []string{"transport iWARP", "memory windows no", "immediates no", "the connecting side sends first"} {
		if !strings.Contains(c.String(), w) {
			t.Errorf("summary %q lacks %q", c.String(), w)
		}
	}
}

// TestCapsOfType1Windows: a device with type 1 windows only has no
// windows the library can use, and the summary says which it has.
func TestCapsOfType1Windows(t *testing.T) {
	c := CapsOf(&verbs.DeviceAttr{Transport: verbs.TransportIB, MaxMW: 16, MemWindow1: true, Atomics: verbs.AtomicHCA})
	if c.MemoryWindows || !c.MemoryWindowType1 {
		t.Fatalf("type 1 only: %+v", c)
	}
	if !strings.Contains(c.String(), "memory windows type 1 only") {
		t.Fatalf("summary %q", c.String())
	}
}
