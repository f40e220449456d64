package main

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"

	cerrors "github.com/cockroachdb/errors"

	"github.com/verbline/rdma"
)

// The fixes of a failed dial or listen are the library's hint when it
// attached one (this machine's RDMA addresses, its memlock limit), and
// the doctor's own advice otherwise; a hint of several lines is printed
// indented under the fix.
func TestFixUsesLibraryHint(t *testing.T) {
	const hint = "addresses with RDMA on this machine, by netdev:\n  eth0 (rxe0 port 1): 10.0.2.15"
	hinted := &net.OpError{Op: "listen", Net: "rdma",
		Err: cerrors.WithHint(fmt.Errorf("%w: %w", rdma.ErrNotRDMAAddress, syscall.ENODEV), hint)}
	plain := &net.OpError{Op: "listen", Net: "rdma", Err: fmt.Errorf("%w: %w", rdma.ErrNotRDMAAddress, syscall.ENODEV)}
	if got := listenFix(hinted); got != hint {
		t.Errorf("listenFix with a hint: %q", got)
	}
	if got := listenFix(plain); !strings.Contains(got, "rdma link show") {
		t.Errorf("listenFix without a hint: %q", got)
	}
	if got := dialFix(hinted, "10.0.2.16:7471"); !strings.Contains(got, "route to 10.0.2.16:7471") || !strings.HasSuffix(got, hint) {
		t.Errorf("dialFix with a hint: %q", got)
	}
	memlock := cerrors.WithHint(fmt.Errorf("%w: %w", rdma.ErrMemlock, syscall.ENOMEM), "RLIMIT_MEMLOCK is 64 KiB")
	if got := dialFix(memlock, "x"); got != "RLIMIT_MEMLOCK is 64 KiB" {
		t.Errorf("dialFix of a memlock error with a hint: %q", got)
	}
	if got := dialFix(fmt.Errorf("%w", rdma.ErrMemlock), "x"); got != memlockFix {
		t.Errorf("dialFix of a memlock error without a hint: %q", got)
	}

	var out bytes.Buffer
	printText(&out, []Result{problem(Fail, "peer", "dial: failed", dialFix(hinted, "10.0.2.16:7471"))}, 1)
	lines := strings.Split(out.String(), "\n")
	fix := -1
	for i, l := range lines {
		if strings.Contains(l, "fix: ") {
			fix = i
		}
	}
	if fix < 0 || fix+2 >= len(lines) {
		t.Fatalf("no fix printed:\n%s", out.String())
	}
	col := strings.Index(lines[fix], "fix: ") + len("fix: ")
	if next := lines[fix+1]; len(next) <= col || strings.TrimSpace(next[:col]) != "" || next[col] == ' ' {
		t.Errorf("continuation of the fix not aligned under it (column %d):\n%s", col, out.String())
	}
}
