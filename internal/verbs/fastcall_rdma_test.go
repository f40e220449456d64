//go:build linux && cgo

package verbs

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCallPaths runs the data path's calls (PostRecv, PostSend,
// PostRecvSend, Poll, PollTries, ReqNotify, GetEvent) through fast calls and
// through cgo: the same exchange, the same completions, bytes and events, and
// the same error for a post the provider refuses.
func TestCallPaths(t *testing.T) {
	for _, fast := range []bool{true, false} {
		t.Run(map[bool]string{true: "fast", false: "cgo"}[fast], func(t *testing.T) {
			old := SetFastCalls(fast)
			defer SetFastCalls(old)
			if !connectsByHand(t) {
				return
			}
			ctx, port, dev, gid := testDevice(t)
			lim := port.Limits(dev)
			pd, err := ctx.AllocPD()
			must(t, err)
			defer pd.Close()
			mem := mmapBuf(t, 64*1024)
			mr, err := pd.RegMR(mem, AccessLocalWrite)
			must(t, err)
			defer mr.Close()
			ch, err := ctx.CreateCompChannel()
			must(t, err)
			defer ch.Close()
			cq, err := ctx.CreateCQ(64, ch)
			must(t, err)
			defer cq.Close()
			cfg := QPConfig{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, SendWR: 16, RecvWR: 16}
			a, err := pd.CreateQP(cfg)
			must(t, err)
			defer a.Close()
			b, err := pd.CreateQP(cfg)
			must(t, err)
			defer b.Close()
			connectPair(t, QPTypeRC, port, lim, gid, a, b)

			// b: 8 receives in one batch; a: 4 sends in one batch, the last
			// signaled (the others retire with it).
			const recvBase = 32 * 1024
			var recvs []RecvWR
			for i := range 8 {
				recvs = append(recvs, RecvWR{WRID: uint64(100 + i), Addr: mr.Addr() + recvBase + uint64(i)*1024, Len: 1024, LKey: mr.LKey})
			}
			must(t, b.PostRecv(recvs))
			var sends []SendWR
			for i := range 4 {
				msg := fmt.Sprintf("message %d via %v", i, fast)
				copy(mem[i*1024:], msg)
				sends = append(sends, SendWR{WRID: uint64(i), Addr: mr.Addr() + uint64(i)*1024, Len: uint32(len(msg)),
					LKey: mr.LKey, Opcode: OpSendWithImm, Imm: uint32(i)})
			}
			sends[3].Flags = SendSignaled
			must(t, a.PostSend(sends))
			wcs := make([]WC, 16)
			var got []WC
			for len(got) < 5 { // 4 receives + 1 signaled send
				n, err := cq.PollTries(wcs, 64)
				must(t, err)
				got = append(got, wcs[:n]...)
			}
			recvd := 0
			for _, wc := range got {
				must(t, wc.Err())
				if wc.WRID >= 100 {
					i := int(wc.WRID - 100)
					want := fmt.Sprintf("message %d via %v", i, fast)
					at := recvBase + i*1024
					if !wc.HasImm() || wc.Imm != uint32(i) || !bytes.Equal(mem[at:at+int(wc.ByteLen)], []byte(want)) {
						t.Fatalf("receive %d: %+v %q, want %q", i, wc, mem[at:at+int(wc.ByteLen)], want)
					}
					recvd++
				} else if wc.WRID != 3 {
					t.Fatalf("unexpected completion %+v", wc)
				}
			}
			if recvd != 4 {
				t.Fatalf("%d receives completed, want 4", recvd)
			}

			// b answers with PostRecvSend (reposts and replies in one call);
			// a polls with Poll (one try a call).
			must(t, a.PostRecv([]RecvWR{{WRID: 200, Addr: mr.Addr() + recvBase + 8*1024, Len: 1024, LKey: mr.LKey}}))
			copy(mem[16*1024:], "reply")
			posted, err := b.PostRecvSend(recvs[:4], []SendWR{{WRID: 300, Addr: mr.Addr() + 16*1024, Len: 5, LKey: mr.LKey,
				Opcode: OpSend, Flags: SendSignaled}})
			must(t, err)
			if !posted {
				t.Fatal("PostRecvSend: receives not posted")
			}
			seen := map[uint64]bool{}
			for !seen[200] || !seen[300] {
				n, err := cq.Poll(wcs)
				must(t, err)
				for _, wc := range wcs[:n] {
					must(t, wc.Err())
					seen[wc.WRID] = true
				}
			}
			if !bytes.Equal(mem[recvBase+8*1024:recvBase+8*1024+5], []byte("reply")) {
				t.Fatal("reply not received")
			}

			// Arm the CQ: no event before a completion, one after (the
			// channel's fd is non-blocking: GetEvent never waits).
			must(t, cq.ReqNotify())
			if ok, err := ch.GetEvent(); err != nil || ok {
				t.Fatalf("GetEvent before any completion: %v, %v; want none", ok, err)
			}
			copy(mem[17*1024:], "event")
			must(t, a.PostSend([]SendWR{{WRID: 500, Addr: mr.Addr() + 17*1024, Len: 5, LKey: mr.LKey, Opcode: OpSend, Flags: SendSignaled}}))
			awaitEvent(t, ch, "the first armed completion")
			deadline := time.Now().Add(10 * time.Second)
			cq.GotEvent()
			sent, got104 := false, false // b's receive is 104, the first of its first batch left
			for !sent || !got104 {
				n, err := cq.Poll(wcs)
				must(t, err)
				for _, wc := range wcs[:n] {
					must(t, wc.Err())
					sent = sent || wc.WRID == 500
					got104 = got104 || wc.WRID == 104 && bytes.Equal(mem[recvBase+4*1024:recvBase+4*1024+5], []byte("event"))
				}
				if time.Now().After(deadline) {
					t.Fatalf("completions within 10 s: send %v, receive %v", sent, got104)
				}
			}
			if ok, err := ch.GetEvent(); err != nil || ok {
				t.Fatalf("GetEvent with the CQ not armed again: %v, %v; want none", ok, err)
			}

			// 64 more armed completions: the 64th event received is
			// acknowledged in a batch (GotEvent's call); the one left is
			// acknowledged by Close, whose ibv_destroy_cq would wait for
			// ever on a miscounted acknowledgement.
			for i := range 64 {
				must(t, cq.ReqNotify())
				must(t, b.PostRecv([]RecvWR{{WRID: uint64(600 + i), Addr: mr.Addr() + recvBase + 9*1024, Len: 1024, LKey: mr.LKey}}))
				must(t, a.PostSend([]SendWR{{WRID: uint64(700 + i), Addr: mr.Addr() + 17*1024, Len: 5, LKey: mr.LKey, Opcode: OpSend, Flags: SendSignaled}}))
				awaitEvent(t, ch, fmt.Sprintf("event %d", i))
				deadline := time.Now().Add(10 * time.Second)
				cq.GotEvent()
				for left := 2; left > 0; { // the send's and a receive's (b's oldest)
					n, err := cq.Poll(wcs)
					must(t, err)
					for _, wc := range wcs[:n] {
						must(t, wc.Err())
						left--
					}
					if time.Now().After(deadline) {
						t.Fatalf("round %d: %d completions missing after 10 s", i, left)
					}
				}
			}
			if cq.unack != 1 {
				t.Fatalf("%d events unacknowledged after 65, want 1 (64 acknowledged in one batch)", cq.unack)
			}

			// A batch the provider refuses part of: two sends, then an
			// inline one larger than the QP's inline limit (0 here). The
			// first two go out (the peer has receives for them), the error
			// names the call, the first request not posted and the errno.
			more := []SendWR{
				{WRID: 400, Addr: mr.Addr(), Len: 1, LKey: mr.LKey, Opcode: OpSend},
				{WRID: 401, Addr: mr.Addr(), Len: 1, LKey: mr.LKey, Opcode: OpSend},
				{WRID: 402, Addr: mr.Addr(), Len: 1024, LKey: mr.LKey, Opcode: OpSend, Flags: SendInline},
			}
			err = a.PostSend(more)
			if err == nil {
				t.Fatal("an inline send above the QP's inline limit was accepted")
			}
			var errno syscall.Errno
			if !errors.As(err, &errno) || errno == 0 || !strings.Contains(err.Error(), "request 2 of the batch") {
				t.Fatalf("post error %v: want an errno and request 2 named", err)
			}
			t.Logf("refused as expected: %v", err)
		})
	}
}

// awaitEvent takes the event a completion on an armed CQ raises, polling
// the non-blocking channel for up to 10 s.
func awaitEvent(t *testing.T, ch *CompChannel, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, err := ch.GetEvent()
		must(t, err)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no CQ event within 10 s of a completion on the armed CQ", what)
		}
		time.Sleep(time.Millisecond)
	}
}
