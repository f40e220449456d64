//go:build linux && cgo

package verbs

/*
#include <stdlib.h>
#include <infiniband/verbs.h>

static uint8_t port_link_layer(struct ibv_port_attr *a) { return a->link_layer; }
// ibv_query_port is a macro over a compat symbol; call it from C.
static int query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a) { return ibv_query_port(c, port, a); }
*/
import "C"

import (
	"fmt"
	"net"
	"sync"
	"unsafe"
)

// DeviceNames lists the RDMA devices present, or ErrNoDevice.
func DeviceNames() ([]string, error) {
	var n C.int
	list, err := C.ibv_get_device_list(&n)
	if list == nil {
		if err != nil {
			return nil, fmt.Errorf("ibv_get_device_list: %w (is rdma-core installed and /dev/infiniband present?)", err)
		}
		return nil, ErrNoDevice
	}
	defer C.ibv_free_device_list(list)
	devs := unsafe.Slice(list, int(n))
	names := make([]string, 0, n)
	for _, d := range devs {
		names = append(names, C.GoString(C.ibv_get_device_name(d)))
	}
	if len(names) == 0 {
		return nil, ErrNoDevice
	}
	return names, nil
}

// IWARPDevices lists the iWARP devices present (none on error).
func IWARPDevices() []string {
	var n C.int
	list := C.ibv_get_device_list(&n)
	if list == nil {
		return nil
	}
	defer C.ibv_free_device_list(list)
	var names []string
	for _, d := range unsafe.Slice(list, int(n)) {
		if d.transport_type == C.IBV_TRANSPORT_IWARP {
			names = append(names, C.GoString(C.ibv_get_device_name(d)))
		}
	}
	return names
}

// Context is an open device.
type Context struct {
	mu    sync.Mutex
	ctx   *C.struct_ibv_context
	owned bool // opened by us (ibv_open_device), not borrowed from rdma_cm
	name  string
}

// OpenDevice opens the named device ("" picks the first one).
func OpenDevice(name string) (*Context, error) {
	var n C.int
	list, err := C.ibv_get_device_list(&n)
	if list == nil {
		if err != nil {
			return nil, fmt.Errorf("ibv_get_device_list: %w", err)
		}
		return nil, ErrNoDevice
	}
	defer C.ibv_free_device_list(list)
	for _, d := range unsafe.Slice(list, int(n)) {
		dn := C.GoString(C.ibv_get_device_name(d))
		if name != "" && dn != name {
			continue
		}
		ctx, err := C.ibv_open_device(d)
		if ctx == nil {
			return nil, errnoErr("ibv_open_device "+dn, err, 0)
		}
		return &Context{ctx: ctx, owned: true, name: dn}, nil
	}
	if n == 0 {
		return nil, ErrNoDevice
	}
	return nil, fmt.Errorf("RDMA device %q not found: %w", name, ErrNoDevice)
}

// WrapContext wraps a context owned by someone else (rdma_cm's id->verbs);
// Close does not close it. ptr must be a *C.struct_ibv_context.
func WrapContext(ptr unsafe.Pointer) *Context {
	c := (*C.struct_ibv_context)(ptr)
	return &Context{ctx: c, name: C.GoString(C.ibv_get_device_name(c.device))}
}

// Name is the device name (e.g. "rxe0").
func (c *Context) Name() string { return c.name }

// Close closes the device if this Context opened it. Idempotent.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil {
		return nil
	}
	var err error
	if c.owned {
		if ret := C.ibv_close_device(c.ctx); ret != 0 {
			err = errnoErr("ibv_close_device", nil, ret)
		}
	}
	c.ctx = nil
	return err
}

// PortState mirrors enum ibv_port_state.
type PortState uint8

const PortActive PortState = C.IBV_PORT_ACTIVE

