package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain lets the tests run this package's main as a real process: with
// VERBLINE_DOCTOR_MAIN=1 the test binary is the doctor.
func TestMain(m *testing.M) {
	if os.Getenv("VERBLINE_DOCTOR_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// fake is a machine described as files under a temporary root, plus the
// facts that are not files.
type fake struct {
	t       *testing.T
	root    string
	memlock uint64 // 0: unlimited
	addrs   map[string][]netip.Addr
	verbs   []VerbsDevice     // nil: Env.Verbs is nil (as without cgo)
	links   map[string]string // nil: Env.Links is nil
	cgo     bool
}

func (f *fake) write(rel, content string) {
	f.t.Helper()
	p := filepath.Join(f.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content+"\n"), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fake) remove(rel string) {
	f.t.Helper()
	if err := os.RemoveAll(filepath.Join(f.root, rel)); err != nil {
		f.t.Fatal(err)
	}
}

// port writes a port of dev; gids maps an index to "gid type ndev".
func (f *fake) port(dev string, num int, state, layer string, gids map[int]string) {
	d := fmt.Sprintf("sys/class/infiniband/%s/ports/%d/", dev, num)
	f.write(d+"state", state)
	f.write(d+"phys_state", "5: LinkUp")
	f.write(d+"link_layer", layer)
	for i := 0; i < 8; i++ {
		e, ok := gids[i]
		if !ok {
			f.write(fmt.Sprintf("%sgids/%d", d, i), "0000:0000:0000:0000:0000:0000:0000:0000")
			continue // the kernel's attribute files of an empty slot fail with EINVAL
		}
		parts := strings.SplitN(e, " ", 3)
		f.write(fmt.Sprintf("%sgids/%d", d, i), parts[0])
		f.write(fmt.Sprintf("%sgid_attrs/types/%d", d, i), parts[1]+" "+parts[2][:strings.IndexByte(parts[2], ' ')])
		f.write(fmt.Sprintf("%sgid_attrs/ndevs/%d", d, i), parts[2][strings.IndexByte(parts[2], ' ')+1:])
	}
}

// healthy is the Soft-RoCE guest's machine: rxe0 on rd0 (169.254.77.1),
// port ACTIVE, the rdma_cm and uverbs devices, memlock unlimited, huge
// pages reserved.
func healthy(t *testing.T) *fake {
	f := &fake{t: t, root: t.TempDir(), cgo: true, addrs: map[string][]netip.Addr{
		"rd0": {netip.MustParseAddr("169.254.77.1"), netip.MustParseAddr("fe80::5c26:78ff:fe59:225a")},
	}}
	f.write("sys/class/infiniband/rxe0/parent", "rd0")
	f.port("rxe0", 1, "4: ACTIVE", "Ethernet", map[int]string{
		0: "fe80:0000:0000:0000:5c26:78ff:fe59:225a RoCE v2 rd0",
		1: "0000:0000:0000:0000:0000:ffff:a9fe:4d01 RoCE v2 rd0",
	})
	f.write("sys/class/net/rd0/mtu", "1500")
	f.write("sys/class/net/rd0/operstate", "unknown")
	f.write("dev/infiniband/rdma_cm", "")
	f.write("dev/infiniband/uverbs0", "")
	for _, m := range []string{"ib_core", "ib_uverbs", "rdma_cm", "rdma_ucm", "rdma_rxe"} {
		f.write("sys/module/"+m+"/refcnt", "0")
	}
	f.write("proc/self/status", "Name:\tdoctor\nVmPin:\t       0 kB\nCapEff:\t0000000000000000\n")
	f.write("proc/sys/vm/nr_hugepages", "64")
	f.write("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "64")
	f.write("sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "64")
	f.write("sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never")
	return f
}

func (f *fake) env() Env {
	e := Env{Root: f.root, Cgo: f.cgo,
		Memlock: func() (uint64, bool, error) { return f.memlock, f.memlock == 0, nil },
		Addrs: func(n string) ([]netip.Addr, error) {
			a, ok := f.addrs[n]
			if !ok {
				return nil, errors.New("route ip+net: no such network interface")
			}
			return a, nil
		},
	}
	if f.verbs != nil {
		e.Verbs = func() ([]VerbsDevice, error) {
			if len(f.verbs) == 0 {
				return nil, errors.New("no RDMA device found")
			}
			return f.verbs, nil
		}
	}
	if f.links != nil {
		e.Links = func() (map[string]string, error) { return f.links, nil }
	}
	return e
}

// find returns the result called name.
func find(t *testing.T, rs []Result, name string) Result {
	t.Helper()
	for _, r := range rs {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no result %q in\n%s", name, dump(rs))
	return Result{}
}

func dump(rs []Result) string {
	var b bytes.Buffer
	printText(&b, rs, ExitCode(rs))
	return b.String()
}

// expect checks a result's status and that its detail and fix contain the
// given words.
func expect(t *testing.T, rs []Result, name string, st Status, detail, fix string) Result {
	t.Helper()
	r := find(t, rs, name)
	if r.Status != st || !strings.Contains(r.Detail, detail) || !strings.Contains(r.Fix, fix) {
		t.Fatalf("%s: got %s %q (fix %q), want %s with %q (fix %q)\n%s", name, r.Status, r.Detail, r.Fix, st, detail, fix, dump(rs))
	}
	if st != OK && r.Fix == "" {
		t.Fatalf("%s: a problem without a fix: %+v", name, r)
	}
	return r
}

func expectExit(t *testing.T, rs []Result, want int) {
	t.Helper()
	if got := ExitCode(rs); got != want {
		t.Fatalf("exit status %d, want %d\n%s", got, want, dump(rs))
	}
}

func TestHealthyMachine(t *testing.T) {
	f := healthy(t)
	rs := Run(f.env())
	for _, r := range rs {
		if r.Status != OK {
			t.Errorf("%s: %s %s", r.Name, r.Status, r.Detail)
		}
	}
	expectExit(t, rs, 0)
	expect(t, rs, "devices", OK, "rxe0 (netdev rd0)", "")
	// Without libibverbs the MTU comes from the netdev: 1500 - 88 fits 1024.
	expect(t, rs, "port rxe0/1", OK, "ACTIVE, Ethernet (RoCE), active MTU 1024 (from rd0's mtu 1500), netdev rd0", "")
	expect(t, rs, "gids rxe0/1", OK, "169.254.77.1 (index 1), fe80::5c26:78ff:fe59:225a (index 0)", "")
	expect(t, rs, "memlock", OK, "unlimited", "")
	expect(t, rs, "hugepages", OK, "64 2 MiB pages reserved, 64 free", "")
}

func TestNoDevice(t *testing.T) {
	f := healthy(t)
	f.remove("sys/class/infiniband")
	f.remove("dev/infiniband/uverbs0")
	f.remove("sys/module/rdma_rxe")
	rs := Run(f.env())
	expectExit(t, rs, 1)
	expect(t, rs, "devices", Fail, "no RDMA device", "rdma link add rxe0 type rxe")
	expect(t, rs, "uverbs", Fail, "no RDMA device is registered", "add a device")
	for _, r := range rs {
		if strings.HasPrefix(r.Name, "port ") || strings.HasPrefix(r.Name, "gids ") {
			t.Errorf("a port check without a device: %+v", r)
		}
	}
	// The same with libibverbs asked: it finds nothing either, which is no
	// separate problem.
	f.verbs = []VerbsDevice{}
	rs = Run(f.env())
	expectExit(t, rs, 1)
	for _, r := range rs {
		if r.Name == "libibverbs" {
			t.Errorf("libibverbs reported without any device: %+v", r)
		}
	}
}

func TestPortDown(t *testing.T) {
	f := healthy(t)
	f.write("sys/class/infiniband/rxe0/ports/1/state", "1: DOWN")
	f.write("sys/class/infiniband/rxe0/ports/1/phys_state", "3: Disabled")
	f.write("sys/class/net/rd0/operstate", "down")
	rs := Run(f.env())
	expectExit(t, rs, 1)
	expect(t, rs, "port rxe0/1", Fail, "state DOWN (physical Disabled), Ethernet (RoCE), netdev rd0 (rd0 is down)", "ip link set rd0 up")
	for _, r := range rs {
		if strings.HasPrefix(r.Name, "gids ") {
			t.Errorf("GIDs checked on a port that is down: %+v", r)
		}
	}

	// A second, ACTIVE port: the down one is only a warning.
	f.port("rxe0", 2, "4: ACTIVE", "Ethernet", map[int]string{1: "0000:0000:0000:0000:0000:ffff:a9fe:4d01 RoCE v2 rd0"})
	rs = Run(f.env())
	expectExit(t, rs, 0)
	expect(t, rs, "port rxe0/1", Warn, "state DOWN", "ip link set rd0 up")
	expect(t, rs, "port rxe0/2", OK, "ACTIVE", "")
}

func TestInfiniBandPortWithoutSubnetManager(t *testing.T) {
	f := healthy(t)
	f.remove("sys/class/infiniband")
	f.write("sys/class/infiniband/mlx5_0/device/net/ib0/ifindex", "4")
	f.port("mlx5_0", 1, "2: INIT", "InfiniBand", map[int]string{0: "fe80:0000:0000:0000:0002:c903:0031:7891 IB/RoCE v1 "})
	f.addrs["ib0"] = []netip.Addr{netip.MustParseAddr("10.0.0.1")}
	rs := Run(f.env())
	expectExit(t, rs, 1)
	expect(t, rs, "port mlx5_0/1", Fail, "state INIT", "subnet manager")

	f.write("sys/class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE")
	rs = Run(f.env())
	expectExit(t, rs, 0)
	expect(t, rs, "gids mlx5_0/1", OK, "IPoIB addresses 10.0.0.1", "")
}

func TestNoRoCEv2GIDForAnAddress(t *testing.T) {
	f := healthy(t)
	// 10.1.2.3 is on rd0 but has no GID (as when the kernel never saw it
	// on the RDMA netdev), 10.9.9.9 only a RoCE v1 one.
	f.addrs["rd0"] = append(f.addrs["rd0"], netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("10.9.9.9"))
	f.port("rxe0", 1, "4: ACTIVE", "Ethernet", map[int]string{
		0: "fe80:0000:0000:0000:5c26:78ff:fe59:225a RoCE v2 rd0",
		1: "0000:0000:0000:0000:0000:ffff:a9fe:4d01 RoCE v2 rd0",
		2: "0000:0000:0000:0000:0000:ffff:0a09:0909 IB/RoCE v1 rd0",
	})
	rs := Run(f.env())
	expectExit(t, rs, 0) // 169.254.77.1 still works
	r := expect(t, rs, "gids rxe0/1", Warn, "no GID for 10.1.2.3 (rd0); no RoCE v2 GID for 10.9.9.9 (rd0, only IB/RoCE v1)", "put the addresses on rd0 itself")
	if !strings.Contains(r.Detail, "usable: 169.254.77.1 (index 1)") {
		t.Errorf("detail does not name the usable address: %q", r.Detail)
	}

	// The only address without a GID: nothing can connect.
	f.addrs["rd0"] = []netip.Addr{netip.MustParseAddr("10.1.2.3")}
	rs = Run(f.env())
	expectExit(t, rs, 1)
	expect(t, rs, "gids rxe0/1", Fail, "no GID for 10.1.2.3 (rd0)", "put the addresses on rd0 itself")

	// No address at all.
	f.addrs["rd0"] = nil
	rs = Run(f.env())
	expectExit(t, rs, 1)
	expect(t, rs, "gids rxe0/1", Fail, "rd0 has no IP address", "ip addr add <ip>/<prefix> dev rd0")

	// The netdev is in another network namespace (a container).
	delete(f.addrs, "rd0")
	rs = Run(f.env())
	expectExit(t, rs, 1)
	expect(t, rs, "gids rxe0/1", Fail, "cannot read the addresses of rd0", "network namespace")
}

// TestDualPortNIC: a NIC with one device and two ports lists both netdevs
// under device/net; each port is checked against its own netdev's
// addresses only.
func TestDualPortNIC(t *testing.T) {
	f := healthy(t)
	f.remove("sys/class/infiniband")
	f.write("sys/class/infiniband/mlx4_0/device/net/eth0/ifindex", "2")
	f.write("sys/class/infiniband/mlx4_0/device/net/eth1/ifindex", "3")
	f.port("mlx4_0", 1, "4: ACTIVE", "Ethernet", map[int]string{1: "0000:0000:0000:0000:0000:ffff:0a00:0001 RoCE v2 eth0"})
	f.port("mlx4_0", 2, "4: ACTIVE", "Ethernet", map[int]string{1: "0000:0000:0000:0000:0000:ffff:0a00:0101 RoCE v2 eth1"})
	f.write("sys/class/net/eth0/mtu", "9000")
	f.write("sys/class/net/eth1/mtu", "9000")
	f.addrs = map[string][]netip.Addr{"eth0": {netip.MustParseAddr("10.0.0.1")}, "eth1": {netip.MustParseAddr("10.0.1.1")}}
	rs := Run(f.env())
	expectExit(t, rs, 0)
	expect(t, rs, "devices", OK, "mlx4_0 (netdev eth0, eth1)", "")
	expect(t, rs, "port mlx4_0/1", OK, "active MTU 4096 (from eth0's mtu 9000), netdev eth0", "")
	expect(t, rs, "gids mlx4_0/1", OK, "RoCE v2 GIDs for 10.0.0.1 (index 1)", "")
	expect(t, rs, "gids mlx4_0/2", OK, "RoCE v2 GIDs for 10.0.1.1 (index 1)", "")
}

func TestMemlock(t *testing.T) {
	if got, want := pinnedBytes(1), int64(8<<20); got != want {
		t.Fatalf("one connection: %d bytes, want %d (1 arena of 32 KiB buffers + 1 of descriptors)", got, want)
	}
	if got, want := pinnedBytes(2), int64(8<<20); got != want {
		t.Fatalf("two connections: %d bytes, want %d", got, want)
	}
	// 128 buffers of 32 KiB per arena, 7 per idle connection: the 19th needs a second arena.
	if got, want := pinnedBytes(19), int64(12<<20); got != want {
		t.Fatalf("19 connections: %d bytes, want %d", got, want)
	}
	f := healthy(t)
	for _, c := range []struct {
		limit   uint64
		capLock bool
		st      Status
		detail  string
		exit    int
	}{
		{4 << 20, false, Fail, "limit 4 MiB is below the 8 MiB the first connection registers: connections fail with ErrMemlock", 1},
		{64 << 10, false, Fail, "limit 64 KiB is below", 1},
		{4 << 20, true, Warn, "not enforced for this process (it has CAP_IPC_LOCK)", 0},
		{64 << 20, false, Warn, "limit 64 MiB holds 274 connections of the default Config", 0},
		{8 << 20, false, Warn, "holds 18 connections of", 0},
		{1 << 30, false, OK, "limit 1 GiB: enough for the pool's cap", 0},
		{0, false, OK, "unlimited", 0},
	} {
		f.memlock = c.limit
		caps := "0000000000000000"
		if c.capLock {
			caps = "000001ffffffffff"
		}
		f.write("proc/self/status", "CapEff:\t"+caps)
		rs := Run(f.env())
		fix := ""
		if c.st != OK {
			fix = "ulimit -l unlimited"
		}
		r := expect(t, rs, "memlock", c.st, c.detail, fix)
		if !strings.Contains(r.Note, "the first connection registers 8 MiB, 2 pool arenas of 4 MiB") {
			t.Errorf("the estimate's basis is missing: %q", r.Note)
		}
		expectExit(t, rs, c.exit)
	}
}

func TestModules(t *testing.T) {
	f := healthy(t)
	f.remove("dev/infiniband/rdma_cm")
	f.remove("sys/module/rdma_ucm")
	rs := Run(f.env())
	expectExit(t, rs, 1)
	expect(t, rs, "rdma_cm", Fail, "/dev/infiniband/rdma_cm is missing: the rdma_ucm module is not loaded", "modprobe rdma_ucm")

	// Loaded, but the device file is not there (a container).
	f.write("sys/module/rdma_ucm/refcnt", "0")
	rs = Run(f.env())
	expectExit(t, rs, 1)
	expect(t, rs, "rdma_cm", Fail, "missing although rdma_ucm is loaded", "--device /dev/infiniband/rdma_cm")

	f = healthy(t)
	f.remove("dev/infiniband/uverbs0")
	f.remove("sys/module/ib_uverbs")
	rs = Run(f.env())
	expectExit(t, rs, 1)
	expect(t, rs, "uverbs", Fail, "ib_uverbs module is not loaded", "modprobe ib_uverbs")
}

func TestLibibverbs(t *testing.T) {
	f := healthy(t)
	// The kernel has rxe0, libibverbs does not list it: no provider.
	f.verbs = []VerbsDevice{}
	rs := Run(f.env())
	expectExit(t, rs, 1)
	expect(t, rs, "libibverbs", Fail, "libibverbs lists no device although the kernel has rxe0", "ibverbs-providers")

	// libibverbs' port MTU wins over the netdev's.
	f.verbs = []VerbsDevice{{Name: "rxe0", Ports: []VerbsPort{{Num: 1, State: "ACTIVE", ActiveMTU: 4096, Ethernet: true}}}}
	rs = Run(f.env())
	expectExit(t, rs, 0)
	expect(t, rs, "libibverbs", OK, "opens rxe0 (1 port)", "")
	expect(t, rs, "port rxe0/1", OK, "active MTU 4096 (libibverbs)", "")

	f.verbs = []VerbsDevice{{Name: "rxe0", Err: errors.New("ibv_open_device rxe0: permission denied")}}
	rs = Run(f.env())
	expectExit(t, rs, 1)
	expect(t, rs, "libibverbs", Fail, "cannot open rxe0: ibv_open_device rxe0: permission denied", "ibv_devinfo -d rxe0")
}

// TestCapabilities: each opened device's capabilities are reported; a
// device without immediate data fails (this version's protocol needs it),
// one without windows, UD or atomics is a warning that says what the
// library does without them.
func TestCapabilities(t *testing.T) {
	f := healthy(t)
	port := []VerbsPort{{Num: 1, State: "ACTIVE", ActiveMTU: 1024, Ethernet: true}}
	f.verbs = []VerbsDevice{{Name: "rxe0", Ports: port,
		Caps: &DeviceCaps{Summary: "transport InfiniBand; memory windows yes", MemoryWindows: true, Immediates: true, Atomics: true, UD: true}}}
	rs := Run(f.env())
	expectExit(t, rs, 0)
	expect(t, rs, "capabilities rxe0", OK, "transport InfiniBand; memory windows yes", "")

	f.verbs[0].Caps = &DeviceCaps{Summary: "transport InfiniBand; memory windows no", Immediates: true, UD: true}
	rs = Run(f.env())
	expectExit(t, rs, 0)
	expect(t, rs, "capabilities rxe0", Warn, "memory windows no", "every connection of the device")
	if r := find(t, rs, "capabilities rxe0"); !strings.Contains(r.Fix, "atomic operations fail") || strings.Contains(r.Fix, "ListenPacket") {
		t.Fatalf("the warning should name what the device lacks (windows, atomics), no more: %q", r.Fix)
	}

	// An iWARP device runs connections over trailers: a warning that
	// says what it means for peers, not a failure.
	f.verbs[0].Caps = &DeviceCaps{Summary: "transport iWARP; immediates no"}
	rs = Run(f.env())
	expectExit(t, rs, 0)
	expect(t, rs, "capabilities rxe0", Warn, "immediates no", "4-byte trailer")
	if r := find(t, rs, "capabilities rxe0"); strings.Contains(r.Fix, "untrusted") {
		t.Fatalf("a device whose driver checks READ rights got the Soft-iWARP warning: %q", r.Fix)
	}

	// Soft-iWARP serves READs without checking rights: the warning says so.
	f.verbs[0].Caps = &DeviceCaps{Summary: "transport iWARP; immediates no", ReadsIgnoreRights: true}
	rs = Run(f.env())
	expectExit(t, rs, 0)
	expect(t, rs, "capabilities rxe0", Warn, "immediates no", "not to serve untrusted peers")
}

// TestIWARPDevice: Soft-iWARP (siw0 on rd0) has no parent in sysfs and no
// GIDs naming its netdev: the port's netdev comes from the RDMA netlink
// (`rdma link show`), the port is reported as iWARP (not RoCE), and its
// addresses are those of the netdev.
func TestIWARPDevice(t *testing.T) {
	f := healthy(t)
	f.remove("sys/class/infiniband/rxe0")
	f.write("sys/class/infiniband/siw0/node_type", "4: RNIC")
	f.port("siw0", 1, "4: ACTIVE", "Ethernet", nil)
	f.write("sys/class/infiniband/siw0/ports/1/gids/0", "5e26:78ff:fe59:225a:0000:0000:0000:0000")
	rs := Run(f.env())
	expectExit(t, rs, 1)
	expect(t, rs, "gids siw0/1", Fail, "no network device is bound to this port", "rdma link show")

	f.links = map[string]string{"siw0/1": "rd0"}
	rs = Run(f.env())
	expectExit(t, rs, 0)
	expect(t, rs, "port siw0/1", OK, "Ethernet (iWARP)", "")
	expect(t, rs, "gids siw0/1", OK, "iWARP: rdma_cm uses the addresses of rd0: 169.254.77.1", "")
}

func TestParseLinks(t *testing.T) {
	m, err := parseLinks([]byte(`[{"ifindex":1,"ifname":"rxe0","port":1,"state":"ACTIVE","physical_state":"LINK_UP","netdev":"rd0","netdev_index":3},` +
		`{"ifindex":2,"ifname":"mlx5_0","port":1,"state":"DOWN","physical_state":"DISABLED"}]`))
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || m["rxe0/1"] != "rd0" {
		t.Fatalf("links %v, want rxe0/1 -> rd0 only (mlx5_0 has no netdev)", m)
	}
	if _, err := parseLinks([]byte("not json")); err == nil {
		t.Fatal("parseLinks accepted malformed output")
	}
}

func TestSmallMTU(t *testing.T) {
	f := healthy(t)
	f.write("sys/class/net/rd0/mtu", "600")
	rs := Run(f.env())
	expectExit(t, rs, 0)
	expect(t, rs, "port rxe0/1", Warn, "active MTU 512 (from rd0's mtu 600)", "ip link set rd0 mtu 1500")
}

func TestHugePages(t *testing.T) {
	f := healthy(t)
	f.write("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "0")
	f.write("sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "0")
	rs := Run(f.env())
	expect(t, rs, "hugepages", OK, "no 2 MiB pages reserved (vm.nr_hugepages 0), fewer than the 4 the first connection's arenas take: arenas use transparent huge pages (THP madvise)", "")
	f.write("sys/kernel/mm/transparent_hugepage/enabled", "always madvise [never]")
	rs = Run(f.env())
	expectExit(t, rs, 0)
	expect(t, rs, "hugepages", Warn, "THP is never: arenas fall back to 4 KiB pages", "vm.nr_hugepages")
}

func TestNoCgo(t *testing.T) {
	f := healthy(t)
	f.cgo = false
	rs := Run(f.env())
	expectExit(t, rs, 1)
	expect(t, rs, "cgo", Fail, "built without cgo", "CGO_ENABLED=1")
}

func TestParsers(t *testing.T) {
	if a, ok := parseGID("0000:0000:0000:0000:0000:ffff:a9fe:4d01"); !ok || a != netip.MustParseAddr("169.254.77.1") {
		t.Errorf("IPv4-mapped GID: %v %v", a, ok)
	}
	if _, ok := parseGID("garbage"); ok {
		t.Error("garbage parsed as a GID")
	}
	for in, want := range map[string]string{"4: ACTIVE": "ACTIVE", "5: LinkUp": "LinkUp", "": ""} {
		if got := afterColon(in); got != want {
			t.Errorf("afterColon(%q) = %q", in, got)
		}
	}
	if got := bracketed("always [madvise] never"); got != "madvise" {
		t.Errorf("bracketed: %q", got)
	}
	for in, want := range map[int]int{9000: 4096, 4200: 4096, 1500: 1024, 1100: 512, 400: 256, 300: 0} {
		if got := ibMTU(in - 88); got != want {
			t.Errorf("netdev mtu %d: RDMA MTU %d, want %d", in, got, want)
		}
	}
	for in, want := range map[int64]string{12 << 20: "12 MiB", 4456448: "4.25 MiB", 64 << 10: "64 KiB", 1 << 30: "1 GiB", 100: "100 B"} {
		if got := size(in); got != want {
			t.Errorf("size(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{"-bogus"},
		{"extra"},
		{"-peer", "10.0.0.1:7471", "-listen", "10.0.0.1:7471"},
		{"-peer", "10.0.0.1:7471", "-count", "0"},
		{"-size", "0"},
		{"-timeout", "-1s"},
	} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
		if !strings.Contains(errOut.String(), "usage: verbline-doctor") {
			t.Errorf("%v: no usage on stderr: %q", args, errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"-h"}, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "-peer host:port") {
		t.Errorf("-h: exit %d, %q", code, errOut.String())
	}
}

// TestBinary runs the doctor as a process on this machine: on a host without
// an RDMA device it must diagnose that (exit 1, naming the missing device),
// in the Soft-RoCE guest (RDMA_TEST_DEVICE set) find nothing blocking.
func TestBinary(t *testing.T) {
	devs, _ := readDevices("/")
	inGuest := os.Getenv("RDMA_TEST_DEVICE") != ""
	for _, jsonOut := range []bool{false, true} {
		args := []string{}
		if jsonOut {
			args = append(args, "-json")
		}
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), "VERBLINE_DOCTOR_MAIN=1")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := cmd.ProcessState.ExitCode()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		if code != 0 && code != 1 || stderr.Len() > 0 {
			t.Fatalf("exit %d, stderr:\n%s\nstdout:\n%s", code, stderr.String(), stdout.String())
		}
		t.Logf("exit %d:\n%s", code, stdout.String())
		if jsonOut {
			var doc struct {
				OK      bool
				Exit    int
				Results []struct{ Name, Status, Detail, Fix string }
			}
			if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
				t.Fatalf("-json output does not parse: %v\n%s", err, stdout.String())
			}
			if doc.Exit != code || doc.OK != (code == 0) || len(doc.Results) < 6 {
				t.Fatalf("-json: exit %d ok %v with %d results, process exit %d", doc.Exit, doc.OK, len(doc.Results), code)
			}
		}
		switch {
		case inGuest:
			if code != 0 || !strings.Contains(stdout.String(), os.Getenv("RDMA_TEST_DEVICE")) {
				t.Fatalf("in the RDMA environment: exit %d, want 0 and the device %s named", code, os.Getenv("RDMA_TEST_DEVICE"))
			}
		case len(devs) == 0:
			if code != 1 || !strings.Contains(stdout.String(), "no RDMA device") {
				t.Fatalf("on a machine without a device: exit %d, want 1 and \"no RDMA device\"", code)
			}
			if !jsonOut && !strings.Contains(stdout.String(), "fix: load the NIC's RDMA driver") {
				t.Fatal("the missing device is reported without its fix")
			}
		}
	}
}
