//go:build linux && cgo

package verbs

import (
	"bytes"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gordma/rdma/internal/rdmatest"
)

// testDevice opens the test device and finds the RoCE v2 GID of RDMA_TEST_ADDR.
func testDevice(t *testing.T) (*Context, *Port, *DeviceAttr, int) {
	env := rdmatest.Require(t)
	ctx, err := OpenDevice(env.Device)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	port, err := ctx.QueryPort(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctx.QueryGIDs(port); err != nil {
		t.Fatal(err)
	}
	if port.State != PortActive {
		t.Fatalf("port %s/1 is %s, want ACTIVE", env.Device, port.State)
	}
	dev, err := ctx.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	gid := port.GIDIndexFor(net.ParseIP(env.Addr), GIDTypeRoCEv2)
	if gid < 0 {
		t.Fatalf("no RoCE v2 GID for %s on %s/1 (GIDs %+v)", env.Addr, env.Device, port.GIDs)
	}
	return ctx, port, dev, gid
}

func mmapBuf(t *testing.T, n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// pollOne polls cq until one completion arrives or the (scaled) timeout passes.
func pollOne(t *testing.T, cq *CQ) WC {
	t.Helper()
	wcs := make([]WC, 1)
	deadline := time.Now().Add(rdmatest.Scale(5 * time.Second))
	for time.Now().Before(deadline) {
		n, err := cq.Poll(wcs)
		must(t, err)
		if n == 1 {
			return wcs[0]
		}
	}
	t.Fatal("no completion before the deadline")
	return WC{}
}

// connectPair takes a and b through RESET->INIT->RTR->RTS against each other
// via the validated table, the way a connection manager would.
func connectPair(t *testing.T, typ QPType, port *Port, lim PortLimits, gid int, a, b *QP) {
	t.Helper()
	var dgid [16]byte
	for _, g := range port.GIDs {
		if g.Index == gid {
			dgid = g.Raw
		}
	}
	for _, p := range [][2]*QP{{a, b}, {b, a}} {
		q, peer := p[0], p[1]
		init := &QPAttr{State: StateInit, PortNum: 1, PKeyIndex: 0}
		mask := AttrState | AttrPKeyIndex | AttrPort
		if typ == QPTypeUD {
			init.QKey = 0x11111111
			mask |= AttrQKey
		} else {
			init.AccessFlags = AccessLocalWrite | AccessRemoteWrite
			mask |= AttrAccessFlags
		}
		must(t, q.Modify(init, mask, lim))
		rtr := &QPAttr{State: StateRTR}
		mask = AttrState
		if typ != QPTypeUD {
			rtr.PathMTU = port.ActiveMTU
			rtr.DestQPN = peer.Num
			rtr.RQPSN = 0x123456
			rtr.AH = AHAttr{IsGlobal: true, DGID: dgid, SGIDIndex: uint8(gid), HopLimit: 64, PortNum: 1}
			mask |= AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN
			if typ == QPTypeRC {
				rtr.MaxDestRdAtomic, rtr.MinRNRTimer = 1, 12
				mask |= AttrMaxDestRdAtomic | AttrMinRNRTimer
			}
		}
		must(t, q.Modify(rtr, mask, lim))
		rts := &QPAttr{State: StateRTS, SQPSN: 0x123456}
		mask = AttrState | AttrSQPSN
		if typ == QPTypeRC {
			rts.Timeout, rts.RetryCnt, rts.RNRRetry, rts.MaxRdAtomic = 14, 7, 7, 1
			mask |= AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic
		}
		must(t, q.Modify(rts, mask, lim))
		if s, err := q.Query(); err != nil || s != StateRTS {
			t.Fatalf("QP 0x%x: device says %v (%v), want RTS", q.Num, s, err)
		}
	}
}

// TestQPPairSendRecv brings up RC and UC pairs for real and moves one message.
func TestQPPairSendRecv(t *testing.T) {
	for _, typ := range []QPType{QPTypeRC, QPTypeUC} {
		t.Run(typ.String(), func(t *testing.T) {
			ctx, port, dev, gid := testDevice(t)
			lim := port.Limits(dev)
			pd, err := ctx.AllocPD()
			must(t, err)
			defer pd.Close()
			mem := mmapBuf(t, 8192)
			mr, err := pd.RegMR(mem, AccessLocalWrite|AccessRemoteWrite)
			must(t, err)
			defer mr.Close()
			cq, err := ctx.CreateCQ(16, nil)
			must(t, err)
			defer cq.Close()
			cfg := QPConfig{Type: typ, SendCQ: cq, RecvCQ: cq, SendWR: 4, RecvWR: 4}
			a, err := pd.CreateQP(cfg)
			must(t, err)
			defer a.Close()
			b, err := pd.CreateQP(cfg)
			must(t, err)
			defer b.Close()

			// The table refuses a skipped state before the kernel sees it.
			if err := a.Modify(&QPAttr{State: StateRTS}, AttrState|AttrSQPSN, lim); err == nil {
				t.Fatal("RESET->RTS was accepted")
			}
			connectPair(t, typ, port, lim, gid, a, b)

			msg := []byte("hello over " + typ.String())
			copy(mem, msg)
			must(t, b.PostRecv([]RecvWR{{WRID: 2, Addr: mr.Addr() + 4096, Len: 4096, LKey: mr.LKey}}))
			must(t, a.PostSend([]SendWR{{WRID: 1, Addr: mr.Addr(), Len: uint32(len(msg)), LKey: mr.LKey,
				Opcode: OpSendWithImm, Flags: SendSignaled, Imm: 0xabcdef}}))
			got := map[uint64]WC{}
			for len(got) < 2 {
				wc := pollOne(t, cq)
				must(t, wc.Err())
				got[wc.WRID] = wc
			}
			r := got[2]
			if r.Opcode != WCRecv || r.ByteLen != uint32(len(msg)) || !r.HasImm() || r.Imm != 0xabcdef {
				t.Fatalf("receive completion %+v", r)
			}
			if !bytes.Equal(mem[4096:4096+len(msg)], msg) {
				t.Fatalf("received %q, want %q", mem[4096:4096+len(msg)], msg)
			}
			// A QP can always be sent to ERR and back to RESET.
			must(t, a.Modify(&QPAttr{State: StateErr}, AttrState, lim))
			must(t, a.Modify(&QPAttr{State: StateReset}, AttrState, lim))
		})
	}
}

// TestUDPair brings up a UD pair (qkey, no destination in the QP) and sends through an AH.
func TestUDPair(t *testing.T) {
	ctx, port, dev, gid := testDevice(t)
	lim := port.Limits(dev)
	pd, err := ctx.AllocPD()
	must(t, err)
	defer pd.Close()
	mem := mmapBuf(t, 8192)
	mr, err := pd.RegMR(mem, AccessLocalWrite)
	must(t, err)
	defer mr.Close()
	cq, err := ctx.CreateCQ(16, nil)
	must(t, err)
	defer cq.Close()
	cfg := QPConfig{Type: QPTypeUD, SendCQ: cq, RecvCQ: cq, SendWR: 4, RecvWR: 4}
	a, err := pd.CreateQP(cfg)
	must(t, err)
	defer a.Close()
	b, err := pd.CreateQP(cfg)
	must(t, err)
	defer b.Close()
	connectPair(t, QPTypeUD, port, lim, gid, a, b)
	var dgid [16]byte
	for _, g := range port.GIDs {
		if g.Index == gid {
			dgid = g.Raw
		}
	}
	ah, err := pd.CreateAH(&AHAttr{IsGlobal: true, DGID: dgid, SGIDIndex: uint8(gid), HopLimit: 64, PortNum: 1})
	must(t, err)
	defer ah.Close()
	msg := []byte("datagram")
	copy(mem, msg)
	// UD receives start with a 40-byte GRH.
	must(t, b.PostRecv([]RecvWR{{WRID: 2, Addr: mr.Addr() + 4096, Len: 4096, LKey: mr.LKey}}))
	must(t, a.PostSendUD(ah, b.Num, 0x11111111, 1, mr.Addr(), uint32(len(msg)), mr.LKey))
	got := map[uint64]WC{}
	for len(got) < 2 {
		wc := pollOne(t, cq)
		must(t, wc.Err())
		got[wc.WRID] = wc
	}
	if r := got[2]; r.ByteLen != uint32(40+len(msg)) || !bytes.Equal(mem[4096+40:4096+40+len(msg)], msg) {
		t.Fatalf("UD receive %+v, payload %q", r, mem[4096+40:4096+40+len(msg)])
	}
}

func TestNoSuchDevice(t *testing.T) {
	rdmatest.Require(t)
	if _, err := OpenDevice("no-such-device"); err == nil {
		t.Fatal("opening a missing device succeeded")
	}
}