func (s PortState) String() string {
	switch s {
	case C.IBV_PORT_DOWN:
		return "DOWN"
	case C.IBV_PORT_INIT:
		return "INIT"
	case C.IBV_PORT_ARMED:
		return "ARMED"
	case C.IBV_PORT_ACTIVE:
		return "ACTIVE"
	case C.IBV_PORT_ACTIVE_DEFER:
		return "ACTIVE_DEFER"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// GIDType is the kind of a GID table entry.
type GIDType uint8

const (
	GIDTypeIB GIDType = iota
	GIDTypeRoCEv1
	GIDTypeRoCEv2
)

func (t GIDType) String() string {
	return [...]string{"IB", "RoCEv1", "RoCEv2"}[t%3]
}

// GID is one entry of a port's GID table.
type GID struct {
	Index  int
	Raw    [16]byte
	Type   GIDType
	Netdev string // the network device the GID belongs to (RoCE), "" if none
}

// IP returns the GID as an IP address (IPv4-mapped GIDs come back as IPv4).
func (g GID) IP() net.IP { return net.IP(g.Raw[:]) }

// Port describes one port of a device.
type Port struct {
	Num          uint8
	State        PortState
	ActiveMTU    MTU
	MaxMTU       MTU
	GIDTableLen  int
	PKeyTableLen uint16
	LID          uint16
	Ethernet     bool // link layer is Ethernet (RoCE)
	GIDs         []GID
}

// Limits returns what CheckTransition needs to know about this port.
func (p *Port) Limits(dev *DeviceAttr) PortLimits {
	l := PortLimits{
		PhysPorts:   dev.PhysPorts,
		ActiveMTU:   p.ActiveMTU,
		GIDTableLen: p.GIDTableLen,
		Ethernet:    p.Ethernet,
		MaxPKeys:    p.PKeyTableLen,
	}
	if dev.MaxQPRdAtom > 255 {
		l.MaxQPRdAtom = 255
	} else {
		l.MaxQPRdAtom = uint8(dev.MaxQPRdAtom)
	}
	if dev.MaxQPInitRdAtom > 255 {
		l.MaxQPInitRdAtom = 255
	} else {
		l.MaxQPInitRdAtom = uint8(dev.MaxQPInitRdAtom)
	}
	return l
}

// DeviceAttr holds the device limits the library uses.
type DeviceAttr struct {
	PhysPorts       uint8
	MaxQP           int
	MaxQPWR         int
	MaxSGE          int
	MaxCQE          int
	MaxMR           int
	MaxMRSize       uint64
	MaxQPRdAtom     int
	MaxQPInitRdAtom int
	MaxSRQWR        int
	MaxMW           int
	MemWindow2      bool // type 2 memory windows (bound through the send queue, scoped to one QP)
	MemWindow1      bool // type 1 memory windows (bound by a verb of their own, scoped to the PD)
	Atomics         AtomicCap
	MaxSGERd        int // scatter/gather entries of an RDMA READ's sink
	MaxSRQ          int
	Transport       Transport
}

// Transport mirrors enum ibv_transport_type: the wire protocol the device
// speaks. RoCE devices report InfiniBand (their ports' link layer is
// Ethernet).
type Transport int

const (
	TransportIB    Transport = C.IBV_TRANSPORT_IB
	TransportIWARP Transport = C.IBV_TRANSPORT_IWARP
)

func (t Transport) String() string {
	switch t {
	case TransportIB:
		return "InfiniBand"
	case TransportIWARP:
		return "iWARP"
	}
	return fmt.Sprintf("transport %d", int(t))
}

// AtomicCap mirrors enum ibv_atomic_cap: whether the device executes RDMA
// atomics and against what they are atomic.
type AtomicCap int

const (
	AtomicNone AtomicCap = C.IBV_ATOMIC_NONE // no atomics (iWARP devices, siw)
	AtomicHCA  AtomicCap = C.IBV_ATOMIC_HCA  // atomic against other atomics through this device
	AtomicGlob AtomicCap = C.IBV_ATOMIC_GLOB // atomic against every device's atomics as well
)

func (a AtomicCap) String() string {
	switch a {
	case AtomicNone:
		return "none"
	case AtomicHCA:
		return "device (HCA)"
	case AtomicGlob:
		return "global"
	}
	return fmt.Sprintf("atomic_cap %d", int(a))
}

// QueryDevice returns the device's limits.
func (c *Context) QueryDevice() (*DeviceAttr, error) {
	var a C.struct_ibv_device_attr
	if ret := C.ibv_query_device(c.ctx, &a); ret != 0 {
		return nil, errnoErr("ibv_query_device "+c.name, nil, ret)
	}
	return &DeviceAttr{
		PhysPorts: uint8(a.phys_port_cnt), MaxQP: int(a.max_qp), MaxQPWR: int(a.max_qp_wr),
		MaxSGE: int(a.max_sge), MaxCQE: int(a.max_cqe), MaxMR: int(a.max_mr), MaxMRSize: uint64(a.max_mr_size),
		MaxQPRdAtom: int(a.max_qp_rd_atom), MaxQPInitRdAtom: int(a.max_qp_init_rd_atom), MaxSRQWR: int(a.max_srq_wr),
		MaxMW: int(a.max_mw), MemWindow2: a.device_cap_flags&C.IBV_DEVICE_MEM_WINDOW_TYPE_2B != 0 && a.max_mw > 0,
		MemWindow1: a.device_cap_flags&C.IBV_DEVICE_MEM_WINDOW != 0 && a.max_mw > 0,
		Atomics:    AtomicCap(a.atomic_cap), MaxSGERd: int(a.max_sge_rd), MaxSRQ: int(a.max_srq),
		Transport: Transport(c.ctx.device.transport_type),
	}, nil
}

// QueryPort returns a port's state, MTUs and table sizes (QueryGIDs adds the
// GID entries, which cost a query each).
func (c *Context) QueryPort(num uint8) (*Port, error) {
	var a C.struct_ibv_port_attr
	if ret := C.query_port(c.ctx, C.uint8_t(num), &a); ret != 0 {
		return nil, errnoErr(fmt.Sprintf("ibv_query_port %s/%d", c.name, num), nil, ret)
	}
	p := &Port{
		Num: num, State: PortState(a.state), ActiveMTU: MTU(a.active_mtu), MaxMTU: MTU(a.max_mtu),
		GIDTableLen: int(a.gid_tbl_len), PKeyTableLen: uint16(a.pkey_tbl_len), LID: uint16(a.lid),
		Ethernet: C.port_link_layer(&a) == C.IBV_LINK_LAYER_ETHERNET,
	}
	return p, nil
}

// QueryGIDs fills p.GIDs with the port's valid GID entries.
func (c *Context) QueryGIDs(p *Port) error {
	num := p.Num
	p.GIDs = p.GIDs[:0]
	for i := 0; i < p.GIDTableLen; i++ {
		var e C.struct_ibv_gid_entry
		if ret := C._ibv_query_gid_ex(c.ctx, C.uint32_t(num), C.uint32_t(i), &e, 0, C.size_t(unsafe.Sizeof(e))); ret != 0 {
			continue // an empty slot (ENODATA) or a provider without the extended query
		}
		g := GID{Index: i, Type: GIDType(e.gid_type)}
		copy(g.Raw[:], C.GoBytes(unsafe.Pointer(&e.gid), 16))
		if e.ndev_ifindex != 0 {
			if ifc, err := net.InterfaceByIndex(int(e.ndev_ifindex)); err == nil {
				g.Netdev = ifc.Name
			}
		}
		p.GIDs = append(p.GIDs, g)
	}
	return nil
}

// GIDIndexFor returns the index of the GID of the given type that maps ip, or -1.
func (p *Port) GIDIndexFor(ip net.IP, typ GIDType) int {
	for _, g := range p.GIDs {
		if g.Type == typ && g.IP().Equal(ip) {
			return g.Index
		}
	}
	return -1
}

// Key identifies the underlying device context (stable while it is open), so
// per-device state can be shared by everything that uses the same context.
func (c *Context) Key() uintptr { return uintptr(unsafe.Pointer(c.ctx)) }
