//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	cerrors "github.com/cockroachdb/errors"
	"golang.org/x/sys/unix"

	"github.com/verbline/rdma/internal/rdmatest"
)

// TestMemlockErrorLive: with a locked-memory limit below what a
// connection registers, Dial fails with ErrMemlock, the errno behind it,
// and the hint with this process's limit, as a user gets them (through
// the *net.OpError). The kernel does not hold a process with CAP_IPC_LOCK
// (root, in the guest) to the limit, so the test runs itself again
// without that capability (setpriv, from util-linux) and with a 64 KiB
// limit; the device must be fresh in that process (no pool registered yet).
func TestMemlockErrorLive(t *testing.T) {
	if os.Getenv("VERBLINE_MEMLOCK_CHILD") != "" {
		memlockChild(t)
		return
	}
	env := rdmatest.Require(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux) runs the test without CAP_IPC_LOCK: %v", err)
	}
	cmd := exec.Command(setpriv, "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", "--",
		os.Args[0], "-test.run=^TestMemlockErrorLive$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "VERBLINE_MEMLOCK_CHILD="+env.Addr)
	out, err := cmd.CombinedOutput()
	t.Logf("child:\n%s", out)
	if err != nil || !strings.Contains(string(out), "memlock child: ok") {
		t.Fatalf("child failed: %v", err)
	}
}

func memlockChild(t *testing.T) {
	if caps, ok := procStatusHex("CapEff"); !ok || caps&(1<<14) != 0 {
		t.Fatalf("the child still has CAP_IPC_LOCK (CapEff %x)", caps)
	}
	const limit = 64 << 10
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: limit, Max: limit}); err != nil {
		t.Fatal(err)
	}
	ln, err := Listen("rdma", net.JoinHostPort(os.Getenv("VERBLINE_MEMLOCK_CHILD"), "0"))
	if err != nil {
		t.Fatalf("listen: %v", err) // a listener registers nothing until it accepts
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	d := Dialer{Timeout: rdmatest.Scale(10 * time.Second)}
	c, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	if err == nil {
		c.Close()
		t.Fatal("dial registered its buffers under a 64 KiB memlock limit without CAP_IPC_LOCK")
	}
	hint := cerrors.FlattenHints(err)
	t.Logf("%v\nhint:\n%s", err, hint)
	var op *net.OpError
	if !errors.As(err, &op) || !errors.Is(err, ErrMemlock) || !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("dial: %v, want a *net.OpError matching ErrMemlock and ENOMEM", err)
	}
	if !strings.Contains(err.Error(), "ulimit -l") {
		t.Errorf("the text does not say how to raise the limit: %v", err)
	}
	if !strings.Contains(hint, "RLIMIT_MEMLOCK is 64 KiB (hard limit 64 KiB)") || !strings.Contains(hint, "LimitMEMLOCK=infinity") {
		t.Errorf("the hint does not give this process's limit and how to raise it:\n%s", hint)
	}
	t.Log("memlock child: ok")
}

// procStatusHex returns a hexadecimal field of /proc/self/status (CapEff).
func procStatusHex(field string) (uint64, bool) {
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == field {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return n, err == nil
		}
	}
	return 0, false
}
