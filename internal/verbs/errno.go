//go:build linux && cgo

package verbs

import (
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

func isErrno(err error, n syscall.Errno) bool {
	var e syscall.Errno
	return errors.As(err, &e) && e == n
}

// errnoError is a failed verb and its errno: "ibv_modify_qp: invalid
// argument (EINVAL)". It unwraps to the syscall.Errno, so errors.Is(err,
// syscall.EINVAL) holds.
type errnoError struct {
	op    string
	errno syscall.Errno
}

func (e *errnoError) Error() string { return e.op + ": " + errnoText(e.errno) }

func (e *errnoError) Unwrap() error { return e.errno }

// errnoText is the errno's text and symbolic name, "invalid argument (EINVAL)".
func errnoText(e syscall.Errno) string {
	if name := unix.ErrnoName(e); name != "" {
		return e.Error() + " (" + name + ")"
	}
	return fmt.Sprintf("%s (errno %d)", e.Error(), int(e))
}
