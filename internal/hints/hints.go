//go:build linux

// Package hints attaches, to the errors whose fix is on the user's machine
// (ErrMemlock, ErrNoDevice, ErrNotRDMAAddress of internal/errs), a hint
// for this machine: the locked-memory limit and what is pinned, which
// kernel modules and device files are missing, which netdevs and IPs do
// have RDMA. The errors' own Error() texts already say what to do in one
// line; the hint, attached with cockroachdb/errors' WithHint, says it
// here. Read it with errors.FlattenHints(err) (or GetAllHints); it passes
// through *net.OpError and fmt.Errorf's %w.
//
// A hint reads sysfs, /proc and the interface list, so it is built only on
// the error path: when Dial, Listen or a buffer registration has already
// failed, never on the data path.
package hints

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	cerrors "github.com/cockroachdb/errors"
	"golang.org/x/sys/unix"

	"github.com/verbline/rdma/internal/errs"
)

// Add attaches its hint to err if err wraps ErrNoDevice or
// ErrNotRDMAAddress (an *errs.DeviceFailed, which also matches
// ErrNoDevice, says what happened in its own text and gets none); other
// errors and nil are returned as they are.
func Add(err error) error {
	if err == nil {
		return nil
	}
	var failed *errs.DeviceFailed
	switch env := hostHintEnv(); {
	case errors.As(err, &failed):
		return err
	case errors.Is(err, errs.ErrNotRDMAAddress):
		return cerrors.WithHint(err, rdmaAddressHint(env))
	case errors.Is(err, errs.ErrNoDevice):
		return cerrors.WithHint(err, noDeviceHint(env))
	}
	return err
}

// MemlockError is the error of a buffer registration of size bytes that
// the kernel refused (ENOMEM or EPERM from ibv_reg_mr): it matches
// ErrMemlock and the errno, and its hint gives the limit, what is pinned
// and how to raise it.
func MemlockError(cause error, size int) error {
	return cerrors.WithHint(fmt.Errorf("%w: %w", errs.ErrMemlock, cause), memlockHint(hostHintEnv(), size))
}

// RegistrationError is the error of a registration of size bytes that
// failed with err: a MemlockError when the kernel refused the pinning,
// else err wrapped by what (nothing when what is empty).
func RegistrationError(err error, size int, what string) error {
	if errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.EPERM) {
		return MemlockError(err, size)
	}
	if what == "" {
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}

// hintEnv is what the hints read of the machine; tests give a fake one.
type hintEnv struct {
	root    string                              // "/", or a test's tree holding sys/, dev/ and proc/
	netdevs func() []netdevInfo                 // the network interfaces
	memlock func() (cur, max uint64, err error) // RLIMIT_MEMLOCK
}

// netdevInfo is one network interface.
type netdevInfo struct {
	name     string
	up       bool
	loopback bool
	addrs    []netip.Addr
	mac      net.HardwareAddr
}

func hostHintEnv() hintEnv { return hintEnv{root: "/", netdevs: hostNetdevs, memlock: hostMemlock} }

// read returns the trimmed contents of a file under e.root ("" if unreadable).
func (e hintEnv) read(p string) string {
	b, _ := os.ReadFile(filepath.Join(e.root, p))
	return strings.TrimSpace(string(b))
}

func (e hintEnv) exists(p string) bool {
	_, err := os.Stat(filepath.Join(e.root, p))
	return err == nil
}

func (e hintEnv) readDir(p string) ([]os.DirEntry, error) {
	return os.ReadDir(filepath.Join(e.root, p))
}

func hostNetdevs() []netdevInfo {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	var out []netdevInfo
	for _, i := range ifs {
		d := netdevInfo{name: i.Name, up: i.Flags&net.FlagUp != 0, loopback: i.Flags&net.FlagLoopback != 0, mac: i.HardwareAddr}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				d.addrs = append(d.addrs, p.Addr())
			}
		}
		out = append(out, d)
	}
	return out
}

func hostMemlock() (uint64, uint64, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		return 0, 0, err
	}
	return rl.Cur, rl.Max, nil
}

