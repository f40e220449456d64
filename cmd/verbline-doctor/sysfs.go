package main

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// The kernel's view of RDMA devices, read from sysfs:
//
//	sys/class/infiniband/<dev>/node_type               "1: CA", or "4: RNIC" for an iWARP device
//	sys/class/infiniband/<dev>/parent                  the netdev of Soft-RoCE (rxe)
//	sys/class/infiniband/<dev>/device/net/<netdev>     the netdevs of a NIC's PCI function
//	sys/class/infiniband/<dev>/ports/<p>/state         "4: ACTIVE"
//	sys/class/infiniband/<dev>/ports/<p>/phys_state    "5: LinkUp"
//	sys/class/infiniband/<dev>/ports/<p>/link_layer    "Ethernet" or "InfiniBand"
//	sys/class/infiniband/<dev>/ports/<p>/gids/<i>      "0000:...:ffff:a9fe:4d01" (all zero: empty slot)
//	sys/class/infiniband/<dev>/ports/<p>/gid_attrs/types/<i>  "RoCE v2", "IB/RoCE v1"
//	sys/class/infiniband/<dev>/ports/<p>/gid_attrs/ndevs/<i>  the netdev the GID belongs to
//
// sysfs has no port MTU: it comes from libibverbs (Env.Verbs) or, for RoCE,
// from the netdev's MTU (sys/class/net/<netdev>/mtu). Nor does it name the
// netdev of an iWARP device without a PCI function (siw): the kernel's
// RDMA netlink does (`rdma link show`, Env.Links).

const sysInfiniband = "sys/class/infiniband"

// Device is an RDMA device.
type Device struct {
	Name    string
	Netdevs []string // from parent (rxe, siw) and device/net (NICs)
	Ports   []*Port
	InVerbs bool // libibverbs lists it (set by mergeVerbs)
}

// Port is one port of a device.
type Port struct {
	Device    string
	Num       int
	State     string // "ACTIVE", "DOWN", "INIT", ...
	PhysState string // "LinkUp", "Disabled", ...
	LinkLayer string // "Ethernet" or "InfiniBand"
	IWARP     bool   // the device speaks iWARP (RDMA over TCP), not RoCE, on its Ethernet port
	ActiveMTU int    // bytes; 0 if unknown
	MTUSource string // where ActiveMTU comes from
	Netdevs   []string
	GIDs      []GID
}

func (p *Port) String() string { return p.Device + "/" + strconv.Itoa(p.Num) }

// Ethernet reports a RoCE port.
func (p *Port) Ethernet() bool { return p.LinkLayer == "Ethernet" }

// GID is one valid entry of a port's GID table.
type GID struct {
	Index  int
	Addr   netip.Addr // IPv4-mapped GIDs unmapped to IPv4
	Type   string     // "RoCE v2", "IB/RoCE v1"
	Netdev string
}

// readDevices reads every RDMA device under root. A missing
// sys/class/infiniband means no device (and no error).
func readDevices(root string) ([]*Device, error) {
	dir := filepath.Join(root, sysInfiniband)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var devs []*Device
	for _, e := range ents {
		d, err := readDevice(root, filepath.Join(dir, e.Name()), e.Name())
		if err != nil {
			return nil, err
		}
		devs = append(devs, d)
	}
	return devs, nil
}

