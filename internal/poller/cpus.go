package poller

import (
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/klauspost/cpuid/v2"
	"golang.org/x/sys/unix"
)

// PickCPUs chooses n cores for pollers among the CPUs this process may run
// on: one hardware thread per physical core first (a poller sharing a core
// with its sibling halves both), highest-numbered first (CPU 0 takes most
// interrupts), then the remaining hardware threads.
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
