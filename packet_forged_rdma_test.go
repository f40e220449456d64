//go:build linux && cgo

package rdma

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"
)

// TestPacketForgedSource: a PacketConn on the same host (the same IP, so
// its GRH passes on RoCE) sends datagrams whose header claims the port of
// a destination the receiver resolved, announcing a 1-byte max payload.
// The receiver's entry for that destination is neither replaced nor
// shrunk: its next datagram of the full size still reaches the real
// destination (after one more address resolution, which the contradiction
// asks for), and further forged datagrams within udRecheck cost nothing.
func TestPacketForgedSource(t *testing.T) {
	a, forger := packetPair(t, nil)
	victim := listenPacketTest(t, nil)
	defer victim.Close()
	big := payload(a.MaxDatagramSize(), 3)
	if _, err := a.WriteTo(big, victim.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	if got, _ := readWithin(t, victim, 5*time.Second); !bytes.Equal(got, big) {
		t.Fatalf("victim got %d bytes, want %d", len(got), len(big))
	}
	if r := a.Stats().Resolutions; r != 1 {
		t.Fatalf("%d resolutions, want 1", r)
	}
	forge := func() {
		t.Helper()
		forger.mu.Lock()
		binary.BigEndian.PutUint16(forger.hdrBytes[4:], victim.LocalAddr().(*Addr).AddrPort.Port())
		binary.BigEndian.PutUint16(forger.hdrBytes[6:], 1)
		forger.mu.Unlock()
		if _, err := forger.WriteTo([]byte("forged"), a.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		if got, from := readWithin(t, a, 5*time.Second); string(got) != "forged" || from.String() != victim.LocalAddr().String() {
			t.Fatalf("got %q from %v", got, from)
		}
	}
	exchange := func() {
		t.Helper()
		if _, err := a.WriteTo(big, victim.LocalAddr()); err != nil {
			t.Fatalf("a full-size datagram to the victim after a forged one: %v", err)
		}
		if got, _ := readWithin(t, victim, 5*time.Second); !bytes.Equal(got, big) {
			t.Fatalf("victim got %d bytes, want %d", len(got), len(big))
		}
		forger.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, _, err := forger.ReadFrom(make([]byte, 10)); !isTimeout(err) {
			t.Fatalf("the forger received a datagram meant for the victim: %v", err)
		}
	}
	forge()
	exchange()
	if r := a.Stats().Resolutions; r != 2 {
		t.Fatalf("%d resolutions, want 2 (the contradicted entry resolved again once)", r)
	}
	start := time.Now()
	for range 5 {
		forge()
		exchange()
	}
	bound := 3 + uint64(time.Since(start)/udRecheck)
	if r := a.Stats().Resolutions; r > bound {
		t.Fatalf("%d resolutions after 5 more forged datagrams in %v, want at most %d (one per udRecheck)", r, time.Since(start), bound)
	}
}
