package main

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Status is the outcome of one check.
type Status int

const (
	OK   Status = iota // nothing to do
	Warn               // RDMA runs, but worse than it could or not on every address
	Fail               // something blocks RDMA
)

func (s Status) String() string {
	switch s {
	case OK:
		return "ok"
	case Warn:
		return "warn"
	case Fail:
		return "fail"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// MarshalText makes a Status "ok", "warn" or "fail" in JSON.
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Result is what one check found. A problem (Warn or Fail) has a Fix: one line
// saying what to do about it.
type Result struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
	// Note is background for the detail (such as what an estimate is based on).
	Note string `json:"note,omitempty"`
	// Data holds the check's figures for -json (memlock sizes, latencies).
	Data any `json:"data,omitempty"`
}

func ok(name, format string, a ...any) Result {
	return Result{Name: name, Status: OK, Detail: fmt.Sprintf(format, a...)}
}

func problem(s Status, name, detail, fix string) Result {
	return Result{Name: name, Status: s, Detail: detail, Fix: fix}
}

// Env is everything the machine checks read. On a machine Root is "/" and
// the functions ask the kernel and libibverbs; tests point Root at a fake
// tree in t.TempDir() and supply the rest.
type Env struct {
	// Root is where sys/, proc/ and dev/ are: "/" on a machine.
	Root string
	// Cgo says whether this binary was built with cgo (the library's verbs
	// and rdma_cm layers need it).
	Cgo bool
	// Memlock returns the RLIMIT_MEMLOCK soft limit in bytes, or
	// unlimited == true.
	Memlock func() (limit uint64, unlimited bool, err error)
	// Addrs returns the IP addresses of a network device.
	Addrs func(netdev string) ([]netip.Addr, error)
	// Verbs lists the devices and ports as libibverbs sees them; nil when the
	// binary has no cgo (the check is then skipped).
	Verbs func() ([]VerbsDevice, error)
	// Links returns the netdev bound to each port ("siw0/1" -> "rd0") as
	// the kernel's RDMA netlink reports it (`rdma link show`), for ports
	// whose netdev sysfs does not name; nil: none.
	Links func() (map[string]string, error)
}

// VerbsDevice is a device as libibverbs reports it.
type VerbsDevice struct {
	Name  string
	Err   error // opening or querying it failed
	Ports []VerbsPort
	Caps  *DeviceCaps // nil if not queried
}

// DeviceCaps is what a device can do, as the library's paths ask it
// (internal/device's Caps): its summary line and what decides the checks.
type DeviceCaps struct {
	Summary       string
	MemoryWindows bool
	Immediates    bool
	Atomics       bool
	UD            bool
	// ReadsIgnoreRights: the driver serves a peer's RDMA READ from any of
	// the device's registrations (Soft-iWARP; internal/device/quirks.go).
	ReadsIgnoreRights bool
}

// VerbsPort is a port as ibv_query_port reports it.
type VerbsPort struct {
	Num       int
	State     string // "ACTIVE", "DOWN", ...
	ActiveMTU int    // bytes
	Ethernet  bool
}

// Run runs every machine check (not the -peer check) and returns the results
// in the order they should be read.
func Run(env Env) []Result {
	var out []Result
	out = append(out, checkCgo(env.Cgo))
	out = append(out, checkModules(env.Root)...)
	devs, err := readDevices(env.Root)
	if env.Links != nil {
		addLinkNetdevs(devs, env.Links)
	}
	out = append(out, checkDevices(devs, err))
	if env.Verbs != nil {
		vdevs, verr := env.Verbs()
		r := checkVerbs(devs, vdevs, verr)
		if len(devs) > 0 || r.Status != OK {
			out = append(out, r)
		}
		mergeVerbs(devs, vdevs)
		out = append(out, checkCaps(vdevs)...)
	}
	out = append(out, checkPorts(env.Root, devs)...)
	out = append(out, checkGIDs(devs, env.Addrs)...)
	out = append(out, checkMemlock(env.Root, env.Memlock))
	out = append(out, checkHugePages(env.Root))
	return out
}

// ExitCode is 1 if any result blocks RDMA, else 0.
func ExitCode(results []Result) int {
	for _, r := range results {
		if r.Status == Fail {
			return 1
		}
	}
	return 0
}

// ipAddrs is Env.Addrs on a machine: the addresses of the named interface.
func ipAddrs(netdev string) ([]netip.Addr, error) {
	ifc, err := net.InterfaceByName(netdev)
	if err != nil {
		return nil, err
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out, nil
}

func joinAddrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}