// rdmaPort is one port of an RDMA device as sysfs shows it, with the
// netdevs it serves and their addresses.
type rdmaPort struct {
	device  string
	port    int
	state   string                  // "ACTIVE", "DOWN", ...
	addrs   map[string][]netip.Addr // netdev -> its IPs with an RDMA GID (RoCE) or its IPs (IPoIB)
	netdevs []string                // the keys of addrs, in the order found
}

// readRDMAPorts reads sys/class/infiniband: the RoCE netdevs and IPs come
// from each port's GID table (gids/<i>, gid_attrs/ndevs/<i>); an
// InfiniBand port's IPoIB netdevs from device/net, their IPs from the
// interface list.
func readRDMAPorts(e hintEnv) []rdmaPort {
	const ib = "sys/class/infiniband"
	devs, _ := e.readDir(ib)
	var ifs map[string]netdevInfo
	var out []rdmaPort
	for _, d := range devs {
		ports, _ := e.readDir(filepath.Join(ib, d.Name(), "ports"))
		for _, p := range ports {
			n, err := strconv.Atoi(p.Name())
			if err != nil {
				continue
			}
			dir := filepath.Join(ib, d.Name(), "ports", p.Name())
			rp := rdmaPort{device: d.Name(), port: n, addrs: map[string][]netip.Addr{}}
			_, rp.state, _ = strings.Cut(e.read(filepath.Join(dir, "state")), ": ")
			add := func(netdev string, a netip.Addr) {
				if _, ok := rp.addrs[netdev]; !ok {
					rp.netdevs = append(rp.netdevs, netdev)
					rp.addrs[netdev] = nil
				}
				if a.IsValid() && !slices.Contains(rp.addrs[netdev], a) {
					rp.addrs[netdev] = append(rp.addrs[netdev], a)
				}
			}
			// The kernel fills a RoCE GID table from index 0 and a
			// table has up to thousands of slots (Soft-RoCE: 1024), each
			// a file: read until a run of empty slots, not all of them
			// (thousands of sysfs reads would make the error path slow).
			for i, empty := 0, 0; empty < gidEmptyRun; i++ {
				g := strconv.Itoa(i)
				raw := e.read(filepath.Join(dir, "gids", g))
				if raw == "" {
					break // past the table's end
				}
				a, err := netip.ParseAddr(raw)
				if err != nil || a.IsUnspecified() {
					empty++
					continue
				}
				empty = 0
				if netdev := e.read(filepath.Join(dir, "gid_attrs", "ndevs", g)); netdev != "" {
					add(netdev, a.Unmap()) // none: an InfiniBand GID
				}
			}
			netdevs := func() map[string]netdevInfo {
				if ifs == nil {
					ifs = map[string]netdevInfo{}
					for _, i := range e.netdevs() {
						ifs[i.name] = i
					}
				}
				return ifs
			}
			// InfiniBand's GIDs name no netdev (IPoIB is the PCI device's),
			// nor do iWARP's: a hardware iWARP NIC's netdev is its PCI
			// device's, and Soft-iWARP (no device) has its netdev's MAC as
			// its GID.
			if len(rp.netdevs) == 0 && e.read(filepath.Join(dir, "link_layer")) != "Ethernet" ||
				len(rp.netdevs) == 0 && isIWARP(e, filepath.Join(ib, d.Name())) {
				nets, _ := e.readDir(filepath.Join(ib, d.Name(), "device", "net"))
				names := make([]string, 0, len(nets))
				for _, nd := range nets {
					names = append(names, nd.Name())
				}
				if len(names) == 0 {
					if nd := netdevByMAC(netdevs(), e.read(filepath.Join(dir, "gids", "0"))); nd != "" {
						names = append(names, nd)
					}
				}
				for _, nd := range names {
					add(nd, netip.Addr{})
					for _, a := range netdevs()[nd].addrs {
						add(nd, a)
					}
				}
			}
			out = append(out, rp)
		}
	}
	return out
}

// isIWARP reports whether the device in dir is an iWARP RNIC (node type 4).
func isIWARP(e hintEnv, dir string) bool {
	return strings.HasPrefix(e.read(filepath.Join(dir, "node_type")), "4:")
}

