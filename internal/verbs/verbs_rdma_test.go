//go:build linux && cgo

package verbs

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/verbline/rdma/internal/rdmatest"
)

// openTestDevice opens the test device, closed at the test's end, and
// queries its attributes.
func openTestDevice(t testing.TB) (*Context, *DeviceAttr) {
	t.Helper()
	ctx, err := OpenDevice(rdmatest.Require(t).Device)
	must(t, err)
	t.Cleanup(func() { ctx.Close() })
	dev, err := ctx.QueryDevice()
	must(t, err)
	return ctx, dev
}

// connectsByHand reports whether the test device's QPs can be connected
// without rdma_cm, as this package's pair tests do (InfiniBand and RoCE:
// an address vector to the port's own GID). An iWARP device has no such
// GID (its connections are TCP connections the CM makes): there it checks
// that the address has no RoCE v2 GID and the test has nothing to run.
func connectsByHand(t *testing.T) bool {
	t.Helper()
	env := rdmatest.Require(t)
	ctx, dev := openTestDevice(t)
	if dev.Transport != TransportIWARP {
		return true
	}
	port, err := ctx.QueryPort(1)
	must(t, err)
	must(t, ctx.QueryGIDs(port))
	if gid := port.GIDIndexFor(net.ParseIP(env.Addr), GIDTypeRoCEv2); gid >= 0 {
		t.Fatalf("iWARP device %s has a RoCE v2 GID (index %d) for %s", env.Device, gid, env.Addr)
	}
	t.Logf("%s is iWARP: its QPs connect only through rdma_cm (internal/rdmacm's and the root package's tests run there)", env.Device)
	return false
}

