//go:build linux && cgo

package device

import (
	"os"

	"github.com/verbline/rdma/internal/testhooks"
	"github.com/verbline/rdma/internal/verbs"
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
//
// Soft-iWARP (siw) transmits an unsignaled send-queue request of a page or
// more straight from its buffer, handing the pages to TCP (sendpage, its
// zcopy_tx default; siw_qp_tx.c), which reads them when it transmits and
// again for a retransmission. The request completes when TCP took it, and
// the library, retiring an unsignaled request at a later completion, gives
// the buffer back (the stream reuses its send buffers, a sent message's Buf
// goes back to its owner) while TCP may still read it: the peer receives
// bytes written after the send. A signaled request siw copies instead, so
// on siw every request of a page or more asks for its completion
// (Device.SignalFrom; the root's sendqueue.go).
//
// Soft-iWARP also serves an RDMA READ from any registration of its
// protection domain named by the request's key, without checking that the
// registration grants remote read (siw_qp_tx.c checks a READ response's
// source with no rights: "LOCAL_READ not defined"): on siw a peer that
// knows or guesses a key and an address of the pool's arenas can read them
// (Device.ReadsIgnoreRights; docs/limits-and-security.md). The library
// never sends such keys; it cannot stop the guess.

// QuietBind reports whether memory windows must be bound into an empty
// send queue on d: Soft-RoCE devices, unless the fault tests' control
// runs turned the rule off (testhooks.RXEBindAnytime).
func (d *Device) QuietBind() bool {
	return d.rxe && !testhooks.RXEBindAnytime.Load()
}

// IsSoftware reports whether the named device has no hardware behind it
// (Soft-RoCE, Soft-iWARP): no "device" link in sysfs, which a PCI NIC has.
func IsSoftware(name string) bool {
	_, err := os.Stat("/sys/class/infiniband/" + name + "/device")
	return err != nil
}

// IsSoftRoCE reports whether the named device is a Soft-RoCE (rxe)
// device: those have a "parent" (their netdev) in sysfs that hardware
// devices do not.
func IsSoftRoCE(name string) bool {
	_, err := os.Stat("/sys/class/infiniband/" + name + "/parent")
	return err == nil
}

// ReadsIgnoreRights reports whether the named device, of capabilities c,
// serves RDMA READs without checking remote-read rights: Soft-iWARP.
func ReadsIgnoreRights(c Caps, name string) bool {
	return c.Transport == verbs.TransportIWARP && IsSoftware(name)
}
