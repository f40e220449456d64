//go:build linux && cgo

package verbs

/*
#include <infiniband/verbs.h>
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// PD is a protection domain. It keeps its Context alive.
type PD struct {
	mu  sync.Mutex
	pd  *C.struct_ibv_pd
	ctx *Context
}

// AllocPD allocates a protection domain on c.
func (c *Context) AllocPD() (*PD, error) {
	pd, err := C.ibv_alloc_pd(c.ctx)
	if pd == nil {
		return nil, errnoErr("ibv_alloc_pd "+c.name, err, 0)
	}
	return &PD{pd: pd, ctx: c}, nil
}

// Context returns the device the PD belongs to.
func (p *PD) Context() *Context { return p.ctx }

// Close deallocates the PD. Idempotent; fails with EBUSY while MRs or QPs use it.
func (p *PD) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pd == nil {
		return nil
	}
	if ret := C.ibv_dealloc_pd(p.pd); ret != 0 {
		return errnoErr("ibv_dealloc_pd", nil, ret)
	}
	p.pd = nil
	return nil
}

// MR is a registered memory region. It keeps its PD alive.
type MR struct {
	mu   sync.Mutex
	mr   *C.struct_ibv_mr
	pd   *PD
	addr uintptr
	size int
	LKey uint32
	RKey uint32
}

// RegMR registers mem (which must live outside the Go heap, e.g. mmap'd, and
// stay mapped until the MR is closed) with the given access flags.
func (p *PD) RegMR(mem []byte, access AccessFlags) (*MR, error) {
	m := new(MR)
	if err := p.RegMRInto(m, mem, access); err != nil {
		return nil, err
	}
	return m, nil
}

// RegMRInto is RegMR into m, a zero MR or one closed by Close without
// error: a caller registering on its data path reuses its MRs instead of
// allocating one per registration.
func (p *PD) RegMRInto(m *MR, mem []byte, access AccessFlags) error {
	if len(mem) == 0 {
		return fmt.Errorf("ibv_reg_mr: empty buffer")
	}
	addr := unsafe.Pointer(unsafe.SliceData(mem))
	mr, err := C.ibv_reg_mr(p.pd, addr, C.size_t(len(mem)), C.int(access))
	if mr == nil {
		e := errnoErr(fmt.Sprintf("ibv_reg_mr %d bytes", len(mem)), err, 0)
		if isErrno(err, 12) || isErrno(err, 1) { // ENOMEM, EPERM: usually RLIMIT_MEMLOCK
			e = fmt.Errorf("%w (the locked-memory limit is probably too low: raise it with `ulimit -l unlimited` "+
				"or LimitMEMLOCK=infinity in the service unit)", e)
		}
		return e
	}
	m.mu.Lock()
	m.mr, m.pd, m.addr, m.size = mr, p, uintptr(addr), len(mem)
	m.LKey, m.RKey = uint32(mr.lkey), uint32(mr.rkey)
	m.mu.Unlock()
	return nil
}

// Addr is the registered region's start address (for remote access descriptors).
func (m *MR) Addr() uint64 { return uint64(m.addr) }

// Len is the registered length.
func (m *MR) Len() int { return m.size }

// Close deregisters the region. Idempotent.
func (m *MR) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mr == nil {
		return nil
	}
	if ret := C.ibv_dereg_mr(m.mr); ret != 0 {
		return errnoErr("ibv_dereg_mr", nil, ret)
	}
	m.mr = nil
	return nil
}
