package rdma

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/gordma/rdma/buffer"
	"github.com/gordma/rdma/internal/rdmacm"
	"github.com/gordma/rdma/internal/verbs"
)

// endpoint holds one connection's verbs objects. They are created in order
// (PD, completion channel, CQ, QP, arena, MR) and destroyed in reverse.
type endpoint struct {
	ctx    *verbs.Context
	pd     *verbs.PD
	compCh *verbs.CompChannel
	cq     *verbs.CQ
	qp     *verbs.QP
	arena  *buffer.Arena
	mr     *verbs.MR
	lim    verbs.PortLimits

	bufSize, nRecv, nSend int
	sqDepth               int
}

// Work-request ids: the kind in the top bits, a buffer index below.
const (
	wrRecv     = 1 << 32
	wrSendData = 2 << 32
	wrSendCtl  = 3 << 32
	wrKindMask = 0xff << 32
)

// ctlReserve is the send-queue room kept for control messages (credit
// updates, end of stream) beside one entry per send buffer.
const ctlReserve = 8

func newEndpoint(id *rdmacm.ID, cfg *Config) (_ *endpoint, err error) {
	e := &endpoint{bufSize: cfg.BufferSize, nRecv: cfg.RecvBuffers, nSend: cfg.SendBuffers}
	e.sqDepth = e.nSend + ctlReserve
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.ctx, err = id.Context(); err != nil {
		return nil, err
	}
	port, err := e.ctx.QueryPort(id.PortNum())
	if err != nil {
		return nil, err
	}
	dev, err := e.ctx.QueryDevice()
	if err != nil {
		return nil, err
	}
	e.lim = port.Limits(dev)
	if e.pd, err = e.ctx.AllocPD(); err != nil {
		return nil, err
	}
	if e.compCh, err = e.ctx.CreateCompChannel(); err != nil {
		return nil, err
	}
	if e.cq, err = e.ctx.CreateCQ(e.nRecv+e.sqDepth, e.compCh); err != nil {
		return nil, err
	}
	if e.qp, err = e.pd.CreateQP(verbs.QPConfig{Type: verbs.QPTypeRC, SendCQ: e.cq, RecvCQ: e.cq,
		SendWR: e.sqDepth, RecvWR: e.nRecv}); err != nil {
		return nil, err
	}
	if e.arena, err = buffer.NewArena((e.nRecv + e.nSend) * e.bufSize); err != nil {
		return nil, err
	}
	if e.mr, err = e.pd.RegMR(e.arena.Bytes()[:(e.nRecv+e.nSend)*e.bufSize], verbs.AccessLocalWrite); err != nil {
		if errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.EPERM) {
			return nil, fmt.Errorf("%w: %v", ErrMemlock, err)
		}
		return nil, err
	}
	return e, nil
}

// moveQP asks rdma_cm for the attributes of the next state and applies them
// through the validated state table.
func (e *endpoint) moveQP(id *rdmacm.ID, states ...verbs.QPState) error {
	for _, s := range states {
		attr, mask, err := id.InitQPAttr(s)
		if err != nil {
			return err
		}
		if err := e.qp.Modify(&attr, mask, e.lim); err != nil {
			return err
		}
	}
	return nil
}

// toError moves the QP to ERR so every outstanding work request flushes.
func (e *endpoint) toError() error {
	if e.qp.State() == verbs.StateErr || e.qp.State() == verbs.StateReset {
		return nil
	}
	return e.qp.Modify(&verbs.QPAttr{State: verbs.StateErr}, verbs.AttrState, e.lim)
}

func (e *endpoint) recvBuf(i int) []byte {
	return e.arena.Bytes()[i*e.bufSize : (i+1)*e.bufSize]
}

func (e *endpoint) sendBuf(i int) []byte {
	off := (e.nRecv + i) * e.bufSize
	return e.arena.Bytes()[off : off+e.bufSize]
}

func (e *endpoint) recvWR(i int) verbs.RecvWR {
	return verbs.RecvWR{WRID: wrRecv | uint64(i), Addr: e.mr.Addr() + uint64(i*e.bufSize), Len: uint32(e.bufSize), LKey: e.mr.LKey}
}

func (e *endpoint) sendAddr(i int) uint64 {
	return e.mr.Addr() + uint64((e.nRecv+i)*e.bufSize)
}

// close destroys everything in reverse order of creation. Idempotent.
func (e *endpoint) close() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if e.qp != nil {
		add(e.qp.Close())
	}
	if e.mr != nil {
		add(e.mr.Close())
	}
	if e.arena != nil {
		add(e.arena.Close())
	}
	if e.cq != nil {
		add(e.cq.Close())
	}
	if e.compCh != nil {
		add(e.compCh.Close())
	}
	if e.pd != nil {
		add(e.pd.Close())
	}
	return errors.Join(errs...)
}
