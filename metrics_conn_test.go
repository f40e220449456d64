//go:build linux && cgo

package rdma

import (
	"testing"

	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// Host tests of metrics_conn.go's pure parts: what a batch of completions
// counts as arrived, and the credit-stall transitions; and what counting
// costs the data path.

const wcWithImm = 2 // IBV_WC_WITH_IMM

func recvWC(kind wire.Kind, n uint32) verbs.WC {
	return verbs.WC{WRID: 7<<40 | wrRecv | 3, Status: verbs.WCSuccess, Opcode: verbs.WCRecv, ByteLen: n,
		Imm: wire.EncodeImm(kind, 5), Flags: wcWithImm}
}

func TestCountArrived(t *testing.T) {
	if w := (verbs.WC{Flags: wcWithImm}); !w.HasImm() {
		t.Fatal("wcWithImm is not IBV_WC_WITH_IMM")
	}
	failed := recvWC(wire.KindData, 500)
	failed.Status = verbs.WCWRFlushErr
	notification := recvWC(wire.KindData, 4096)
	notification.Opcode = verbs.WCRecvRDMAWithImm
	noImm := recvWC(wire.KindData, 64)
	noImm.Flags = 0
	wcs := []verbs.WC{
		recvWC(wire.KindData, 1000),
		recvWC(wire.KindData, 24),
		recvWC(wire.KindMessage, 300),
		recvWC(wire.KindMessage, 0), // an empty message is a message
		recvWC(wire.KindRendezvous, wire.RendezvousLen),
		{WRID: 7<<40 | wrReadRv | 9, Status: verbs.WCSuccess, Opcode: verbs.WCRDMARead, ByteLen: 1 << 20},
		recvWC(wire.KindCredit, 0),
		recvWC(wire.KindFIN, 0),
		recvWC(wire.KindRendezvousDone, 0),
		{WRID: 7<<40 | wrSendData | 1, Status: verbs.WCSuccess, Opcode: verbs.WCSend, ByteLen: 999},
		{WRID: 7<<40 | wrOneSided | 1, Status: verbs.WCSuccess, Opcode: verbs.WCRDMARead, ByteLen: 999},
		failed, notification, noImm,
		{WRID: wrRecv, Status: verbs.WCSuccess, Opcode: verbs.WCRecv, Imm: 0xff << 24, Flags: wcWithImm}, // unknown kind
	}
	bytes, msgs := countArrived(wcs)
	if want := uint64(1000 + 24 + 300 + 1<<20); bytes != want || msgs != 3 {
		t.Errorf("countArrived: %d bytes, %d messages; want %d, 3", bytes, msgs, want)
	}
	if b, m := countArrived(nil); b != 0 || m != 0 {
		t.Errorf("no completions: %d, %d", b, m)
	}
}

func TestCreditCheck(t *testing.T) {
	var k connCounters
	for i, step := range []struct {
		noCredit bool
		stalls   uint64
	}{
		{false, 0}, {true, 1}, {true, 1}, {true, 1}, // one stall however often a waiter looks
		{false, 1}, {false, 1}, {true, 2}, {false, 2}, {true, 3},
	} {
		k.creditCheck(step.noCredit)
		if got := k.creditStalls.Load(); got != step.stalls {
			t.Fatalf("step %d (no credit %v): %d stalls, want %d", i, step.noCredit, got, step.stalls)
		}
	}
}

// BenchmarkCountArrived is what countCompletions adds to each batch the
// poller dispatches (16 receive completions of stream data here), and
// BenchmarkCountWrite what Write adds per call.
func BenchmarkCountArrived(b *testing.B) {
	wcs := make([]verbs.WC, 16)
	for i := range wcs {
		wcs[i] = recvWC(wire.KindData, 64)
	}
	var c connCounters
	b.ReportAllocs()
	for b.Loop() {
		bytes, msgs := countArrived(wcs)
		c.bytesReceived.Add(bytes)
		c.msgsReceived.Add(msgs)
	}
}

func BenchmarkCountWrite(b *testing.B) {
	var c connCounters
	b.ReportAllocs()
	for b.Loop() {
		c.wrote(64)
	}
}
