//go:build linux && cgo

package poller

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/klauspost/cpuid/v2"
	"golang.org/x/sys/unix"
)

// MinPinCPUs is the fewest CPUs a process must be allowed to run on for
// its pollers to be pinned without being asked. With fewer, a pinned
// poller would share its core with the application, and every hand-over
// between them would be a thread switch; the pollers then run as ordinary
// goroutines and the application's own goroutines drive the CQs.
const MinPinCPUs = 4

// claimDir holds one lock file per CPU that some process's poller is
// pinned to (flock'ed while the poller lives; the kernel drops the lock
// when the process exits), so pollers of different processes on one host
// do not stack on the same core.
var claimDir = "/dev/shm"

// cpuClaim is a CPU this process's poller holds.
type cpuClaim struct {
	cpu int
	f   *os.File
}

func (c *cpuClaim) release() {
	if c.f != nil {
		c.f.Close() // drops the flock
	}
}

// ClaimCPUs chooses up to n cores for pinned pollers and claims them
// host-wide: none when the process may run on fewer than MinPinCPUs CPUs;
// otherwise cores no other process's poller has claimed, in PickCPUs'
// order. Cores another process's poller claimed are skipped: when every
// allowed core is claimed, the pollers are not pinned at all.
func ClaimCPUs(n int) ([]int, []*cpuClaim) {
	allowed := PickCPUs(1 << 10)
	if len(allowed) < MinPinCPUs {
		return nil, nil
	}
	var cpus []int
	var claims []*cpuClaim
	for _, cpu := range allowed {
		if len(cpus) == n {
			break
		}
		f, err := os.OpenFile(filepath.Join(claimDir, "verbline-poller-cpu"+strconv.Itoa(cpu)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			// No shared place to claim in: pin as PickCPUs orders them.
			return PickCPUs(n), nil
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			f.Close() // another process's poller is there
			continue
		}
		cpus = append(cpus, cpu)
		claims = append(claims, &cpuClaim{cpu: cpu, f: f})
	}
	return cpus, claims
}

// PickCPUs orders up to n cores for pollers among the CPUs this process
// may run on: one hardware thread per physical core first (a poller
// sharing a core with its sibling halves both), highest-numbered first
// (CPU 0 takes most interrupts), then the remaining hardware threads.
func PickCPUs(n int) []int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil
	}
	var allowed []int
	for i := 0; i < 1024; i++ {
		if set.IsSet(i) {
			allowed = append(allowed, i)
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(allowed)))
	seenCore := map[string]bool{}
	var first, rest []int
	for _, cpu := range allowed {
		core := coreOf(cpu)
		if core != "" && seenCore[core] {
			rest = append(rest, cpu)
			continue
		}
		seenCore[core] = true
		first = append(first, cpu)
	}
	out := append(first, rest...)
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// coreOf names the physical core of cpu from sysfs ("" if unknown; then, if
// cpuid says cores have one thread, every CPU is its own core anyway).
func coreOf(cpu int) string {
	base := "/sys/devices/system/cpu/cpu" + strconv.Itoa(cpu) + "/topology/"
	pkg, err1 := os.ReadFile(base + "physical_package_id")
	core, err2 := os.ReadFile(base + "core_id")
	if err1 != nil || err2 != nil {
		if cpuid.CPU.ThreadsPerCore > 1 && cpuid.CPU.LogicalCores > 0 {
			// Linux numbers siblings n apart on most x86 systems.
			return strconv.Itoa(cpu % max(1, cpuid.CPU.PhysicalCores))
		}
		return ""
	}
	return strings.TrimSpace(string(pkg)) + "/" + strings.TrimSpace(string(core))
}