// testDevice opens the test device and finds the RoCE v2 GID of RDMA_TEST_ADDR.
func testDevice(t testing.TB) (*Context, *Port, *DeviceAttr, int) {
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

func must(t testing.TB, err error) {
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
func connectPair(t testing.TB, typ QPType, port *Port, lim PortLimits, gid int, a, b *QP) {
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
			if typ == QPTypeRC {
				init.AccessFlags |= AccessRemoteRead // UC has no reads
			}
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
			if !connectsByHand(t) {
				return
			}
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

// TestUDPair brings up a UD pair (qkey, no destination in the QP) and sends
// through an AH, with the posts as fast calls and through cgo.
func TestUDPair(t *testing.T) {
	if !connectsByHand(t) {
		return
	}
	for _, fast := range []bool{true, false} {
		t.Run(map[bool]string{true: "fast", false: "cgo"}[fast], func(t *testing.T) {
			old := SetFastCalls(fast)
			defer SetFastCalls(old)
			testUDPair(t)
		})
	}
}

func testUDPair(t *testing.T) {
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
	a, err := pd.CreateUDQP(cfg) // two scatter/gather entries a request, as a PacketConn's
	must(t, err)
	defer a.Close()
	b, err := pd.CreateUDQP(cfg)
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

	// The PacketConn's form: a header and a payload in two scatter/gather
	// entries each way (PostSendUDs, PostRecvUDs).
	copy(mem[1024:], "HDR12345")
	copy(mem[2048:], "payload!")
	must(t, b.PostRecvUDs([]UDRecvWR{{WRID: 4, HdrAddr: mr.Addr() + 6144, HdrLen: 48, HdrLKey: mr.LKey,
		Addr: mr.Addr() + 7168, Len: 1024, LKey: mr.LKey}}))
	wr := UDSendWR{WRID: 3, HdrAddr: mr.Addr() + 1024, HdrLen: 8, HdrLKey: mr.LKey, Addr: mr.Addr() + 2048, Len: 8, LKey: mr.LKey,
		Flags: SendSignaled, RemoteQPN: b.Num, QKey: 0x11111111}
	wr.SetAH(ah)
	must(t, a.PostSendUDs([]UDSendWR{wr}))
	got = map[uint64]WC{}
	for len(got) < 2 {
		wc := pollOne(t, cq)
		must(t, wc.Err())
		got[wc.WRID] = wc
	}
	if r := got[4]; r.ByteLen != 40+16 || string(mem[6144+40:6144+48]) != "HDR12345" || string(mem[7168:7176]) != "payload!" {
		t.Fatalf("UD receive %+v: header %q, payload %q", r, mem[6144+40:6144+48], mem[7168:7176])
	}
}

func TestNoSuchDevice(t *testing.T) {
	rdmatest.Require(t)
	if _, err := OpenDevice("no-such-device"); err == nil {
		t.Fatal("opening a missing device succeeded")
	}
}

// TestMemoryWindowType2 checks what the rendezvous path relies on: a type 2
// window bound to a sub-range of an MR (registered for local access and
// binding only) lets the peer RDMA READ exactly that range through this QP;
// an access outside it, or with the key of an invalidated binding, fails at
// the initiator; an invalidated window binds again under a new key.
func TestMemoryWindowType2(t *testing.T) {
	if !windowsOnDevice(t) || !connectsByHand(t) {
		return
	}
	ctx, port, dev, gid := testDevice(t)
	if !dev.MemWindow2 {
		t.Fatalf("device reports no type 2 memory windows (max_mw %d)", dev.MaxMW)
	}
	lim := port.Limits(dev)
	pd, err := ctx.AllocPD()
	must(t, err)
	defer pd.Close()
	mem := mmapBuf(t, 3*4096)
	for i := range mem {
		mem[i] = byte(i / 4096) // page 0: 0s, page 1: 1s, page 2: 2s
	}
	mr, err := pd.RegMR(mem, AccessLocalWrite|AccessMWBind)
	must(t, err)
	defer mr.Close()
	cq, err := ctx.CreateCQ(32, nil)
	must(t, err)
	defer cq.Close()

	pair := func() (owner, reader *QP) {
		cfg := QPConfig{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, SendWR: 8, RecvWR: 4}
		a, err := pd.CreateQP(cfg)
		must(t, err)
		t.Cleanup(func() { a.Close() })
		b, err := pd.CreateQP(cfg)
		must(t, err)
		t.Cleanup(func() { b.Close() })
		connectPair(t, QPTypeRC, port, lim, gid, a, b)
		return a, b
	}
	local := mmapBuf(t, 4096)
	lmr, err := pd.RegMR(local, AccessLocalWrite)
	must(t, err)
	defer lmr.Close()
	read := func(q *QP, wrid, addr uint64, n int, rkey uint32) WC {
		clear(local)
		must(t, q.PostSend([]SendWR{{WRID: wrid, Addr: lmr.Addr(), Len: uint32(n), LKey: lmr.LKey,
			Opcode: OpRDMARead, Flags: SendSignaled, RemoteAddr: addr, RKey: rkey}}))
		return pollOne(t, cq)
	}
	expectOK := func(wc WC, want byte, n int) {
		t.Helper()
		must(t, wc.Err())
		for i := 0; i < n; i++ {
			if local[i] != want {
				t.Fatalf("byte %d read through the window is %d, want %d", i, local[i], want)
			}
		}
	}

	a, b := pair()
	mw, err := pd.AllocMW()
	must(t, err)
	defer mw.Close()
	page1 := mr.Addr() + 4096
	rkey, err := a.PostBindMW(10, mw, mr, page1, 4096, AccessRemoteRead)
	must(t, err)
	if wc := pollOne(t, cq); wc.Err() != nil || wc.Opcode != WCBindMW || wc.WRID != 10 {
		t.Fatalf("bind completion %+v (%v)", wc, wc.Err())
	}
	if rkey == mr.RKey || rkey != mw.RKey() {
		t.Fatalf("bind returned rkey 0x%x (window says 0x%x, MR 0x%x)", rkey, mw.RKey(), mr.RKey)
	}
	expectOK(read(b, 11, page1, 4096, rkey), 1, 4096)

	// Revoke, rebind to page 2 under a new key; the new key reads page 2.
	must(t, a.PostSend([]SendWR{{WRID: 12, Opcode: OpLocalInv, Flags: SendSignaled, RKey: rkey}}))
	if wc := pollOne(t, cq); wc.Err() != nil || wc.Opcode != WCLocalInv {
		t.Fatalf("local invalidate completion %+v (%v)", wc, wc.Err())
	}
	rkey2, err := a.PostBindMW(13, mw, mr, page1+4096, 4096, AccessRemoteRead)
	must(t, err)
	wc := pollOne(t, cq)
	must(t, wc.Err())
	if rkey2 == rkey {
		t.Fatalf("rebind kept rkey 0x%x", rkey)
	}
	expectOK(read(b, 14, page1+4096, 100, rkey2), 2, 100)

	// A bind and the send announcing its key in one post list, one
	// doorbell: the bind unsignaled, retired by the send's completion.
	must(t, a.PostSend([]SendWR{{WRID: 30, Opcode: OpLocalInv, Flags: SendSignaled, RKey: rkey2}}))
	if wc := pollOne(t, cq); wc.Err() != nil || wc.WRID != 30 {
		t.Fatalf("local invalidate completion %+v (%v)", wc, wc.Err())
	}
	note := mmapBuf(t, 4096)
	nmr, err := pd.RegMR(note, AccessLocalWrite)
	must(t, err)
	defer nmr.Close()
	must(t, b.PostRecv([]RecvWR{{WRID: 31, Addr: lmr.Addr(), Len: 64, LKey: lmr.LKey}}))
	rkey4 := mw.NextRKey()
	binary.LittleEndian.PutUint32(note, rkey4)
	before := a.PostCounts()
	if _, err := a.PostBindSend(nil, &BindWR{WRID: 32, MW: mw, MR: mr, Addr: page1, Len: 4096, Access: AccessRemoteRead, RKey: rkey4},
		[]SendWR{{WRID: 33, Addr: nmr.Addr(), Len: 4, LKey: nmr.LKey, Opcode: OpSend, Flags: SendSignaled}}); err != nil {
		t.Fatal(err)
	}
	after := a.PostCounts()
	if d := (PostCounts{SendPosts: after.SendPosts - before.SendPosts, SendWRs: after.SendWRs - before.SendWRs,
		Signaled: after.Signaled - before.Signaled}); d != (PostCounts{SendPosts: 1, SendWRs: 2, Signaled: 1}) {
		t.Errorf("bind+send post list counted as %+v, want 1 doorbell, 2 requests, 1 signaled", d)
	}
	if mw.RKey() != rkey4 || rkey4 == rkey2 {
		t.Fatalf("window key 0x%x after the post list, want 0x%x (was 0x%x)", mw.RKey(), rkey4, rkey2)
	}
	for range 2 { // the send's completion (not the bind's: unsignaled) and the receive, in either order
		switch wc := pollOne(t, cq); {
		case wc.Err() != nil:
			t.Fatalf("completion %+v: %v", wc, wc.Err())
		case wc.WRID == 31:
			if got := binary.LittleEndian.Uint32(local); got != rkey4 {
				t.Fatalf("announced key 0x%x, want 0x%x", got, rkey4)
			}
		case wc.WRID != 33:
			t.Fatalf("unexpected completion %+v (the unsignaled bind's?)", wc)
		}
	}
	expectOK(read(b, 34, page1, 4096, rkey4), 1, 4096)
	must(t, a.PostSend([]SendWR{{WRID: 35, Opcode: OpLocalInv, Flags: SendSignaled, RKey: rkey4}}))
	if wc := pollOne(t, cq); wc.Err() != nil || wc.WRID != 35 {
		t.Fatalf("local invalidate completion %+v (%v)", wc, wc.Err())
	}

	// The old keys are dead: the read fails at the initiator.
	if wc := read(b, 15, page1, 8, rkey); wc.Status != WCRemAccessErr {
		t.Fatalf("read with an invalidated key: %+v, want remote access error", wc)
	}

	// Outside the bound range: hardware refuses a byte past the window.
	// Soft-RoCE in Linux 6.1 checks a window's key, QP and rights but
	// bounds the access by the underlying MR only (observed here), so on
	// it a read past the window but inside the MR succeeds; past the MR it
	// fails. Fresh pair: a failed read puts the reader's QP in error.
	a2, b2 := pair()
	mw2, err := pd.AllocMW()
	must(t, err)
	defer mw2.Close()
	rkey3, err := a2.PostBindMW(20, mw2, mr, page1, 4096, AccessRemoteRead)
	must(t, err)
	wc = pollOne(t, cq)
	must(t, wc.Err())
	wc = read(b2, 21, page1+4096-8, 9, rkey3)
	switch wc.Status {
	case WCRemAccessErr:
		return // bounds enforced by the window
	case WCSuccess:
		t.Logf("%s does not bound window accesses inside the MR (a read 1 byte past the window succeeded)", rdmatest.Require(t).Device)
	default:
		t.Fatalf("read one byte past the window: %+v", wc)
	}
	if wc := read(b2, 22, mr.Addr()+uint64(len(mem))-8, 9, rkey3); wc.Status != WCRemAccessErr {
		t.Fatalf("read one byte past the MR through the window: %+v, want remote access error", wc)
	}
}

// windowsOnDevice reports whether the test device has type 2 memory
// windows; where it has none it checks that a window is refused.
func windowsOnDevice(t *testing.T) bool {
	t.Helper()
	env := rdmatest.Require(t)
	ctx, dev := openTestDevice(t)
	if dev.MemWindow2 {
		return true
	}
	pd, err := ctx.AllocPD()
	must(t, err)
	defer pd.Close()
	if mw, err := pd.AllocMW(); err == nil {
		mw.Close()
		t.Fatalf("%s reports no type 2 memory windows (max_mw %d) but allocated one", env.Device, dev.MaxMW)
	}
	t.Logf("%s has no type 2 memory windows: a window is refused", env.Device)
	return false
}
