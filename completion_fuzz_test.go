//go:build linux && cgo

package rdma

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// withImmFlag is IBV_WC_WITH_IMM.
const withImmFlag = 2

// FuzzRecvCompletion drives the decision recvLocked makes for a received
// send (admitRecvLocked: classifyRecv, then credits and allowances) on a
// Conn with no device (its QP already down, so a failure only records its
// error): kind x length x credits x state. The input's first 5 bytes are
// the state (bit 0 of the first: the control reserve negotiated, bit 1:
// the connection uses trailers; then the credits this side holds and the
// peer's credits, 2 bytes each); then records of 9 bytes: flags (bit 0 the
// completion has an immediate, bit 1 the peer's FIN arrived, bit 2
// messages ended), the header, the length. With trailers the header is
// written as the trailer at the end of the received bytes (where they fit
// the receive) and the immediate flag means nothing.
// Invariants: no panic; a completion fails the connection, with an error
// matching ErrProtocol, exactly when it is malformed (no header, an
// unknown kind, more bytes than a receive holds, fewer than a trailer, a
// notify without trailers, a credit update with no credit) or beyond what
// the peer may do (a credit it does not hold, credits beyond the largest
// window, probes beyond their allowance); the credits this side holds
// never exceed maxWindow and the peer's never go below zero; what is
// delivered has a length within the receive, less the trailer.
func FuzzRecvCompletion(f *testing.F) {
	if !(&verbs.WC{Flags: withImmFlag}).HasImm() {
		f.Fatal("IBV_WC_WITH_IMM is not withImmFlag")
	}
	rec := func(flags byte, kind wire.Kind, credits, n uint32) []byte {
		b := []byte{flags}
		b = binary.BigEndian.AppendUint32(b, uint32(kind)<<24|credits&wire.MaxImmCredits)
		return binary.BigEndian.AppendUint32(b, n)
	}
	state := func(reserve bool, credits, peer uint16) []byte {
		b := []byte{0}
		if reserve {
			b[0] = 1
		}
		if trailers := peer&0x8000 != 0; trailers {
			b[0] |= 2
			peer &^= 0x8000
		}
		b = binary.BigEndian.AppendUint16(b, credits)
		return binary.BigEndian.AppendUint16(b, peer)
	}
	cat := func(bs ...[]byte) []byte {
		var out []byte
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	f.Add(cat(state(true, 0, 16), rec(1, wire.KindData, 1, 100), rec(1, wire.KindMessage, 0, 4096), rec(1, wire.KindFIN, 0, 0)))
	f.Add(cat(state(true, 0, 16), rec(1, wire.KindCredit, 0, 0)))                                    // a credit update with no credit
	f.Add(cat(state(true, maxWindow-1, 16), rec(1, wire.KindCredit, 2, 0)))                          // beyond the largest window
	f.Add(cat(state(false, 0, 16), rec(1, wire.KindData, wire.MaxImmCredits, 10)))                   // 2^24-1 credits at once
	f.Add(cat(state(true, 0, 0), rec(1, wire.KindMessage, 0, 10)))                                   // beyond the peer's credits
	f.Add(cat(state(true, 0, 16), rec(0, wire.KindData, 0, 10)))                                     // no immediate
	f.Add(cat(state(true, 0, 16), rec(1, 7, 0, 10), rec(1, 0xff, 0, 10)))                            // unknown kinds
	f.Add(cat(state(true, 0, 16), rec(1, wire.KindData, 0, 4097)))                                   // more than a receive holds
	f.Add(cat(state(true, 0, 16), rec(3, wire.KindData, 0, 10), rec(5, wire.KindRendezvous, 0, 32))) // after the end
	f.Add(cat(state(true, 0, 16), rec(1, wire.KindRendezvousDone, 5, 0), rec(1, wire.KindData, 0, 0)))
	var probes [][]byte
	for range 20 {
		probes = append(probes, rec(1, wire.KindKeepalive, 0, 0))
	}
	f.Add(cat(append([][]byte{state(true, 0, 16)}, probes...)...)) // probes beyond the burst
	const withTrailers = 0x8000                                    // in state's peer argument
	f.Add(cat(state(true, 0, 16|withTrailers), rec(0, wire.KindData, 1, 100), rec(0, wire.KindMessage, 0, 4096), rec(0, wire.KindFIN, 0, 4)))
	f.Add(cat(state(true, 0, 16|withTrailers), rec(0, wire.KindNotify, 0, 12), rec(0, wire.KindCredit, 1, 4)))
	f.Add(cat(state(true, 0, 16|withTrailers), rec(0, wire.KindData, 0, 3)))    // shorter than a trailer
	f.Add(cat(state(true, 0, 16), rec(1, wire.KindNotify, 0, 8)))               // a notify without trailers
	f.Add(cat(state(true, 0, 16|withTrailers), rec(0, wire.KindData, 0, 4097))) // more than a receive holds
	const (
		room  = 4096
		nRecv = 8
		burst = nRecv + 2 // controlAllowedLocked's
	)
	pool, err := buffer.NewPool(nil, buffer.Options{})
	if err != nil {
		f.Fatal(err)
	}
	recv := make([]buffer.Buf, nRecv)
	for i := range recv {
		if recv[i], err = pool.Get(room); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		st := make([]byte, 5)
		data = data[copy(st, data):]
		c := &engine{qpDown: true, ep: &endpoint{bufSize: room, recv: recv}}
		if st[0]&1 != 0 {
			c.features |= wire.FeatureControlReserve
		}
		c.trailers = st[0]&2 != 0
		c.win.size = 16
		c.stream.credits = int(binary.BigEndian.Uint16(st[1:])) % (maxWindow + 1)
		c.win.peerCredits = int(binary.BigEndian.Uint16(st[3:])) % (c.win.size + 1)
		probes := 0
		for step := 0; len(data) > 0 && step < 256; step++ {
			r := make([]byte, 9)
			data = data[copy(r, data):]
			wc := verbs.WC{Status: verbs.WCSuccess, Imm: binary.BigEndian.Uint32(r[1:]), ByteLen: binary.BigEndian.Uint32(r[5:])}
			hasImm := r[0]&1 != 0
			if hasImm {
				wc.Flags = withImmFlag
			}
			n, limit := wc.ByteLen, uint32(room) // the payload's length and its limit
			short := false                       // fewer bytes than a trailer
			if c.trailers {
				idx := step % nRecv
				if wc.ByteLen >= wire.TrailerLen && wc.ByteLen <= room {
					wire.PutTrailer(recv[idx].Full()[wc.ByteLen-wire.TrailerLen:wc.ByteLen], wc.Imm)
				}
				hasImm, short = true, wc.ByteLen < wire.TrailerLen
				n, limit = wc.ByteLen-wire.TrailerLen, room-wire.TrailerLen
				wc.WRID = uint64(idx)
			}
			c.stream.eof, c.msgs.closed = r[0]&2 != 0, r[0]&4 != 0
			kind, credits := wire.Kind(wc.Imm>>24), wc.Imm&wire.MaxImmCredits
			reserve := c.features&wire.FeatureControlReserve != 0
			control := reserve && (kind == wire.KindCredit || kind == wire.KindKeepalive)
			spends := !control && kind != wire.KindRendezvousDone
			malformed := short || !hasImm || kind > wire.KindNotify || wc.ByteLen > room ||
				kind == wire.KindNotify && !c.trailers
			beyond := (control && kind == wire.KindCredit && credits == 0) ||
				(spends && c.win.peerCredits == 0) ||
				(kind != wire.KindRendezvousDone && c.stream.credits+int(credits) > maxWindow)
			allowance := false
			if !malformed && control && kind == wire.KindKeepalive {
				probes++
				allowance = probes > burst
			}
			credits0, peer0 := c.stream.credits, c.win.peerCredits
			got, gotN, act := c.admitRecvLocked(&wc, int(wc.WRID))
			if act == rxFailed {
				if !malformed && !beyond && !allowance {
					t.Fatalf("step %d: kind %d, %d credits, %d bytes (reserve %v, eof %v, holding %d, peer %d): failed: %v",
						step, kind, credits, wc.ByteLen, reserve, c.stream.eof, credits0, peer0, c.stream.rerr)
				}
				if !errors.Is(c.stream.rerr, ErrProtocol) {
					t.Fatalf("step %d: failed with %v, not ErrProtocol", step, c.stream.rerr)
				}
				return // the connection is down: no more completions but flushed ones
			}
			if malformed || beyond {
				t.Fatalf("step %d: kind %d, %d credits, %d bytes (no immediate %v, holding %d, peer %d) accepted as %d",
					step, kind, credits, wc.ByteLen, !hasImm, credits0, peer0, act)
			}
			if c.stream.rerr != nil || c.stream.credits > maxWindow || c.win.peerCredits < 0 {
				t.Fatalf("step %d: error %v, credits %d, peer's credits %d", step, c.stream.rerr, c.stream.credits, c.win.peerCredits)
			}
			wantCredits, wantPeer := credits0+int(credits), peer0
			if kind == wire.KindRendezvousDone {
				wantCredits = credits0
			}
			if spends {
				wantPeer--
			}
			if c.stream.credits != wantCredits || c.win.peerCredits != wantPeer || got != credits || gotN != n {
				t.Fatalf("step %d: kind %d: credits %d -> %d, peer's %d -> %d, payload %d; want %d, %d, %d", step, kind,
					credits0, c.stream.credits, peer0, c.win.peerCredits, gotN, wantCredits, wantPeer, n)
			}
			switch act {
			case rxData:
				if kind != wire.KindData || gotN == 0 || gotN > limit || c.stream.eof {
					t.Fatalf("step %d: data delivered: kind %d, %d bytes, eof %v", step, kind, gotN, c.stream.eof)
				}
			case rxMessage, rxRendezvous:
				if c.stream.eof || c.msgs.closed || gotN > limit {
					t.Fatalf("step %d: message delivered: %d bytes, eof %v, closed %v", step, gotN, c.stream.eof, c.msgs.closed)
				}
			case rxNotify:
				if !c.trailers || kind != wire.KindNotify || c.msgs.closed {
					t.Fatalf("step %d: notify delivered: kind %d, trailers %v, closed %v", step, kind, c.trailers, c.msgs.closed)
				}
			}
		}
	})
}

// TestClassifyNotify: a notify (kind 7) is a write's notification on a
// connection with trailers, and a protocol error on one without; after
// the end of messages it is taken back like any message.
func TestClassifyNotify(t *testing.T) {
	imm := wire.EncodeImm(wire.KindNotify, 3)
	v := rxView{trailers: true, room: 4096 - wire.TrailerLen}
	if kind, credits, act, err := classifyRecv(true, imm, wire.NotifyLen, v); err != nil || act != rxNotify || kind != wire.KindNotify || credits != 3 {
		t.Fatalf("with trailers: %v %d %v %v, want a notify returning 3 credits", kind, credits, act, err)
	}
	v.msgsClosed = true
	if _, _, act, err := classifyRecv(true, imm, wire.NotifyLen, v); err != nil || act != rxRepost {
		t.Fatalf("with trailers, messages ended: %v %v, want it taken back", act, err)
	}
	_, _, act, err := classifyRecv(true, imm, wire.NotifyLen, rxView{room: 4096})
	if act != rxFailed || !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "notify on a connection without trailers") {
		t.Fatalf("without trailers: %v %v, want ErrProtocol naming it", act, err)
	}
}
