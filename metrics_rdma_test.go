//go:build linux && cgo

package rdma

import (
	"context"
	"io"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
)

// deviceMetrics returns the named device's entry of m (zero if it has none).
func deviceMetrics(m Metrics, name string) DeviceMetrics {
	for _, d := range m.Devices {
		if d.Device == name {
			return d
		}
	}
	return DeviceMetrics{Device: name}
}

// checkNoneWentDown fails t if a running total of after is below before's.
func checkNoneWentDown(t *testing.T, what string, before, after Counters) {
	t.Helper()
	var walk func(b, a reflect.Value, prefix string)
	walk = func(b, a reflect.Value, prefix string) {
		for i := range b.NumField() {
			name := prefix + b.Type().Field(i).Name
			switch b.Field(i).Kind() {
			case reflect.Struct:
				walk(b.Field(i), a.Field(i), name+".")
			case reflect.Uint64:
				if name == "ConnStats.BufferBytes" {
					continue // a gauge: the rings of the connections open now
				}
				if a.Field(i).Uint() < b.Field(i).Uint() {
					t.Errorf("%s: %s went down from %d to %d", what, name, b.Field(i).Uint(), a.Field(i).Uint())
				}
			}
		}
	}
	walk(reflect.ValueOf(before), reflect.ValueOf(after), "")
}

