//go:build linux && cgo

// Package verbs is a thin, typed cgo layer over libibverbs.
//
// Every object owns its parent (a QP keeps its PD and CQs alive, an MR its PD)
// and Close is idempotent, freeing in reverse order of creation. C pointers stay
// unexported; work-request ids are plain integers chosen by the caller, never Go
// pointers. Work requests cross the cgo boundary in batches (PostSend, PostRecv,
// Poll take slices) so one cgo call serves many messages.
package verbs

/*
#cgo LDFLAGS: -libverbs
#include <infiniband/verbs.h>
*/
import "C"

import (
	"errors"
	"fmt"
	"syscall"
)

// ErrNoDevice is returned when the system has no RDMA device.
var ErrNoDevice = errors.New("no RDMA device found (load a NIC driver, or add Soft-RoCE: " +
	"modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <netdev>; scripts/softroce runs a test guest)")

// ErrClosed is returned by operations on a closed object.
var ErrClosed = errors.New("verbs object already closed")

// errnoErr turns a C errno (or a negative return) into a wrapped syscall.Errno.
func errnoErr(op string, err error, ret C.int) error {
	if ret < 0 {
		ret = -ret
	}
	if ret != 0 && ret != -1 {
		return &errnoError{op: op, errno: syscall.Errno(ret)}
	}
	if err == nil {
		err = syscall.EIO
	}
	if e, ok := err.(syscall.Errno); ok {
		return &errnoError{op: op, errno: e}
	}
	return fmt.Errorf("%s: %w", op, err)
}