func readDevice(root, dir, name string) (*Device, error) {
	d := &Device{Name: name}
	if p := readLine(filepath.Join(dir, "parent")); p != "" {
		d.Netdevs = append(d.Netdevs, p)
	}
	if ents, err := os.ReadDir(filepath.Join(dir, "device", "net")); err == nil {
		for _, e := range ents {
			d.Netdevs = appendUnique(d.Netdevs, e.Name())
		}
	}
	iwarp := afterColon(readLine(filepath.Join(dir, "node_type"))) == "RNIC"
	ports, err := os.ReadDir(filepath.Join(dir, "ports"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, e := range ports {
		num, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		pdir := filepath.Join(dir, "ports", e.Name())
		p := &Port{
			Device:    name,
			Num:       num,
			State:     afterColon(readLine(filepath.Join(pdir, "state"))),
			PhysState: afterColon(readLine(filepath.Join(pdir, "phys_state"))),
			LinkLayer: readLine(filepath.Join(pdir, "link_layer")),
			IWARP:     iwarp,
		}
		p.GIDs = readGIDs(pdir)
		// The port's netdevs are those its GIDs belong to (a dual-port NIC
		// lists both ports' netdevs under device/net); a port whose table
		// names none falls back to the device's.
		for _, g := range p.GIDs {
			if g.Netdev != "" {
				p.Netdevs = appendUnique(p.Netdevs, g.Netdev)
			}
		}
		if len(p.Netdevs) == 0 {
			p.Netdevs = append(p.Netdevs, d.Netdevs...)
		}
		if p.Ethernet() && !p.IWARP {
			p.ActiveMTU, p.MTUSource = roceMTU(root, p.Netdevs)
		}
		d.Ports = append(d.Ports, p)
	}
	sort.Slice(d.Ports, func(i, j int) bool { return d.Ports[i].Num < d.Ports[j].Num })
	return d, nil
}

// readGIDs reads the valid entries of a port's GID table, by index.
func readGIDs(pdir string) []GID {
	ents, err := os.ReadDir(filepath.Join(pdir, "gids"))
	if err != nil {
		return nil
	}
	var out []GID
	for _, e := range ents {
		idx, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		addr, ok := parseGID(readLine(filepath.Join(pdir, "gids", e.Name())))
		if !ok || addr.IsUnspecified() {
			continue // an empty slot (its attributes read as EINVAL)
		}
		out = append(out, GID{
			Index:  idx,
			Addr:   addr,
			Type:   readLine(filepath.Join(pdir, "gid_attrs", "types", e.Name())),
			Netdev: readLine(filepath.Join(pdir, "gid_attrs", "ndevs", e.Name())),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out
}

// parseGID parses sysfs's "fe80:0000:...:225a" form (eight groups of four
// hex digits), unmapping IPv4-mapped GIDs.
func parseGID(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// roceMTU derives a RoCE port's active MTU from its netdev's MTU as the
// kernel does (iboe_get_mtu): the largest IB MTU that fits in the netdev MTU
// less the RoCE headers (GRH 40 + BTH 12 + extended headers 32 + ICRC 4).
func roceMTU(root string, netdevs []string) (int, string) {
	for _, n := range netdevs {
		m, err := strconv.Atoi(readLine(filepath.Join(root, "sys/class/net", n, "mtu")))
		if err != nil {
			continue
		}
		return ibMTU(m - 88), "from " + n + "'s mtu " + strconv.Itoa(m)
	}
	return 0, ""
}

func ibMTU(n int) int {
	for _, m := range []int{4096, 2048, 1024, 512, 256} {
		if n >= m {
			return m
		}
	}
	return 0
}

// readLine returns a file's content without surrounding space, "" if it
// cannot be read.
func readLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// afterColon turns sysfs's "4: ACTIVE" into "ACTIVE".
func afterColon(s string) string {
	if _, v, ok := strings.Cut(s, ":"); ok {
		return strings.TrimSpace(v)
	}
	return s
}

func appendUnique(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}

// addLinkNetdevs gives the ports whose netdev sysfs does not name (siw) the
// one the kernel's RDMA netlink reports. A failure to read it leaves them
// as they are (the gids check then says no netdev is bound).
func addLinkNetdevs(devs []*Device, links func() (map[string]string, error)) {
	var m map[string]string
	for _, d := range devs {
		for _, p := range d.Ports {
			if len(p.Netdevs) > 0 {
				continue
			}
			if m == nil {
				var err error
				if m, err = links(); err != nil || m == nil {
					return
				}
			}
			if n := m[p.String()]; n != "" {
				p.Netdevs = []string{n}
				d.Netdevs = appendUnique(d.Netdevs, n)
			}
		}
	}
}
