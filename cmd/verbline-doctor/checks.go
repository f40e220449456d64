package main

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

func checkCgo(cgo bool) Result {
	const name = "cgo"
	if !cgo {
		return problem(Fail, name, "this binary was built without cgo: the library reaches libibverbs and librdmacm through cgo",
			"rebuild with cgo on Linux: CGO_ENABLED=1 go build (needs gcc and libibverbs-dev librdmacm-dev)")
	}
	return ok(name, "built with cgo (%s, %s/%s)", runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// checkModules checks the character devices rdma_cm and the verbs need, and
// the kernel modules behind them.
func checkModules(root string) []Result {
	// rdma_ucm exposes rdma_cm to user space: without it rdma_create_event_channel fails.
	cm := checkDevFile(root, "rdma_cm", []string{"dev/infiniband/rdma_cm"}, "rdma_ucm")
	var uverbs []string
	if m, _ := filepath.Glob(filepath.Join(root, "dev/infiniband/uverbs*")); len(m) > 0 {
		for _, p := range m {
			rel, _ := filepath.Rel(root, p)
			uverbs = append(uverbs, rel)
		}
	}
	uv := checkDevFile(root, "uverbs", uverbs, "ib_uverbs")
	return []Result{cm, uv}
}

// checkDevFile checks that the files exist and open for reading and
// writing (as libibverbs and librdmacm open them); module is the kernel
// module that creates them.
func checkDevFile(root, name string, rels []string, module string) Result {
	loaded := exists(filepath.Join(root, "sys/module", module))
	what := "/dev/infiniband/" + name
	if name == "uverbs" {
		what = "/dev/infiniband/uverbs*"
	}
	if len(rels) == 0 || !exists(filepath.Join(root, rels[0])) {
		switch {
		case !loaded:
			return problem(Fail, name, fmt.Sprintf("%s is missing: the %s module is not loaded", what, module),
				fmt.Sprintf("modprobe %s (and add it to /etc/modules-load.d/rdma.conf to load it at boot)", module))
		case name == "uverbs":
			return problem(Fail, name, fmt.Sprintf("%s is missing although %s is loaded: no RDMA device is registered, or this is a container without it", what, module),
				"add a device (see devices); in a container pass them in: docker run --device /dev/infiniband/uverbs0 --device /dev/infiniband/rdma_cm")
		default:
			return problem(Fail, name, fmt.Sprintf("%s is missing although %s is loaded", what, module),
				"in a container pass it in (docker run --device /dev/infiniband/rdma_cm); otherwise recreate it with `udevadm trigger`")
		}
	}
	var names []string
	for _, rel := range rels {
		f, err := os.OpenFile(filepath.Join(root, rel), os.O_RDWR, 0)
		if err != nil {
			if errors.Is(err, fs.ErrPermission) {
				return problem(Fail, name, fmt.Sprintf("cannot open /%s: permission denied", rel),
					"rdma-core's udev rules make it mode 0666: check `ls -l /dev/infiniband`, or run as a user allowed to open it")
			}
			return problem(Fail, name, fmt.Sprintf("cannot open /%s: %v", rel, err),
				fmt.Sprintf("reload the module: modprobe -r %s && modprobe %s", module, module))
		}
		f.Close()
		names = append(names, "/"+rel)
	}
	return ok(name, "%s present and opens read-write (%s loaded)", strings.Join(names, ", "), module)
}

func checkDevices(devs []*Device, err error) Result {
	const name = "devices"
	if err != nil {
		return problem(Fail, name, fmt.Sprintf("cannot read /%s: %v", sysInfiniband, err), "check that sysfs is mounted (mount -t sysfs sysfs /sys)")
	}
	if len(devs) == 0 {
		return problem(Fail, name, "no RDMA device: /"+sysInfiniband+" lists none",
			"load the NIC's RDMA driver (mlx5_ib, irdma, bnxt_re, ...) or add Soft-RoCE: modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <netdev>")
	}
	var parts []string
	for _, d := range devs {
		s := d.Name
		if len(d.Netdevs) > 0 {
			s += " (netdev " + strings.Join(d.Netdevs, ", ") + ")"
		}
		parts = append(parts, s)
	}
	return ok(name, "%s", strings.Join(parts, "; "))
}

// checkVerbs compares libibverbs' view with the kernel's: a device the
// kernel has but libibverbs cannot list lacks its user-space provider.
func checkVerbs(devs []*Device, vdevs []VerbsDevice, verr error) Result {
	const name = "libibverbs"
	if len(devs) == 0 && len(vdevs) == 0 {
		return ok(name, "no device (see devices)")
	}
	if len(vdevs) == 0 {
		detail := fmt.Sprintf("libibverbs lists no device although the kernel has %s", devNames(devs))
		if verr != nil {
			detail += " (" + verr.Error() + ")"
		}
		return problem(Fail, name, detail,
			"install the user-space providers (apt-get install ibverbs-providers rdma-core) and check that /dev/infiniband/uverbs* opens")
	}
	seen := map[string]bool{}
	var opened []string
	for _, v := range vdevs {
		seen[v.Name] = true
		if v.Err != nil {
			return problem(Fail, name, fmt.Sprintf("cannot open %s: %v", v.Name, v.Err),
				"check `ibv_devinfo -d "+v.Name+"` and the kernel log (dmesg) for the driver's errors")
		}
		opened = append(opened, fmt.Sprintf("%s (%d port%s)", v.Name, len(v.Ports), plural(len(v.Ports))))
	}
	var missing []string
	for _, d := range devs {
		if !seen[d.Name] {
			missing = append(missing, d.Name)
		}
	}
	if len(missing) > 0 {
		return problem(Warn, name, fmt.Sprintf("libibverbs does not list %s (it opens %s)", strings.Join(missing, ", "), strings.Join(opened, ", ")),
			"install the provider for its driver (apt-get install ibverbs-providers) and check /dev/infiniband/uverbs*")
	}
	return ok(name, "opens %s", strings.Join(opened, ", "))
}

// checkCaps reports each opened device's capabilities and what the library
// does without the ones it lacks: a device without immediate data (iWARP)
// carries each message's header in a trailer, which peers of wire protocol
// 1.4 and later understand; one without memory windows lends messages and
// exports through keys valid on every connection of the device; one
// without UD queue pairs has no PacketConn; Soft-iWARP does not check a
// READ's rights.
func checkCaps(vdevs []VerbsDevice) []Result {
	var out []Result
	for _, v := range vdevs {
		if v.Err != nil || v.Caps == nil {
			continue
		}
		name := "capabilities " + v.Name
		c := v.Caps
		var lacks []string
		if !c.MemoryWindows {
			lacks = append(lacks, "without memory windows a large message and an Export are reached through a registration of exactly their bytes, whose key is valid on every connection of the device, not on one")
		}
		if !c.UD {
			lacks = append(lacks, "without UD queue pairs ListenPacket fails on it")
		}
		if !c.Atomics {
			lacks = append(lacks, "without atomics the atomic operations fail with errors.ErrUnsupported")
		}
		if !c.Immediates {
			lacks = append(lacks, "without immediate data each message carries its header in a 4-byte trailer, so peers must run wire protocol 1.4 or later")
		}
		if c.ReadsIgnoreRights {
			lacks = append(lacks, "its driver (Soft-iWARP) serves a peer's RDMA READ from any registration whose key it names, remote read granted or not: use it for tests, not to serve untrusted peers (docs/limits-and-security.md)")
		}
		switch {
		case len(lacks) > 0:
			r := problem(Warn, name, c.Summary, "nothing to fix on this machine; "+strings.Join(lacks, "; "))
			out = append(out, r)
		default:
			out = append(out, ok(name, "%s", c.Summary))
		}
	}
	return out
}

// mergeVerbs takes the ports' active MTU (and state, if sysfs lacked it)
// from libibverbs.
func mergeVerbs(devs []*Device, vdevs []VerbsDevice) {
	for _, d := range devs {
		for _, v := range vdevs {
			if v.Name != d.Name || v.Err != nil {
				continue
			}
			d.InVerbs = true
			for _, p := range d.Ports {
				for _, vp := range v.Ports {
					if vp.Num != p.Num {
						continue
					}
					if vp.ActiveMTU > 0 {
						p.ActiveMTU, p.MTUSource = vp.ActiveMTU, "libibverbs"
					}
					if p.State == "" {
						p.State = vp.State
					}
				}
			}
		}
	}
}

// checkPorts reports each port's state, link layer and active MTU. A port
// that is not ACTIVE is a warning while another port is ACTIVE, and a
// failure when none is.
func checkPorts(root string, devs []*Device) []Result {
	var out []Result
	active := 0
	for _, d := range devs {
		for _, p := range d.Ports {
			r := checkPort(root, p)
			if p.State == "ACTIVE" {
				active++
			}
			out = append(out, r)
		}
	}
	if active == 0 {
		for i := range out {
			if out[i].Status == Warn {
				out[i].Status = Fail
			}
		}
	}
	return out
}

func checkPort(root string, p *Port) Result {
	name := "port " + p.String()
	layer := p.LinkLayer
	switch {
	case p.IWARP:
		layer += " (iWARP)"
	case p.Ethernet():
		layer += " (RoCE)"
	}
	mtu := "active MTU unknown"
	if p.ActiveMTU > 0 {
		mtu = fmt.Sprintf("active MTU %d (%s)", p.ActiveMTU, p.MTUSource)
	}
	netdev := ""
	if len(p.Netdevs) > 0 {
		netdev = ", netdev " + strings.Join(p.Netdevs, ", ")
	}
	if p.State != "ACTIVE" {
		detail := fmt.Sprintf("state %s (physical %s), %s%s", orUnknown(p.State), orUnknown(p.PhysState), layer, netdev)
		var fix string
		switch {
		case p.Ethernet():
			nd := "<netdev>"
			if len(p.Netdevs) > 0 {
				nd = p.Netdevs[0]
				if op := readLine(filepath.Join(root, "sys/class/net", nd, "operstate")); op != "" {
					detail += fmt.Sprintf(" (%s is %s)", nd, op)
				}
			}
			fix = fmt.Sprintf("bring the link up: ip link set %s up, and check the cable or switch port (ip link show %s)", nd, nd)
		case p.State == "INIT":
			fix = "no subnet manager has configured the port: run one on the fabric (opensm, or the switch's SM)"
		case p.State == "ARMED":
			fix = "the subnet manager has not activated the port yet: wait, or check opensm's log"
		default:
			fix = "check the cable and the switch port (ibstat " + p.Device + ")"
		}
		return problem(Warn, name, detail, fix)
	}
	detail := fmt.Sprintf("ACTIVE, %s, %s%s", layer, mtu, netdev)
	if p.ActiveMTU > 0 && p.ActiveMTU < 1024 {
		nd := "<netdev>"
		if len(p.Netdevs) > 0 {
			nd = p.Netdevs[0]
		}
		return problem(Warn, name, detail+": packets this small cost throughput",
			fmt.Sprintf("raise the netdev's MTU: ip link set %s mtu 1500 (gives 1024; mtu 4200 or more gives 4096)", nd))
	}
	return ok(name, "%s", detail)
}

// checkGIDs checks, for every ACTIVE port, that each IP address of its
// netdevs has a RoCE v2 GID (rdma_cm maps an address to a GID; without one it
// cannot use the address). A port without any usable address is a warning
// while another port has one, a failure when none has.
func checkGIDs(devs []*Device, addrs func(string) ([]netip.Addr, error)) []Result {
	var out []Result
	usable := 0
	for _, d := range devs {
		for _, p := range d.Ports {
			if p.State != "ACTIVE" {
				continue // checkPorts reports it
			}
			r, n := checkPortGIDs(p, addrs)
			usable += n
			out = append(out, r)
		}
	}
	if usable == 0 {
		for i := range out {
			if out[i].Status == Warn {
				out[i].Status = Fail
			}
		}
	}
	return out
}

// checkPortGIDs returns the port's result and how many of its addresses
// rdma_cm can use.
func checkPortGIDs(p *Port, addrs func(string) ([]netip.Addr, error)) (Result, int) {
	name := "gids " + p.String()
	if len(p.Netdevs) == 0 {
		return problem(Warn, name, "no network device is bound to this port: rdma_cm addresses are IPs of one",
			"bind a netdev: `rdma link show` lists the bindings; for Soft-RoCE: rdma link add rxe0 type rxe netdev <netdev>"), 0
	}
	var ips []netip.Addr
	owner := map[netip.Addr]string{}
	for _, n := range p.Netdevs {
		as, err := addrs(n)
		if err != nil {
			return problem(Warn, name, fmt.Sprintf("cannot read the addresses of %s: %v", n, err),
				fmt.Sprintf("run where %s is visible: a container needs the host's network namespace or its own netdev of the NIC (macvlan, SR-IOV)", n)), 0
		}
		for _, a := range as {
			ips = append(ips, a)
			owner[a] = n
		}
	}
	if len(ips) == 0 {
		nd := p.Netdevs[0]
		return problem(Warn, name, fmt.Sprintf("%s has no IP address: rdma_cm connects to and listens on IPs", strings.Join(p.Netdevs, ", ")),
			fmt.Sprintf("give it one: ip addr add <ip>/<prefix> dev %s", nd)), 0
	}
	if p.IWARP {
		return ok(name, "iWARP: rdma_cm uses the addresses of %s: %s", strings.Join(p.Netdevs, ", "), joinAddrs(ips)), len(ips)
	}
	if !p.Ethernet() {
		return ok(name, "%s link layer: rdma_cm uses the IPoIB addresses %s", p.LinkLayer, joinAddrs(ips)), len(ips)
	}
	var good, v1, missing []string
	for _, ip := range ips {
		idx, other := -1, ""
		for _, g := range p.GIDs {
			if g.Addr != ip {
				continue
			}
			if g.Type == "RoCE v2" {
				idx = g.Index
			} else {
				other = g.Type
			}
		}
		switch {
		case idx >= 0:
			good = append(good, fmt.Sprintf("%s (index %d)", ip, idx))
		case other != "":
			v1 = append(v1, fmt.Sprintf("%s (%s, only %s)", ip, owner[ip], other))
		default:
			missing = append(missing, fmt.Sprintf("%s (%s)", ip, owner[ip]))
		}
	}
	if len(missing) == 0 && len(v1) == 0 {
		return ok(name, "RoCE v2 GIDs for %s", strings.Join(good, ", ")), len(good)
	}
	var parts []string
	if len(missing) > 0 {
		parts = append(parts, "no GID for "+strings.Join(missing, ", "))
	}
	if len(v1) > 0 {
		parts = append(parts, "no RoCE v2 GID for "+strings.Join(v1, ", "))
	}
	detail := strings.Join(parts, "; ") + ": rdma_cm cannot use these addresses over RoCE v2"
	if len(good) > 0 {
		detail += " (usable: " + strings.Join(good, ", ") + ")"
	}
	fix := fmt.Sprintf("put the addresses on %s itself (not on a bridge or bond above it) with the link up: the kernel then adds their GIDs (see /%s/%s/ports/%d/gids)",
		strings.Join(p.Netdevs, " or "), sysInfiniband, p.Device, p.Num)
	if len(missing) == 0 {
		fix = fmt.Sprintf("the device offers no RoCE v2 GID: update its driver and firmware, and set rdma_cm's default (echo 'RoCE v2' > /sys/kernel/config/rdma_cm/%s/ports/%d/default_roce_mode)", p.Device, p.Num)
	}
	return problem(Warn, name, detail, fix), len(good)
}

// checkHugePages reports what will back the pool's arenas: reserved 2 MiB
// pages first (MAP_HUGETLB), then transparent huge pages, else 4 KiB pages.
func checkHugePages(root string) Result {
	const name = "hugepages"
	hp := filepath.Join(root, "sys/kernel/mm/hugepages/hugepages-2048kB")
	nr, err := strconv.Atoi(readLine(filepath.Join(hp, "nr_hugepages")))
	if err != nil {
		nr, _ = strconv.Atoi(readLine(filepath.Join(root, "proc/sys/vm/nr_hugepages")))
	}
	free, err := strconv.Atoi(readLine(filepath.Join(hp, "free_hugepages")))
	if err != nil {
		free = nr
	}
	thp := bracketed(readLine(filepath.Join(root, "sys/kernel/mm/transparent_hugepage/enabled")))
	need := firstConnArenas() * arenaBytes / (2 << 20)
	thpOK := thp == "always" || thp == "madvise"
	switch {
	case free >= need:
		return ok(name, "%d 2 MiB pages reserved, %d free: arenas use them (the first connection's take %d); THP %s",
			nr, free, need, orUnknown(thp))
	case thpOK:
		return ok(name, "%s, fewer than the %d the first connection's arenas take: arenas use transparent huge pages (THP %s)",
			reserved(nr, free), need, thp)
	}
	return problem(Warn, name, fmt.Sprintf("%s, fewer than the %d the first connection's arenas take, and THP is %s: arenas fall back to 4 KiB pages (more translation entries on the NIC)",
		reserved(nr, free), need, orUnknown(thp)),
		"reserve huge pages: sysctl -w vm.nr_hugepages=64 (128 MiB; vm.nr_hugepages in /etc/sysctl.d to keep it), or echo madvise > /sys/kernel/mm/transparent_hugepage/enabled")
}

func reserved(nr, free int) string {
	if nr == 0 {
		return "no 2 MiB pages reserved (vm.nr_hugepages 0)"
	}
	return fmt.Sprintf("%d 2 MiB pages reserved, %d free", nr, free)
}

// bracketed returns the selected value of a sysfs choice ("always [madvise] never").
func bracketed(s string) string {
	if i := strings.IndexByte(s, '['); i >= 0 {
		if j := strings.IndexByte(s[i:], ']'); j > 0 {
			return s[i+1 : i+j]
		}
	}
	return s
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func devNames(devs []*Device) string {
	s := make([]string, len(devs))
	for i, d := range devs {
		s[i] = d.Name
	}
	return strings.Join(s, ", ")
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
