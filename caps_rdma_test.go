//go:build linux && cgo

package rdma

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/verbs"
)

// testDeviceCaps is the capabilities of the test device, read as the
// library reads them.
func testDeviceCaps(t *testing.T) device.Caps {
	t.Helper()
	env := rdmatest.Require(t)
	ctx, err := verbs.OpenDevice(env.Device)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	a, err := ctx.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	return device.CapsOf(a)
}

// TestConnOnDeviceCapabilities: a connection runs on the test device
// whatever it has, and uses trailers exactly where the device has no
// immediate data (iWARP) or the run forces them (RDMA_TEST_TRAILERS).
func TestConnOnDeviceCapabilities(t *testing.T) {
	caps := testDeviceCaps(t)
	t.Logf("test device: %s", caps)
	checkLeaksAtEnd(t)
	ln := listenTest(t, nil)
	defer ln.Close()
	wg := echoServer(ln)
	defer wg.Wait()
	defer ln.Close()
	c, err := Dial("rdma", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echo(c, 1); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	trailers := c.trailers
	c.mu.Unlock()
	if want := !caps.Immediates || forceTrailers.Load(); trailers != want {
		t.Fatalf("the connection uses trailers: %v, want %v (immediate data: %v)", trailers, want, caps.Immediates)
	}

	// DeviceInfo says what the device read here says, and an inline room
	// no larger than the connection's QP has (the library may ask for
	// less than the device's most: siw grants 80 bytes, the library uses 64).
	info, err := c.DeviceInfo()
	if err != nil {
		t.Fatal(err)
	}
	qi, err := c.QPInfo()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("DeviceInfo: %s", info)
	want := DeviceInfo{
		Name: rdmatest.Require(t).Device, Transport: caps.Transport.String(),
		MemoryWindows: caps.MemoryWindows, Immediates: caps.Immediates, Atomics: caps.Atomics != verbs.AtomicNone,
		Datagrams: caps.UD, MaxInline: info.MaxInline, MaxSendSGE: caps.MaxSendSGE, MaxReadSGE: caps.MaxReadSGE,
		ReadDepth: caps.ReadDepth, PrivateDataConnect: caps.PrivateDataConnect, PrivateDataAccept: caps.PrivateDataAccept,
		ActiveSendsFirst: caps.ActiveSendsFirst, SendsCompleteLocally: caps.SendsCompleteLocally,
	}
	if info.MaxInline > qi.MaxInline || (qi.MaxInline > 0 && info.MaxInline <= 0) {
		t.Errorf("DeviceInfo.MaxInline %d, want from 1 to the QP's %d", info.MaxInline, qi.MaxInline)
	}
	if info != want {
		t.Errorf("DeviceInfo %+v, want %+v", info, want)
	}
	c.Close()
	if _, err := c.DeviceInfo(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("DeviceInfo after Close: %v, want net.ErrClosed", err)
	}
}

// TestPacketConnOnDeviceCapabilities: a PacketConn opens where the device
// has UD queue pairs, and on a device without (iWARP) ListenPacket fails
// with errors.ErrUnsupported, naming what the device lacks.
func TestPacketConnOnDeviceCapabilities(t *testing.T) {
	caps := testDeviceCaps(t)
	env := rdmatest.Require(t)
	checkLeaksAtEnd(t)
	p, err := ListenPacket("rdma", net.JoinHostPort(env.Addr, "0"))
	if !caps.UD {
		if err == nil {
			p.Close()
			t.Fatal("ListenPacket succeeded on a device without UD queue pairs")
		}
		if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "UD queue pairs") {
			t.Fatalf("ListenPacket on a device without UD: %v (want errors.ErrUnsupported naming what it lacks)", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}
