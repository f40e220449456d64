package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/verbline/rdma/internal/wire"
)

// What a connection of the default Config registers (pins), from the
// library's sources; the Soft-RoCE test compares the estimate with the
// kernel's count (VmPin) after real connections, so a change there that
// this file misses fails that test.
const (
	defaultBufferSize  = 32 << 10 // rdma.go, Config.BufferSize default
	defaultRecvBuffers = 64       // Config.RecvBuffers default: the most a receive window grows to
	defaultSendBuffers = 64       // Config.SendBuffers default: the most a send ring grows to
	initialCredits     = 4        // window.go: the receive window a connection starts with
	controlRecvs       = 2        // keepalive.go, ctlRecvReserve: receives for the peer's control messages
	initialSendBufs    = 1        // window.go: the send ring a connection starts with
	rendezvousRecvs    = 8        // endpoint.go, maxRendezvous: at most this many more, as large messages need them
	arenaBytes         = 4 << 20  // buffer/pool.go, the default SlabSize: each arena is registered whole
	poolMaxBytes       = 1 << 30  // Config.PoolMaxBytes default: the most one device's pool registers
)

// ringBuffers is how many BufferSize buffers a new (or idle) connection
// takes from its device's pool (endpoint.go newEndpoint); busyBuffers how
// many it holds once its rings have grown all the way (window.go).
const (
	ringBuffers = initialCredits + controlRecvs + initialSendBufs
	busyBuffers = defaultRecvBuffers + controlRecvs + rendezvousRecvs + defaultSendBuffers
)

// descClass is the pool class of a connection's rendezvous descriptor
// buffer (SendBuffers x wire.RendezvousLen bytes): the smallest of the
// pool's power-of-four classes from 256 B that holds it (device.go poolClasses).
func descClass() int {
	n := defaultSendBuffers * wire.RendezvousLen
	c := 256
	for c < n {
		c *= 4
	}
	return c
}

// pinnedBytes estimates what n new or idle connections of the default
// Config on one device register: the pool maps and registers 4 MiB arenas
// per size class on demand, so the ring buffers take ceil(n x 7 / 128)
// arenas of the 32 KiB class and the descriptors ceil(n / 1024) arenas of
// theirs. Busy connections grow their rings (busyBuffers each).
func pinnedBytes(n int) int64 {
	perArena := arenaBytes / defaultBufferSize
	descPerArena := arenaBytes / descClass()
	arenas := (n*ringBuffers+perArena-1)/perArena + (n+descPerArena-1)/descPerArena
	return int64(arenas) * arenaBytes
}

// firstConnArenas is how many arenas the first connection registers.
func firstConnArenas() int { return int(pinnedBytes(1) / arenaBytes) }

// maxConns is how many default connections fit in limit bytes.
func maxConns(limit uint64) int {
	n := 0
	for n < 1<<20 && uint64(pinnedBytes(n+1)) <= limit {
		n++
	}
	return n
}

// estimateBasis says where the estimate comes from, for the output.
func estimateBasis() string {
	return fmt.Sprintf("estimate for the default Config: the first connection registers %s, %d pool arenas of %s "+
		"(%d for its %d buffers of %s: %d receive + %d control + %d send; 1 for its rendezvous descriptors); "+
		"each further idle connection about %s, a busy one up to %s as its rings grow; a device's pool at most %s (PoolMaxBytes)",
		size(pinnedBytes(1)), firstConnArenas(), size(arenaBytes), firstConnArenas()-1, ringBuffers, size(defaultBufferSize),
		initialCredits, controlRecvs, initialSendBufs, size(int64(ringBuffers*defaultBufferSize)),
		size(int64(busyBuffers*defaultBufferSize)), size(poolMaxBytes))
}

const memlockFix = "raise it: `ulimit -l unlimited` (as root) in the shell, LimitMEMLOCK=infinity for a systemd service, " +
	"'<user> - memlock unlimited' in /etc/security/limits.conf, or docker run --ulimit memlock=-1"

