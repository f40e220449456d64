package errs

import (
	"errors"
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
