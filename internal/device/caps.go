//go:build linux && cgo

package device

import (
	"errors"
	"fmt"
	"strings"

	"github.com/verbline/rdma/internal/verbs"
)

// Caps is what a device can do, as the library's paths ask it. It is read
// once, when the device's first connection acquires it (Device.Caps), and
// the doctor reports it. Paths are chosen by these capabilities, never by
// the driver's name; what a driver gets wrong is quirks.go's.
//
// docs/devices.md has the table of what each path needs and what each
// tested provider has.
type Caps struct {
	Transport verbs.Transport // InfiniBand (also RoCE: its ports' link layer is Ethernet) or iWARP

	// MemoryWindows: type 2 windows, bound through a QP's send queue and
	// valid for that QP only. A message larger than the peer's receive
	// buffers is lent to the peer for one RDMA READ through one, and an
	// Export is a key of its own, without registering memory on the data
	// path. MemoryWindowType1: windows bound by a verb of their own, valid
	// for any QP of the protection domain (not used).
	MemoryWindows, MemoryWindowType1 bool
	// Immediates: SEND and RDMA WRITE with immediate data, where each
	// message of the wire protocol carries its kind and credits
	// (docs/protocol.md). The iWARP protocol has none: there connections
	// carry them in trailers (protocol 1.4, the root's trailer.go).
	Immediates bool
	// Atomics: RDMA compare-and-swap and fetch-and-add, and against what
	// they are atomic (none on iWARP).
	Atomics verbs.AtomicCap
	// UD: unreliable datagram QPs, behind PacketConn (iWARP is RC only).
	UD bool
	// SRQ: shared receive queues.
	SRQ bool
	// MaxSendSGE and MaxReadSGE: scatter/gather entries of a send and of
	// an RDMA READ's sink (1 on iWARP).
	MaxSendSGE, MaxReadSGE int
	// ReadDepth and ReadInitDepth: the RDMA READs (and atomics) a QP may
	// have outstanding as their target and as their initiator.
	ReadDepth, ReadInitDepth int
	// PrivateDataConnect and PrivateDataAccept: the room rdma_cm leaves
	// the application in a connect request's and in an accept's private
	// data, where the handshake travels.
	PrivateDataConnect, PrivateDataAccept int
	// ActiveSendsFirst: the connecting side must send the first message
	// of a connection (iWARP's MPA; rdma_connect(3)).
	ActiveSendsFirst bool
	// CMConnectsQP: the CM moves the QP from INIT to RTS itself, at
	// rdma_connect and rdma_accept (iWARP's iw_cm), and the connecting
	// side learns the answer from ESTABLISHED, without CONNECT_RESPONSE
	// and rdma_establish. Such a QP stays tied to its connection's stream:
	// it is not pooled for another connection.
	CMConnectsQP bool
	// SendsCompleteLocally: a send or write completes once the transport
	// (TCP) took it, before the peer has it, and may complete before an
	// earlier RDMA READ that still waits for its response (iWARP; on
	// InfiniBand and RoCE requests complete in order, each once the peer
	// acknowledged it). A READ then retires only by its own completion.
	SendsCompleteLocally bool
	// ReadSinkRemoteWrite: the memory an RDMA READ lands in must be
	// registered with remote write access (iWARP: the responder's data
	// arrives as tagged writes into the sink).
	ReadSinkRemoteWrite bool
}

// rdma_cm's private-data room in the TCP port space: InfiniBand's CM
// carries 92 bytes in a request and 196 in a reply, of which rdma_cm takes
// 36 of the request's for its own header; iWARP's MPA carries at most 252
// once MPA version 2 is negotiated.
const (
	ibPrivateDataConnect = 56
	ibPrivateDataAccept  = 196
	iwarpPrivateData     = 252
)

// CapsOf is the capabilities of a device with attributes a.
func CapsOf(a *verbs.DeviceAttr) Caps {
	iwarp := a.Transport == verbs.TransportIWARP
	c := Caps{
		Transport:          a.Transport,
		MemoryWindows:      a.MemWindow2,
		MemoryWindowType1:  a.MemWindow1,
		Immediates:         !iwarp,
		Atomics:            a.Atomics,
		UD:                 !iwarp,
		SRQ:                a.MaxSRQ > 0,
		MaxSendSGE:         a.MaxSGE,
		MaxReadSGE:         a.MaxSGERd,
		ReadDepth:          a.MaxQPRdAtom,
		ReadInitDepth:      a.MaxQPInitRdAtom,
		PrivateDataConnect: ibPrivateDataConnect,
		PrivateDataAccept:  ibPrivateDataAccept,
	}
	if iwarp {
		c.PrivateDataConnect, c.PrivateDataAccept = iwarpPrivateData, iwarpPrivateData
		c.ActiveSendsFirst = true
		c.CMConnectsQP = true
		c.SendsCompleteLocally = true
		c.ReadSinkRemoteWrite = true
		c.Atomics = verbs.AtomicNone // iWARP has no atomic operations, whatever a driver reports
	}
	return c
}

// String is c in one line, as the doctor reports it.
func (c Caps) String() string {
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	var w []string
	w = append(w, "transport "+c.Transport.String())
	mw := yes(c.MemoryWindows)
	if !c.MemoryWindows && c.MemoryWindowType1 {
		mw = "type 1 only"
	}
	w = append(w, "memory windows "+mw, "immediates "+yes(c.Immediates), "atomics "+c.Atomics.String(),
		"UD "+yes(c.UD), "SRQ "+yes(c.SRQ),
		fmt.Sprintf("SGEs send %d, READ sink %d", c.MaxSendSGE, c.MaxReadSGE),
		fmt.Sprintf("READ depth %d (initiator %d)", c.ReadDepth, c.ReadInitDepth),
		fmt.Sprintf("CM private data %d on connect, %d on accept", c.PrivateDataConnect, c.PrivateDataAccept))
	if c.ActiveSendsFirst {
		w = append(w, "the connecting side sends first")
	}
	if c.CMConnectsQP {
		w = append(w, "the CM connects the QP")
	}
	if c.SendsCompleteLocally {
		w = append(w, "sends complete locally")
	}
	if c.ReadSinkRemoteWrite {
		w = append(w, "READ sinks need remote write")
	}
	return strings.Join(w, "; ")
}

// DatagramError says why a PacketConn cannot run on a device with c (named
// name), or returns nil.
func (c Caps) DatagramError(name string) error {
	if c.UD {
		return nil
	}
	return fmt.Errorf("%w: device %s (%s) has no UD queue pairs, which datagrams need: "+
		"use an InfiniBand or RoCE device, or a Conn (docs/devices.md)", errors.ErrUnsupported, name, c.Transport)
}
