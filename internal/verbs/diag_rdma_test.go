//go:build linux && cgo

package verbs

import (
	"errors"
	"strings"
	"syscall"
	"testing"
)

// A modify the device refuses names the QP, the transition, the mask in
// ibv_qp_attr_mask names, the values and the errno; the same request with
// the port's real limits is refused in Go first, naming the attribute.
func TestModifyErrorFromDevice(t *testing.T) {
	if !connectsByHand(t) {
		return
	}
	ctx, port, dev, gid := testDevice(t)
	lim := port.Limits(dev)
	pd, err := ctx.AllocPD()
	must(t, err)
	defer pd.Close()
	cq, err := ctx.CreateCQ(16, nil)
	must(t, err)
	defer cq.Close()
	qp, err := pd.CreateQP(QPConfig{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, SendWR: 4, RecvWR: 4})
	must(t, err)
	defer qp.Close()

	attr := &QPAttr{State: StateInit, PortNum: 9, AccessFlags: AccessLocalWrite}
	mask := AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags
	err = qp.Modify(attr, mask, lim)
	var te *TransitionError
	if !errors.As(err, &te) || te.Attr != "port" || !errors.Is(err, ErrInvalidAttr) {
		t.Fatalf("with the port's limits: %v", err)
	}
	t.Logf("refused in Go: %v", err)

	// Without limits the Go checks pass and the kernel refuses port 9.
	err = qp.Modify(attr, mask, PortLimits{})
	var me *ModifyError
	if !errors.As(err, &me) || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("without limits: %#v", err)
	}
	t.Logf("refused by the device: %v", err)
	for _, want := range []string{
		"modify QP 0x", "(RC) RESET->INIT",
		"[IBV_QP_STATE|IBV_QP_ACCESS_FLAGS|IBV_QP_PKEY_INDEX|IBV_QP_PORT]",
		"port=9", "ibv_modify_qp: invalid argument (EINVAL)",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
	if me.QPN != qp.Num || me.From != StateReset || me.To != StateInit || me.Mask != mask {
		t.Errorf("fields %+v", me)
	}
	if qp.State() != StateReset {
		t.Fatalf("state %s after a refused modify", qp.State())
	}

	// QueryAttr reads back what a modify left.
	b, err := pd.CreateQP(QPConfig{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, SendWR: 4, RecvWR: 4})
	must(t, err)
	defer b.Close()
	connectPair(t, QPTypeRC, port, lim, gid, qp, b)
	a, c, err := qp.QueryAttr()
	must(t, err)
	if a.State != StateRTS || a.DestQPN != b.Num || a.PathMTU != port.ActiveMTU || a.Timeout != 14 ||
		a.RetryCnt != 7 || a.RNRRetry != 7 || a.MinRNRTimer != 12 || a.SQPSN != 0x123456 || a.RQPSN != 0x123456 ||
		c.MaxSendWR < 4 || c.MaxRecvWR < 4 {
		t.Fatalf("query: %+v cap %+v", a, c)
	}
	must(t, qp.Close())
	if _, _, err := qp.QueryAttr(); !errors.Is(err, ErrClosed) {
		t.Fatalf("query after Close: %v", err)
	}
}
