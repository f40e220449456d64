//go:build linux && cgo

package device

import (
	"os"

	"github.com/verbline/rdma/internal/testhooks"
)

// Provider quirks: what a device's driver gets wrong, detected here so
// that the connections' paths are chosen by what the device is, once.
//
// Soft-RoCE (rxe) re-executes a memory-window bind when it retransmits,
// and a bind re-executed silently stops the QP's requester (the root
// package's post.go has the analysis): on rxe a window is bound only
// into a send queue known to be empty. rxe also bounds a window's accesses
// by the MR it is bound over rather than by the window's range
// (Device.LendExact).

// QuietBind reports whether memory windows must be bound into an empty
// send queue on d: Soft-RoCE devices, unless the fault tests' control
// runs turned the rule off (testhooks.RXEBindAnytime).
func (d *Device) QuietBind() bool {
	return d.rxe && !testhooks.RXEBindAnytime.Load()
}

// IsSoftRoCE reports whether the named device is a Soft-RoCE (rxe)
// device: those have a "parent" (their netdev) in sysfs that hardware
// devices do not.
func IsSoftRoCE(name string) bool {
	_, err := os.Stat("/sys/class/infiniband/" + name + "/parent")
	return err == nil
}