// netdevByMAC is the netdev whose MAC an iWARP GID carries (siw's GID is its
// netdev's MAC followed by zeros), or "".
func netdevByMAC(ifs map[string]netdevInfo, gid string) string {
	a, err := netip.ParseAddr(gid)
	if err != nil {
		return ""
	}
	raw := a.As16()
	if raw == ([16]byte{}) || [10]byte(raw[6:]) != [10]byte{} {
		return ""
	}
	for name, i := range ifs {
		if len(i.mac) == 6 && string(i.mac) == string(raw[:6]) {
			return name
		}
	}
	return ""
}

// gidEmptyRun is how many empty GID slots in a row end the scan.
const gidEmptyRun = 16

// rdmaAddressHint lists the netdevs and IPs of this machine that have
// RDMA, for an address that has none.
func rdmaAddressHint(e hintEnv) string {
	ports := readRDMAPorts(e)
	var lines []string
	for _, p := range ports {
		for _, nd := range p.netdevs {
			state := ""
			if p.state != "" && p.state != "ACTIVE" {
				state = ", " + p.state + ": not usable until it is ACTIVE"
			}
			ips := "no IP address (add one: ip addr add <ip>/<len> dev " + nd + ")"
			if as := p.addrs[nd]; len(as) > 0 {
				s := make([]string, len(as))
				for i, a := range as {
					s[i] = a.String()
				}
				ips = strings.Join(s, ", ")
			}
			lines = append(lines, fmt.Sprintf("  %s (%s port %d%s): %s", nd, p.device, p.port, state, ips))
		}
	}
	if len(lines) == 0 {
		if len(ports) == 0 {
			return "this machine has no RDMA device, so no address has RDMA.\n" + noDeviceHint(e)
		}
		return "this machine's RDMA devices serve no netdev (InfiniBand without IPoIB?): rdma_cm needs an IP on " +
			"the device's netdev (IPoIB on InfiniBand, the Ethernet netdev on RoCE and iWARP)"
	}
	return "addresses with RDMA on this machine, by netdev:\n" + strings.Join(lines, "\n") + "\n" +
		"Listen on one of them (or on the wildcard address); dial a peer's IP on its RDMA netdev, " +
		"reached through one of these netdevs (`ip route get <peer IP>` names the one used). " +
		"Loopback (127.0.0.1, ::1) has no RDMA: to reach this host use one of the IPs above. " +
		"To give RDMA to another Ethernet netdev with Soft-RoCE: sudo rdma link add " + nextRxe(ports) + " type rxe netdev <netdev>"
}

// nextRxe is a Soft-RoCE device name not taken yet.
func nextRxe(ports []rdmaPort) string {
	for i := 0; ; i++ {
		name := "rxe" + strconv.Itoa(i)
		if !slices.ContainsFunc(ports, func(p rdmaPort) bool { return p.device == name }) {
			return name
		}
	}
}

// noDeviceHint says which driver, module or device file is missing.
func noDeviceHint(e hintEnv) string {
	var out []string
	devs, _ := e.readDir("sys/class/infiniband")
	if len(devs) == 0 {
		var eth []string
		for _, d := range e.netdevs() {
			if d.up && !d.loopback {
				eth = append(eth, d.name)
			}
		}
		example := "<netdev>"
		if len(eth) > 0 {
			example = eth[0]
		}
		s := "no RDMA device (sys/class/infiniband is empty): load your RDMA NIC's driver (mlx5_ib, irdma, bnxt_re, ...), " +
			"or add Soft-RoCE on an Ethernet netdev: sudo modprobe rdma_rxe && sudo rdma link add rxe0 type rxe netdev " + example
		if len(eth) > 0 {
			s += " (netdevs up here: " + strings.Join(eth, ", ") + ")"
		}
		out = append(out, s)
	} else {
		names := make([]string, len(devs))
		for i, d := range devs {
			names[i] = d.Name()
		}
		out = append(out, "RDMA devices present: "+strings.Join(names, ", "))
	}
	container := false
	if !e.exists("dev/infiniband/rdma_cm") {
		s := "/dev/infiniband/rdma_cm is missing: sudo modprobe rdma_ucm"
		if e.exists("sys/module/rdma_ucm") {
			s = "/dev/infiniband/rdma_cm is missing although rdma_ucm is loaded"
			container = true
		}
		out = append(out, s)
	}
	uverbs, _ := e.readDir("dev/infiniband")
	if !slices.ContainsFunc(uverbs, func(d os.DirEntry) bool { return strings.HasPrefix(d.Name(), "uverbs") }) {
		s := "no /dev/infiniband/uverbs*: sudo modprobe ib_uverbs"
		if e.exists("sys/module/ib_uverbs") {
			s = "no /dev/infiniband/uverbs* although ib_uverbs is loaded"
			container = true
		}
		out = append(out, s)
	}
	if container {
		out = append(out, "in a container, pass the devices in: docker run --device /dev/infiniband/rdma_cm "+
			"--device /dev/infiniband/uverbs0 (one per device) --ulimit memlock=-1, or --privileged")
	}
	if len(devs) > 0 && len(out) == 1 {
		out = append(out, "the device files exist: check that this user may open /dev/infiniband/rdma_cm and uverbs* read-write")
	}
	return strings.Join(out, "\n") + "\n`verbline-doctor` checks all of this and prints each fix."
}

