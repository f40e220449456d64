package errs

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
)

// TestDeviceFailedChain: a device failure matches ErrNoDevice, says what
// happened, and keeps the failure that showed it in its chain.
func TestDeviceFailedChain(t *testing.T) {
	cause := syscall.EIO
	err := error(&DeviceFailed{Msg: "reading the RDMA device's async events failed", Cause: cause})
	if !errors.Is(err, ErrNoDevice) || !errors.Is(err, syscall.EIO) || errors.Unwrap(err) != cause {
		t.Errorf("%v: matches ErrNoDevice %v, EIO %v; unwraps to %v", err,
			errors.Is(err, ErrNoDevice), errors.Is(err, syscall.EIO), errors.Unwrap(err))
	}
	if want := "reading the RDMA device's async events failed: " + cause.Error(); err.Error() != want {
		t.Errorf("text %q, want %q", err, want)
	}
	if plain := (&DeviceFailed{Msg: "removed"}); plain.Error() != "removed" || plain.Unwrap() != nil {
		t.Errorf("without a cause: %q, unwraps to %v", plain, plain.Unwrap())
	}
}

// TestCloseTimeout: Close's timeout is a timeout that matches
// os.ErrDeadlineExceeded, so the *net.OpError wrapping it is a net.Error
// timeout, as every deadline error of a Conn.
func TestCloseTimeout(t *testing.T) {
	err := error(&CloseTimeout{What: "data written before Close was not acknowledged by the peer"})
	var ne net.Error = &net.OpError{Op: "close", Net: "rdma", Err: err}
	if !errors.Is(ne, os.ErrDeadlineExceeded) || !ne.Timeout() {
		t.Errorf("%v: matches os.ErrDeadlineExceeded %v, a timeout %v", ne, errors.Is(ne, os.ErrDeadlineExceeded), ne.Timeout())
	}
	want := "timed out after Config.CloseTimeout: data written before Close was not acknowledged by the peer " +
		"(the peer stopped reading; the connection was closed anyway)"
	if err.Error() != want {
		t.Errorf("text %q, want %q", err, want)
	}
}
