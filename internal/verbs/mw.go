//go:build linux && cgo

package verbs

/*
#include <string.h>
#include <infiniband/verbs.h>

// bind_mw posts a bind of [addr, addr+len) of mr to the type 2 window mw,
// under a fresh key (the key byte of the window's rkey, incremented). It
// returns the new rkey, or -errno (no out-parameter: a Go pointer argument
// would make the caller allocate).
static int64_t bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mr *mr, uint64_t wr_id,
		uint64_t addr, uint64_t len, unsigned int access) {
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	uint32_t rkey = ibv_inc_rkey(mw->rkey);
	wr.wr_id = wr_id;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info.mr = mr;
	wr.bind_mw.bind_info.addr = addr;
	wr.bind_mw.bind_info.length = len;
	wr.bind_mw.bind_info.mw_access_flags = access;
	int ret = ibv_post_send(qp, &wr, &bad);
	if (ret) return -(int64_t)(ret > 0 ? ret : -ret);
	// Providers name the window by its current rkey in the next bind
	// (rxe passes it to the kernel, which checks it), as ibv_bind_mw does.
	mw->rkey = rkey;
	return rkey;
}
*/
import "C"

import (
	"fmt"
	"sync"
	"syscall"
)

// MW is a type 2 memory window: remote access to a sub-range of an MR that
// is granted through a QP's send queue (PostBindMW), is valid only on that
// QP, and ends with a local invalidate (OpLocalInv) or Close. Binding needs
// no ibv_reg_mr, so granting and revoking access per transfer is cheap.
type MW struct {
	mu sync.Mutex
	mw *C.struct_ibv_mw
	pd *PD
}

// AllocMW allocates a type 2 window on the PD (the device must report
// DeviceAttr.MemWindow2).
func (p *PD) AllocMW() (*MW, error) {
	mw, err := C.ibv_alloc_mw(p.pd, C.IBV_MW_TYPE_2)
	if mw == nil {
		return nil, errnoErr("ibv_alloc_mw type 2 (does the device support memory windows?)", err, 0)
	}
	return &MW{mw: mw, pd: p}, nil
}

// RKey is the window's current remote key (changes with every bind).
func (m *MW) RKey() uint32 { return uint32(m.mw.rkey) }

// Close deallocates the window, which also ends any remote access through
// it. Idempotent.
func (m *MW) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mw == nil {
		return nil
	}
	if ret := C.ibv_dealloc_mw(m.mw); ret != 0 {
		return errnoErr("ibv_dealloc_mw", nil, ret)
	}
	m.mw = nil
	return nil
}

// PostBindMW posts a signaled bind of [addr, addr+length) of mr (registered
// with AccessMWBind) to mw with the given remote rights, and returns the
// window's new rkey for the peer. The window must be free (new, or
// invalidated): a bound type 2 window cannot be rebound. Work requests
// posted after the bind on this QP see it done.
func (q *QP) PostBindMW(wrid uint64, mw *MW, mr *MR, addr, length uint64, access AccessFlags) (uint32, error) {
	q.posts.Add(1)
	ret := C.bind_mw(q.qp, mw.mw, mr.mr, C.uint64_t(wrid), C.uint64_t(addr), C.uint64_t(length), C.uint(access))
	if ret < 0 {
		return 0, fmt.Errorf("ibv_post_send BIND_MW QP 0x%x: %w", q.Num, syscall.Errno(-ret))
	}
	q.wrsPosted.Add(1)
	return uint32(ret), nil
}