// TestMetrics opens connections, moves stream bytes and messages (small
// and large) through them, makes a writer run out of credit and a reader
// park, and checks that ReadMetrics counts exactly that: per device and
// in total, the hardware counters of the device moving, and after Close
// no connection open, nothing gone down, the device's totals kept.
func TestMetrics(t *testing.T) {
	env := rdmatest.Require(t)
	waitNoDevice(t) // the device is set up by this test's Config (event mode: every wait parks)
	m0 := ReadMetrics()
	d0 := deviceMetrics(m0, env.Device)
	if d0.ConnsOpen != 0 {
		t.Fatalf("%d connections open on %s before the test, with the device torn down", d0.ConnsOpen, env.Device)
	}
	cfg := &Config{RecvBuffers: 8, BufferSize: 4096, PollMode: PollEvent}
	c, s, ln := connPair(t, cfg)
	defer ln.Close()
	c2, s2 := dialAgain(t, ln, cfg)
	for _, conn := range []*Conn{c, s, c2, s2} {
		defer conn.Close() // a failed check leaves no connection (Close is idempotent)
	}
	ctx, cancel := context.WithTimeout(context.Background(), rdmatest.Scale(30*time.Second))
	defer cancel()

	m1 := ReadMetrics()
	d1 := deviceMetrics(m1, env.Device)
	if d1.ConnsOpen != 4 || d1.ConnsTotal-d0.ConnsTotal != 4 {
		t.Errorf("two connections (four ends) open: ConnsOpen %d, ConnsTotal +%d; want 4, +4", d1.ConnsOpen, d1.ConnsTotal-d0.ConnsTotal)
	}
	if d1.PoolMappedBytes <= 0 || d1.PoolInUseBytes <= 0 {
		t.Errorf("the device's pool: %d bytes mapped, %d in use; want both > 0 (the rings)", d1.PoolMappedBytes, d1.PoolInUseBytes)
	}

	// Stream bytes within the window (8 receive buffers, 7 credits for
	// data): no stall.
	var sent int
	readN := func(conn *Conn, n int) chan error {
		done := make(chan error, 1)
		go func() {
			_, err := io.ReadFull(conn, make([]byte, n))
			done <- err
		}()
		return done
	}
	done := readN(s, 3000)
	for range 3 {
		n, err := c.Write(make([]byte, 1000))
		if err != nil {
			t.Fatal(err)
		}
		sent += n
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d := deviceMetrics(ReadMetrics(), env.Device); d.CreditStalls != d0.CreditStalls {
		t.Errorf("3 writes within the window: CreditStalls +%d, want +0", d.CreditStalls-d0.CreditStalls)
	}

	// 64 KiB (16 receive buffers) to a reader that does not read: the
	// writer runs out of credit and waits.
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, 64<<10))
		wrote <- err
	}()
	for deadline := time.Now().Add(rdmatest.Scale(5 * time.Second)); ; time.Sleep(5 * time.Millisecond) {
		if deviceMetrics(ReadMetrics(), env.Device).CreditStalls > d0.CreditStalls {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a writer beyond the peer's window: no credit stall counted")
		}
	}
	select {
	case err := <-wrote:
		t.Fatalf("the write of 64 KiB returned (%v) before the reader read: no stall to count", err)
	default:
	}
	if err := <-readN(s, 64<<10); err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	sent += 64 << 10

	// A reader that waits parks (event mode), and a completion event
	// wakes the poller to deliver what it waits for.
	done = readN(s2, 100)
	time.Sleep(rdmatest.Scale(20 * time.Millisecond))
	if _, err := c2.Write(make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sent += 100

	// Messages: ten small ones, and one larger than the receive buffers
	// (read by the peer with RDMA READ) where the device can lend it.
	sizes := []int{100, 100, 100, 100, 100, 100, 100, 100, 100, 100}
	if c.dev.Caps.MemoryWindows {
		sizes = append(sizes, 100000)
	}
	sendsDone := make(chan struct{})
	go func() {
		defer close(sendsDone)
		for _, n := range sizes {
			b, err := c.Alloc(n)
			if err == nil {
				err = c.Send(ctx, b)
			}
			if err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for range sizes {
		b, err := s.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sent += b.Len()
		b.Release()
	}
	// A message is counted as sent when its Send returns, which may be
	// after the peer received it (the sender's goroutine may have posted
	// the large one and not yet returned).
	<-sendsDone

	m2 := ReadMetrics()
	d2 := deviceMetrics(m2, env.Device)
	checkNoneWentDown(t, "during the traffic", d0.Counters, d2.Counters)
	delta := func(a, b uint64) uint64 { return a - b }
	if got := delta(d2.BytesSent, d0.BytesSent); got != uint64(sent) {
		t.Errorf("BytesSent +%d, want +%d", got, sent)
	}
	if got := delta(d2.BytesReceived, d0.BytesReceived); got != uint64(sent) {
		t.Errorf("BytesReceived +%d, want +%d (both ends are in this process)", got, sent)
	}
	if got := delta(d2.MessagesSent, d0.MessagesSent); got != uint64(len(sizes)) {
		t.Errorf("MessagesSent +%d, want +%d", got, len(sizes))
	}
	if got := delta(d2.MessagesReceived, d0.MessagesReceived); got != uint64(len(sizes)) {
		t.Errorf("MessagesReceived +%d, want +%d", got, len(sizes))
	}
	if d2.CreditStalls == d1.CreditStalls {
		t.Error("CreditStalls did not move")
	}
	for name, got := range map[string]uint64{
		"SendPosts":     delta(d2.SendPosts, d0.SendPosts),
		"RecvPosts":     delta(d2.RecvPosts, d0.RecvPosts),
		"Completions":   delta(d2.Completions, d0.Completions),
		"Parks":         delta(d2.Parks, d0.Parks),
		"PollerWakeups": delta(d2.PollerWakeups, d0.PollerWakeups),
	} {
		if got == 0 {
			t.Errorf("%s did not move", name)
		}
	}
	t.Logf("%s: %+v", env.Device, d2.Counters)

	// The process's totals are its devices' sums.
	var sum Counters
	for i := range m2.Devices {
		sum.add(&m2.Devices[i].Counters)
	}
	if sum != m2.Counters {
		t.Errorf("totals %+v\nare not the devices' sum %+v", m2.Counters, sum)
	}

	// The device's hardware counters, from sysfs.
	if d2.PortsError != "" || len(d2.Ports) == 0 && exportsCounters(env.Device) {
		t.Fatalf("hardware counters of %s: %v (%s)", env.Device, d2.Ports, d2.PortsError)
	}
	if len(d2.Ports) == 0 {
		t.Logf("%s's driver exports no counters in sysfs (Soft-iWARP has none): no ports listed", env.Device)
	}
	if strings.HasPrefix(env.Device, "rxe") {
		port := func(d DeviceMetrics) PortCounters {
			for _, p := range d.Ports {
				if p.Port == 1 {
					return p
				}
			}
			t.Fatalf("%s has no port 1 counters: %+v", d.Device, d.Ports)
			return PortCounters{}
		}
		p0, p2 := port(deviceMetrics(m1, env.Device)), port(d2)
		for _, name := range []string{"rcvd_rnr_err", "send_rnr_err", "retry_exceeded_err", "rcvd_seq_err", "out_of_seq_request"} {
			if _, ok := p2.HW[name]; !ok {
				t.Errorf("%s port 1 has no %s counter: %v", env.Device, name, p2.HW)
			}
		}
		if p2.HW["sent_pkts"] <= p0.HW["sent_pkts"] || p2.HW["rcvd_pkts"] <= p0.HW["rcvd_pkts"] {
			t.Errorf("%s port 1's packet counters did not move: sent %d -> %d, received %d -> %d", env.Device,
				p0.HW["sent_pkts"], p2.HW["sent_pkts"], p0.HW["rcvd_pkts"], p2.HW["rcvd_pkts"])
		}
		t.Logf("%s port 1: %v", env.Device, p2.HW)
	}

	for _, conn := range []*Conn{c, s, c2, s2} {
		if err := conn.Close(); err != nil {
			t.Fatal(err)
		}
	}
	ln.Close()
	d3 := deviceMetrics(ReadMetrics(), env.Device)
	if d3.ConnsOpen != 0 {
		t.Errorf("every connection closed: ConnsOpen %d", d3.ConnsOpen)
	}
	checkNoneWentDown(t, "after Close", d2.Counters, d3.Counters)
	waitNoDevice(t)
	d4 := deviceMetrics(ReadMetrics(), env.Device)
	checkNoneWentDown(t, "after the device was torn down", d3.Counters, d4.Counters)
	if d4.ConnsOpen != 0 || d4.PoolMappedBytes != 0 || d4.PoolInUseBytes != 0 || d4.ConnsTotal != d2.ConnsTotal {
		t.Errorf("the device torn down: ConnsOpen %d, pool %d mapped %d in use, ConnsTotal %d (want 0, 0, 0, %d)",
			d4.ConnsOpen, d4.PoolMappedBytes, d4.PoolInUseBytes, d4.ConnsTotal, d2.ConnsTotal)
	}
}

// exportsCounters reports whether the named device's driver has a counter
// directory in sysfs (hw_counters, the device's or a port's, or a port's
// counters).
func exportsCounters(device string) bool {
	for _, pat := range []string{"hw_counters", "ports/*/hw_counters", "ports/*/counters"} {
		if m, _ := filepath.Glob(filepath.Join("/sys/class/infiniband", device, pat)); len(m) > 0 {
			return true
		}
	}
	return false
}