// What a connection of the default Config registers (cmd/verbline-doctor's
// estimate, checked there against the kernel's VmPin in Soft-RoCE): its
// ring buffers and its rendezvous descriptors come from two 4 MiB pool
// arenas, each registered whole.
const (
	poolArenaBytes     = 4 << 20
	firstConnPinned    = 2 * poolArenaBytes
	defaultPoolMaxText = "1 GiB"
)

// memlockHint gives the locked-memory limit, what this process has pinned,
// and how to raise the limit.
func memlockHint(e hintEnv, size int) string {
	var b strings.Builder
	cur, max, err := e.memlock()
	switch {
	case err != nil:
		fmt.Fprintf(&b, "RLIMIT_MEMLOCK could not be read (%v)", err)
	case cur == unix.RLIM_INFINITY:
		b.WriteString("RLIMIT_MEMLOCK is unlimited, so the kernel is short of memory it can pin (or a cgroup or " +
			"the driver limits it): check free memory and dmesg")
	default:
		fmt.Fprintf(&b, "RLIMIT_MEMLOCK is %s (hard limit %s)", limitSize(cur), limitSize(max))
	}
	if pinned, ok := e.vmPin(); ok {
		fmt.Fprintf(&b, "; this process has %s pinned (VmPin)", byteSize(pinned))
	}
	if size > 0 {
		fmt.Fprintf(&b, "; registering %s more failed", byteSize(uint64(size)))
	}
	fmt.Fprintf(&b, ".\nThe default Config's first connection on a device registers %s (two %s buffer-pool arenas); "+
		"busy connections grow their rings, and each device's pool registers at most Config.PoolMaxBytes (%s by default).\n",
		byteSize(firstConnPinned), byteSize(poolArenaBytes), defaultPoolMaxText)
	b.WriteString("Raise the limit where the program starts: `ulimit -l unlimited` (as root) in its shell; " +
		"LimitMEMLOCK=infinity in the [Service] section of its systemd unit; " +
		"`<user> - memlock unlimited` in /etc/security/limits.conf for login sessions; " +
		"docker run --ulimit memlock=-1 in a container; or give the process CAP_IPC_LOCK. " +
		"A lower Config.PoolMaxBytes keeps the pool under a fixed limit. `verbline-doctor` tells how many connections a limit holds.")
	return b.String()
}

// vmPin is the memory the kernel counts as pinned by this process.
func (e hintEnv) vmPin() (uint64, bool) {
	for _, line := range strings.Split(e.read("proc/self/status"), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == "VmPin" {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

func limitSize(n uint64) string {
	if n == unix.RLIM_INFINITY {
		return "unlimited"
	}
	return byteSize(n)
}

// byteSize formats bytes as "8 MiB", "4.5 MiB", "64 KiB".
func byteSize(n uint64) string {
	f := func(v float64, unit string) string {
		return strings.TrimSuffix(strings.TrimRight(strconv.FormatFloat(v, 'f', 2, 64), "0"), ".") + " " + unit
	}
	switch {
	case n >= 1<<30:
		return f(float64(n)/(1<<30), "GiB")
	case n >= 1<<20:
		return f(float64(n)/(1<<20), "MiB")
	case n >= 1<<10:
		return f(float64(n)/(1<<10), "KiB")
	}
	return strconv.FormatUint(n, 10) + " B"
}
