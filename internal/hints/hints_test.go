//go:build linux

package hints

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	cerrors "github.com/cockroachdb/errors"
	"golang.org/x/sys/unix"

	"github.com/verbline/rdma/internal/errs"
)

// Host tests of the hints attached to ErrMemlock, ErrNoDevice and
// ErrNotRDMAAddress, over fake sysfs, /dev and /proc trees.

// fakeTree writes files (path -> contents; a path ending in / is a
// directory) under a new root.
func fakeTree(t *testing.T, files map[string]string) string {
	root := t.TempDir()
	for p, body := range files {
		full := filepath.Join(root, p)
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(body+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func fakeEnv(root string, netdevs ...netdevInfo) hintEnv {
	return hintEnv{root: root, netdevs: func() []netdevInfo { return netdevs },
		memlock: func() (uint64, uint64, error) { return 8 << 20, unix.RLIM_INFINITY, nil }}
}

// A Soft-RoCE device on eth0 (the guest's), its GID table holding the
// netdev's link-local IPv6 and its IPv4 twice (RoCE v1 and v2 entries),
// empty slots, slot 10 after a hole (numeric order), and one after a run
// of gidEmptyRun empty slots, where the scan has stopped.
var rxeTree = func() map[string]string {
	m := map[string]string{}
	for i := 3; i < 40; i++ {
		m["sys/class/infiniband/rxe0/ports/1/gids/"+strconv.Itoa(i)] = "0000:0000:0000:0000:0000:0000:0000:0000"
	}
	m["sys/class/infiniband/rxe0/ports/1/gids/39"] = "0000:0000:0000:0000:0000:ffff:0a00:0299"
	m["sys/class/infiniband/rxe0/ports/1/gid_attrs/ndevs/39"] = "eth0"
	maps.Copy(m, rxeFiles)
	return m
}()

var rxeFiles = map[string]string{
	"sys/class/infiniband/rxe0/ports/1/state":              "4: ACTIVE",
	"sys/class/infiniband/rxe0/ports/1/link_layer":         "Ethernet",
	"sys/class/infiniband/rxe0/ports/1/gids/0":             "fe80:0000:0000:0000:5054:00ff:fe12:3456",
	"sys/class/infiniband/rxe0/ports/1/gid_attrs/ndevs/0":  "eth0",
	"sys/class/infiniband/rxe0/ports/1/gids/1":             "fe80:0000:0000:0000:5054:00ff:fe12:3456",
	"sys/class/infiniband/rxe0/ports/1/gid_attrs/ndevs/1":  "eth0",
	"sys/class/infiniband/rxe0/ports/1/gids/2":             "0000:0000:0000:0000:0000:ffff:0a00:020f",
	"sys/class/infiniband/rxe0/ports/1/gid_attrs/ndevs/2":  "eth0",
	"sys/class/infiniband/rxe0/ports/1/gids/3":             "0000:0000:0000:0000:0000:0000:0000:0000",
	"sys/class/infiniband/rxe0/ports/1/gids/10":            "0000:0000:0000:0000:0000:ffff:0a00:0210",
	"sys/class/infiniband/rxe0/ports/1/gid_attrs/ndevs/10": "eth0",
	"sys/class/infiniband/mlx5_0/ports/1/state":            "1: DOWN",
	"sys/class/infiniband/mlx5_0/ports/1/link_layer":       "InfiniBand",
	"sys/class/infiniband/mlx5_0/ports/1/gids/0":           "fe80:0000:0000:0000:0002:c903:0000:1234",
	"sys/class/infiniband/mlx5_0/device/net/ib0/addr_len":  "20",
	"dev/infiniband/rdma_cm":                               "",
	"dev/infiniband/uverbs0":                               "",
	"proc/self/status":                                     "Name:\tx\nVmPin:\t    8192 kB\nVmRSS:\t 1000 kB",
}

func TestRDMAAddressHint(t *testing.T) {
	env := fakeEnv(fakeTree(t, rxeTree),
		netdevInfo{name: "lo", up: true, loopback: true, addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}},
		netdevInfo{name: "ib0", up: true, addrs: []netip.Addr{netip.MustParseAddr("192.168.7.1")}})
	hint := rdmaAddressHint(env)
	for _, want := range []string{
		"eth0 (rxe0 port 1): fe80::5054:ff:fe12:3456, 10.0.2.15, 10.0.2.16\n", // deduplicated, unmapped, numeric order
		"ib0 (mlx5_0 port 1, DOWN: not usable until it is ACTIVE): 192.168.7.1\n",
		"ip route get",
		"Loopback (127.0.0.1, ::1) has no RDMA",
		"rdma link add rxe1 type rxe netdev <netdev>", // rxe0 is taken
	} {
		if !strings.Contains(hint, want) {
			t.Errorf("hint does not say %q:\n%s", want, hint)
		}
	}
	if strings.Contains(hint, "lo ") || strings.Contains(hint, "2:c903") || strings.Contains(hint, "10.0.2.153") {
		t.Errorf("hint lists loopback or an InfiniBand GID as an address:\n%s", hint)
	}

	// A RoCE netdev without an IP says how to give it one.
	tree := map[string]string{
		"sys/class/infiniband/rxe0/ports/1/state":             "4: ACTIVE",
		"sys/class/infiniband/rxe0/ports/1/gids/0":            "fe80:0000:0000:0000:5054:00ff:fe12:3456",
		"sys/class/infiniband/rxe0/ports/1/gid_attrs/ndevs/0": "eth1",
		"sys/class/infiniband/rxe0/ports/1/gids/1":            "0000:0000:0000:0000:0000:0000:0000:0000",
		"sys/class/infiniband/rxe0/ports/1/gid_attrs/ndevs/1": "eth2",
	}
	if hint := rdmaAddressHint(fakeEnv(fakeTree(t, tree))); !strings.Contains(hint, "eth1 (rxe0 port 1): fe80::5054:ff:fe12:3456") ||
		strings.Contains(hint, "eth2") {
		t.Errorf("hint with one GID on eth1 and an empty slot:\n%s", hint)
	}

	// No device at all: the hint says how to get one.
	hint = rdmaAddressHint(fakeEnv(fakeTree(t, nil), netdevInfo{name: "ens3", up: true}))
	if !strings.Contains(hint, "no RDMA device") || !strings.Contains(hint, "rdma link add rxe0 type rxe netdev ens3") {
		t.Errorf("hint without a device:\n%s", hint)
	}
}

func TestNoDeviceHint(t *testing.T) {
	for _, tc := range []struct {
		name    string
		files   map[string]string
		netdevs []netdevInfo
		want    []string
		not     []string
	}{
		{"nothing loaded", nil,
			[]netdevInfo{{name: "lo", up: true, loopback: true}, {name: "eth0", up: true}, {name: "eth1"}},
			[]string{"sudo modprobe rdma_rxe && sudo rdma link add rxe0 type rxe netdev eth0 (netdevs up here: eth0)",
				"mlx5_ib", "sudo modprobe rdma_ucm", "sudo modprobe ib_uverbs", "verbline-doctor"},
			[]string{"docker", "lo,"}},
		{"container without the device files", map[string]string{
			"sys/class/infiniband/rxe0/ports/1/state": "4: ACTIVE",
			"sys/module/rdma_ucm/refcnt":              "0",
			"sys/module/ib_uverbs/refcnt":             "0",
		}, nil,
			[]string{"RDMA devices present: rxe0", "rdma_cm is missing although rdma_ucm is loaded",
				"uverbs* although ib_uverbs is loaded", "docker run --device /dev/infiniband/rdma_cm"},
			[]string{"modprobe"}},
		{"everything there", map[string]string{
			"sys/class/infiniband/rxe0/ports/1/state": "4: ACTIVE",
			"dev/infiniband/rdma_cm":                  "",
			"dev/infiniband/uverbs0":                  "",
		}, nil,
			[]string{"RDMA devices present: rxe0", "may open /dev/infiniband/rdma_cm and uverbs* read-write"},
			[]string{"modprobe", "docker"}},
	} {
		hint := noDeviceHint(fakeEnv(fakeTree(t, tc.files), tc.netdevs...))
		for _, w := range tc.want {
			if !strings.Contains(hint, w) {
				t.Errorf("%s: hint does not say %q:\n%s", tc.name, w, hint)
			}
		}
		for _, w := range tc.not {
			if strings.Contains(hint, w) {
				t.Errorf("%s: hint says %q:\n%s", tc.name, w, hint)
			}
		}
	}
}

func TestMemlockHint(t *testing.T) {
	env := fakeEnv(fakeTree(t, rxeTree))
	hint := memlockHint(env, 4<<20)
	for _, want := range []string{
		"RLIMIT_MEMLOCK is 8 MiB (hard limit unlimited)", "8 MiB pinned (VmPin)", "registering 4 MiB more failed",
		"first connection on a device registers 8 MiB", "Config.PoolMaxBytes (1 GiB by default)",
		"ulimit -l unlimited", "LimitMEMLOCK=infinity", "docker run --ulimit memlock=-1", "CAP_IPC_LOCK",
	} {
		if !strings.Contains(hint, want) {
			t.Errorf("hint does not say %q:\n%s", want, hint)
		}
	}
	env.memlock = func() (uint64, uint64, error) { return unix.RLIM_INFINITY, unix.RLIM_INFINITY, nil }
	if hint := memlockHint(env, 0); !strings.Contains(hint, "unlimited, so the kernel is short of memory") {
		t.Errorf("hint with no limit:\n%s", hint)
	}
	env.memlock = func() (uint64, uint64, error) { return 0, 0, syscall.EPERM }
	if hint := memlockHint(env, 0); !strings.Contains(hint, "could not be read") {
		t.Errorf("hint when the limit cannot be read:\n%s", hint)
	}
}

// The errors users act on carry their hint through the wrapping they get
// on the way out (fmt.Errorf's %w, the *net.OpError of Dial and Listen),
// keep their Error() text (the fix in one line, for %v), and still match
// their sentinel and the errno behind them.
func TestErrorsHints(t *testing.T) {
	opError := func(err error) error {
		return &net.OpError{Op: "dial", Net: "rdma", Err: fmt.Errorf("buffer: registering a 4194304-byte arena: %w", err)}
	}
	for _, tc := range []struct {
		name     string
		err      error
		sentinel error
		errno    error
		hint     string
	}{
		{"memlock", MemlockError(fmt.Errorf("ibv_reg_mr: %w", syscall.ENOMEM), 4<<20), errs.ErrMemlock, syscall.ENOMEM, "RLIMIT_MEMLOCK"},
		{"memlock EPERM", MemlockError(syscall.EPERM, 4<<20), errs.ErrMemlock, syscall.EPERM, "LimitMEMLOCK=infinity"},
		{"no device", Add(fmt.Errorf("%w (%w)", errs.ErrNoDevice, errors.New("rdma_cm unavailable"))), errs.ErrNoDevice, nil, "verbline-doctor"},
		{"not an RDMA address", Add(fmt.Errorf("%w: %w", errs.ErrNotRDMAAddress, syscall.ENODEV)), errs.ErrNotRDMAAddress, syscall.ENODEV, "rdma link add"},
	} {
		for _, err := range []error{tc.err, opError(tc.err)} {
			if !errors.Is(err, tc.sentinel) || !cerrors.Is(err, tc.sentinel) {
				t.Errorf("%s: %v does not match %v", tc.name, err, tc.sentinel)
			}
			if tc.errno != nil && !errors.Is(err, tc.errno) {
				t.Errorf("%s: %v does not match %v", tc.name, err, tc.errno)
			}
			if !strings.Contains(err.Error(), tc.sentinel.Error()) {
				t.Errorf("%s: %q lost the sentinel's text (the fix in one line)", tc.name, err)
			}
			hints := cerrors.GetAllHints(err)
			if len(hints) != 1 || !strings.Contains(cerrors.FlattenHints(err), tc.hint) {
				t.Errorf("%s: hints of %v = %q, want one saying %q", tc.name, err, hints, tc.hint)
			}
		}
	}
	// Wrapping the hinted error leaves its text as it was.
	plain := fmt.Errorf("%w: %w", errs.ErrNotRDMAAddress, syscall.ENODEV)
	if got := Add(plain).Error(); got != plain.Error() {
		t.Errorf("hinted text %q, want %q", got, plain.Error())
	}

	// Errors without a fix on this machine are returned as they are: no
	// hint, no wrapper (net's errors keep their identity).
	for _, err := range []error{nil, os.ErrDeadlineExceeded, net.ErrClosed, syscall.ECONNREFUSED,
		&errs.DeviceFailed{Msg: "RDMA device rxe0 reported a fatal error"}} {
		if got := Add(err); got != err {
			t.Errorf("Add(%v) = %v, want it unchanged", err, got)
		}
	}
	var op *net.OpError
	if err := opError(MemlockError(syscall.ENOMEM, 1)); !errors.As(err, &op) || op.Op != "dial" {
		t.Errorf("errors.As *net.OpError: %v", err)
	}
}

// A registration the kernel refused to pin is a MemlockError; any other
// failure keeps its errno under what was being registered.
func TestRegistrationError(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.ENOMEM, syscall.EPERM} {
		err := RegistrationError(fmt.Errorf("ibv_reg_mr: %w", errno), 4<<20, "registering a message")
		if !errors.Is(err, errs.ErrMemlock) || !errors.Is(err, errno) || len(cerrors.GetAllHints(err)) != 1 {
			t.Errorf("%v: %v, want ErrMemlock and the errno, with a hint", errno, err)
		}
	}
	err := RegistrationError(syscall.EINVAL, 64, "registering a message")
	if !errors.Is(err, syscall.EINVAL) || errors.Is(err, errs.ErrMemlock) || err.Error() != "registering a message: "+syscall.EINVAL.Error() {
		t.Errorf("EINVAL: %v, want it under what was registered, without ErrMemlock", err)
	}
	if err := RegistrationError(syscall.EINVAL, 64, ""); err != syscall.EINVAL {
		t.Errorf("EINVAL without what: %v, want it unchanged", err)
	}
}

// TestRDMAAddressHintIWARP: iWARP GIDs name no netdev. Soft-iWARP (no
// device behind it) is found by its GID, its netdev's MAC; a hardware
// iWARP NIC by its PCI device's netdev.
func TestRDMAAddressHintIWARP(t *testing.T) {
	tree := map[string]string{
		"sys/class/infiniband/siw0/node_type":                "4: RNIC",
		"sys/class/infiniband/siw0/ports/1/state":            "4: ACTIVE",
		"sys/class/infiniband/siw0/ports/1/link_layer":       "Ethernet",
		"sys/class/infiniband/siw0/ports/1/gids/0":           "5e26:7859:225a:0000:0000:0000:0000:0000",
		"sys/class/infiniband/iwp0/node_type":                "4: RNIC",
		"sys/class/infiniband/iwp0/ports/1/state":            "4: ACTIVE",
		"sys/class/infiniband/iwp0/ports/1/link_layer":       "Ethernet",
		"sys/class/infiniband/iwp0/ports/1/gids/0":           "0007:4301:0203:0000:0000:0000:0000:0000",
		"sys/class/infiniband/iwp0/device/net/ens5/addr_len": "6",
	}
	env := fakeEnv(fakeTree(t, tree),
		netdevInfo{name: "rd0", up: true, addrs: []netip.Addr{netip.MustParseAddr("169.254.77.1")},
			mac: net.HardwareAddr{0x5e, 0x26, 0x78, 0x59, 0x22, 0x5a}},
		netdevInfo{name: "eth9", up: true, addrs: []netip.Addr{netip.MustParseAddr("10.1.1.1")},
			mac: net.HardwareAddr{0x5e, 0x26, 0x78, 0x59, 0x22, 0x5b}},
		netdevInfo{name: "ens5", up: true, addrs: []netip.Addr{netip.MustParseAddr("10.9.9.9")}})
	hint := rdmaAddressHint(env)
	for _, want := range []string{"rd0 (siw0 port 1): 169.254.77.1\n", "ens5 (iwp0 port 1): 10.9.9.9\n"} {
		if !strings.Contains(hint, want) {
			t.Errorf("hint does not say %q:\n%s", want, hint)
		}
	}
	if strings.Contains(hint, "eth9") {
		t.Errorf("hint lists a netdev whose MAC differs from the GID's:\n%s", hint)
	}
}
