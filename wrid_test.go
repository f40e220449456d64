//go:build linux && cgo

package rdma

import (
	"strings"
	"testing"

	"github.com/verbline/rdma/internal/verbs"
)

// Every kind of work request a connection posts has a name for its
// completion errors; one-sided operations are named by their opcode.
func TestWRKindNames(t *testing.T) {
	seen := map[string]bool{}
	for _, kind := range []uint64{wrRecv, wrSendData, wrSendCtl, wrSendMsg, wrOneSided, wrSendRv, wrBind, wrInval,
		wrReadRv, wrSendUnc} {
		name := wrKindName(0xabc<<40 | kind | 7)
		if name == "" || seen[name] {
			t.Errorf("kind %d: name %q (empty or repeated)", kind>>32, name)
		}
		seen[name] = true
	}
	if wrKindName(0xfe<<32) != "" {
		t.Error("an unknown kind has a name")
	}
	wc := verbs.WC{WRID: wrSendMsg | 3, Status: verbs.WCRetryExcErr, QPNum: 0x2a}
	if err := wcErr(&wc); err == nil || !strings.HasPrefix(err.Error(), "message send on QP 0x2a failed: transport retry counter exceeded") {
		t.Fatalf("got %v", err)
	}
	for op, want := range map[uint32]string{verbs.OpRDMAWrite: "RDMA write", verbs.OpRDMARead: "RDMA read",
		verbs.OpRDMAWriteWithImm: "RDMA write with immediate"} {
		if got := oneSidedOpName(op); got != want {
			t.Errorf("opcode %d: %q, want %q", op, got, want)
		}
	}
}
