//go:build linux && cgo

package verbs

/*
#include <infiniband/verbs.h>
*/
import "C"

import "sync"

// MW is a type 2 memory window: remote access to a sub-range of an MR that
// is granted through a QP's send queue (PostBindMW, PostBindSend), is valid only on that
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

// NextRKey is the key the window's next bind gives it: its current key with
// the low byte (the key's consumer-owned "key" part) incremented, as
// ibv_inc_rkey computes it. A bind names the key it assigns, and a caller
// that announces the key in the same post list needs it before posting.
func (m *MW) NextRKey() uint32 {
	r := m.RKey()
	return r&^0xff | (r+1)&0xff
}

// BindWR binds a type 2 memory window to [Addr, Addr+Len) of an MR (registered
// with AccessMWBind) with the given remote rights, under the key RKey
// (MW.NextRKey). The window must be free (new, or invalidated): a bound type
// 2 window cannot be rebound. Work requests posted after the bind on this
// QP see it done.
type BindWR struct {
	WRID   uint64
	Flags  uint32 // SendSignaled
	MW     *MW
	MR     *MR
	Addr   uint64
	Len    uint64
	Access AccessFlags
	RKey   uint32
}

// PostBindMW posts a signaled bind of [addr, addr+length) of mr to mw with
// the given remote rights on its own, and returns the window's new rkey for
// the peer (see BindWR).
func (q *QP) PostBindMW(wrid uint64, mw *MW, mr *MR, addr, length uint64, access AccessFlags) (uint32, error) {
	rkey := mw.NextRKey()
	if _, err := q.PostBindSend(nil, &BindWR{WRID: wrid, Flags: SendSignaled, MW: mw, MR: mr,
		Addr: addr, Len: length, Access: access, RKey: rkey}, nil); err != nil {
		return 0, err
	}
	return rkey, nil
}
