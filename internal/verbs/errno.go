//go:build linux && cgo

package verbs

import (
	"errors"
	"syscall"
)

func isErrno(err error, n syscall.Errno) bool {
	var e syscall.Errno
	return errors.As(err, &e) && e == n
}
