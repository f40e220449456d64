//go:build !linux || !cgo

package rdma

import (
	"context"
	"errors"
	"net"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

// checkNoRDMA checks the error of a dial or listen in a build without RDMA:
// a *net.OpError as on Linux (op, network, the resolved address) wrapping
// ErrNoDevice, with a message that says what RDMA needs and not the Linux
// advice of ErrNoDevice's own text.
func checkNoRDMA(t *testing.T, what string, err error, op, network, addr string) {
	t.Helper()
	if !errors.Is(err, ErrNoDevice) {
		t.Errorf("%s: %v, want an error wrapping ErrNoDevice", what, err)
	}
	var opErr *net.OpError
	if !errors.As(err, &opErr) {
		t.Fatalf("%s: %T %v, want a *net.OpError", what, err, err)
	}
	if opErr.Op != op || opErr.Net != network || opErr.Source != nil {
		t.Errorf("%s: OpError{Op %q Net %q Source %v}, want Op %q Net %q", what, opErr.Op, opErr.Net, opErr.Source, op, network)
	}
	if opErr.Addr == nil || opErr.Addr.String() != addr || opErr.Addr.Network() != "rdma" {
		t.Errorf("%s: OpError.Addr %v, want the rdma address %s", what, opErr.Addr, addr)
	}
	build := "CGO_ENABLED=0"
	if runtime.GOOS != "linux" {
		build = "GOOS=" + runtime.GOOS
	}
	msg := err.Error()
	for _, want := range []string{op + " " + network + " " + addr + ": ", "RDMA needs cgo and rdma-core on Linux", build, "libibverbs-dev"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%s: %q does not say %q", what, msg, want)
		}
	}
	if strings.Contains(msg, "modprobe") {
		t.Errorf("%s: %q gives the Linux advice for a missing device", what, msg)
	}
}

func TestNoRDMADialListen(t *testing.T) {
	ctx := context.Background()

	c, err := Dial("rdma", "10.0.0.1:7471")
	if c != nil {
		t.Errorf("Dial returned a Conn")
	}
	checkNoRDMA(t, "Dial", err, "dial", "rdma", "10.0.0.1:7471")

	nc, err := (&Dialer{Timeout: time.Second}).DialContext(ctx, "tcp6", "[fd00::1]:80")
	if nc != nil {
		t.Errorf("DialContext returned a non-nil net.Conn (%#v)", nc)
	}
	checkNoRDMA(t, "DialContext", err, "dial", "rdma6", "[fd00::1]:80")

	ln, err := Listen("rdma", ":0")
	if ln != nil {
		t.Errorf("Listen returned a Listener")
	}
	checkNoRDMA(t, "Listen", err, "listen", "rdma", "0.0.0.0:0")

	ln, err = (&ListenConfig{}).Listen(ctx, "rdma6", "[::1]:7471")
	if ln != nil {
		t.Errorf("ListenConfig.Listen returned a Listener")
	}
	checkNoRDMA(t, "ListenConfig.Listen", err, "listen", "rdma6", "[::1]:7471")

	// Address errors come first, as on Linux.
	if _, err := Dial("rdma", ":7471"); errors.Is(err, ErrNoDevice) || !strings.Contains(err.Error(), "missing host") {
		t.Errorf("Dial without a host: %v, want the missing host error", err)
	}
}

// No *Conn, *Listener or *Export can be obtained in this build, but their
// zero values may be used: every method returns at once, each error wraps
// ErrNoDevice, and each channel is closed (a receive does not block). A
// zero Notification holds no buffer: its Release says so, as in every
// build.
func TestNoRDMAZeroValues(t *testing.T) {
	if err := (Notification{}).Release(); err == nil || !strings.Contains(err.Error(), "zero Buf") {
		t.Errorf("Release of a zero Notification: %v, want the zero Buf error", err)
	}
	for _, v := range []any{&Conn{}, &Listener{}, &Export{}} {
		rv := reflect.ValueOf(v)
		for i := range rv.NumMethod() {
			m := rv.Type().Method(i)
			args := make([]reflect.Value, m.Type.NumIn()-1)
			for j := range args {
				args[j] = reflect.Zero(m.Type.In(j + 1))
				if m.Type.In(j+1).String() == "context.Context" {
					args[j] = reflect.ValueOf(context.Background())
				}
			}
			name := rv.Type().String() + "." + m.Name
			for _, out := range rv.Method(i).Call(args) {
				switch {
				case out.Type().String() == "error":
					if err, _ := out.Interface().(error); err != nil && !errors.Is(err, ErrNoDevice) {
						t.Errorf("%s: %v, want nil or ErrNoDevice", name, err)
					}
				case out.Kind() == reflect.Chan:
					if _, ok := out.TryRecv(); ok || out.IsNil() {
						t.Errorf("%s: the channel is not closed", name)
					}
				}
			}
		}
	}
	if _, err := (&Conn{}).Read(make([]byte, 1)); !errors.Is(err, ErrNoDevice) {
		t.Errorf("Read on a zero Conn: %v, want ErrNoDevice", err)
	}
}
