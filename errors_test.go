//go:build linux && cgo

package rdma

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"

	cerrors "github.com/cockroachdb/errors"
)

// On this machine: the host has no RDMA device (Listen fails with
// ErrNoDevice, whose hint says what to load); in the Soft-RoCE guest an
// address without RDMA fails with ErrNotRDMAAddress, whose hint lists the
// guest's RDMA netdev and its IP.
func TestErrorsHintsLive(t *testing.T) {
	ln, err := Listen("rdma", "192.0.2.1:0") // TEST-NET-1: on no netdev here
	if err == nil {
		ln.Close()
		t.Fatal("listening on 192.0.2.1 succeeded")
	}
	hint := cerrors.FlattenHints(err)
	t.Logf("%v\nhint:\n%s", err, hint)
	switch {
	case errors.Is(err, ErrNoDevice):
		if os.Getenv("RDMA_TEST_DEVICE") != "" {
			t.Fatalf("ErrNoDevice with a device (%s): %v", os.Getenv("RDMA_TEST_DEVICE"), err)
		}
		if !strings.Contains(hint, "rdma_cm") {
			t.Errorf("no-device hint does not say what to load:\n%s", hint)
		}
	case errors.Is(err, ErrNotRDMAAddress):
		if !strings.Contains(hint, "addresses with RDMA on this machine") || !strings.Contains(hint, " port ") {
			t.Errorf("hint does not list this machine's RDMA addresses:\n%s", hint)
		}
	default:
		t.Fatalf("listen on 192.0.2.1: %v, want ErrNoDevice or ErrNotRDMAAddress", err)
	}
	if !errors.Is(err, ErrNotRDMAAddress) {
		return
	}
	// Loopback, and (scripts/softroce) an address on a netdev without RDMA:
	// the hint lists the RDMA addresses, not these.
	addrs := []string{"127.0.0.1"}
	if a := os.Getenv("RDMA_TEST_NONRDMA_ADDR"); a != "" {
		addrs = append(addrs, a)
	}
	for _, a := range addrs {
		_, err := Dial("rdma", net.JoinHostPort(a, "7471"))
		if a != "127.0.0.1" {
			_, err = Listen("rdma", net.JoinHostPort(a, "0"))
		}
		hint := cerrors.FlattenHints(err)
		if !errors.Is(err, ErrNotRDMAAddress) || !strings.Contains(hint, "addresses with RDMA on this machine") {
			t.Errorf("%s: %v, want ErrNotRDMAAddress with a hint; hint:\n%s", a, err, hint)
		} else if strings.Contains(hint, " "+a+"\n") || strings.Contains(hint, " "+a+",") {
			t.Errorf("%s: the hint lists it as an RDMA address:\n%s", a, hint)
		}
		t.Logf("%s: %v", a, err)
	}
}