// MemlockData is the memlock check's figures in -json output.
type MemlockData struct {
	LimitBytes     uint64 `json:"limit_bytes"` // 0 when unlimited
	Unlimited      bool   `json:"unlimited"`
	CapIPCLock     bool   `json:"cap_ipc_lock"`
	FirstConnBytes int64  `json:"first_conn_bytes"`
	PerConnBytes   int64  `json:"per_conn_bytes"`
	PoolMaxBytes   int64  `json:"pool_max_bytes"`
}

// checkMemlock compares RLIMIT_MEMLOCK with what the default Config
// registers. The kernel charges registered memory to the limit
// (ib_umem_get) unless the process has CAP_IPC_LOCK.
func checkMemlock(root string, memlock func() (uint64, bool, error)) Result {
	const name = "memlock"
	limit, unlimited, err := memlock()
	if err != nil {
		return problem(Warn, name, "cannot read RLIMIT_MEMLOCK: "+err.Error(), "check `ulimit -l`")
	}
	capLock := hasCapIPCLock(root)
	data := MemlockData{LimitBytes: limit, Unlimited: unlimited, CapIPCLock: capLock, FirstConnBytes: pinnedBytes(1),
		PerConnBytes: int64(ringBuffers * defaultBufferSize), PoolMaxBytes: poolMaxBytes}
	res := func(s Status, detail, fix string) Result {
		r := problem(s, name, detail, fix)
		r.Note, r.Data = estimateBasis(), data
		return r
	}
	if unlimited {
		data.LimitBytes = 0
		return res(OK, "unlimited", "")
	}
	lim := "limit " + size(int64(limit))
	exempt := ""
	if capLock {
		exempt = "; not enforced for this process (it has CAP_IPC_LOCK), but a service without it is held to it"
	}
	switch n := maxConns(limit); {
	case limit >= poolMaxBytes:
		return res(OK, lim+": enough for the pool's cap", "")
	case n == 0 && !capLock:
		return res(Fail, fmt.Sprintf("%s is below the %s the first connection registers: connections fail with ErrMemlock", lim, size(pinnedBytes(1))), memlockFix)
	case n == 0:
		return res(Warn, fmt.Sprintf("%s is below the %s the first connection registers%s", lim, size(pinnedBytes(1)), exempt), memlockFix)
	default:
		return res(Warn, fmt.Sprintf("%s holds %d connection%s of the default Config, less than the pool may register%s", lim, n, plural(n), exempt), memlockFix)
	}
}

// capIPCLock is CAP_IPC_LOCK's bit in the capability sets (linux/capability.h).
const capIPCLock = 14

// hasCapIPCLock reads the effective capabilities from proc/self/status.
func hasCapIPCLock(root string) bool {
	v, ok := procStatus(root, "CapEff")
	if !ok {
		return false
	}
	caps, err := strconv.ParseUint(v, 16, 64)
	return err == nil && caps&(1<<capIPCLock) != 0
}

// procStatus returns a field of root/proc/self/status.
func procStatus(root, field string) (string, bool) {
	for _, line := range strings.Split(readFile(filepath.Join(root, "proc/self/status")), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == field {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// vmPin is the memory the kernel counts as pinned for this process
// (registered RDMA memory), from /proc/self/status.
func vmPin(root string) (int64, bool) {
	v, ok := procStatus(root, "VmPin")
	if !ok {
		return 0, false
	}
	kb, err := strconv.ParseInt(strings.TrimSuffix(v, " kB"), 10, 64)
	return kb << 10, err == nil
}

// size formats bytes as "12 MiB", "4.25 MiB", "64 KiB".
func size(b int64) string {
	switch {
	case b >= 1<<30 && b%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", b>>30)
	case b >= 1<<20:
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", float64(b)/(1<<20)), "0"), ".") + " MiB"
	case b >= 1<<10:
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", float64(b)/(1<<10)), "0"), ".") + " KiB"
	}
	return fmt.Sprintf("%d B", b)
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}
