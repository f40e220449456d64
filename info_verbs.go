//go:build linux && cgo

package rdma

import (
	"errors"
	"net"

	"github.com/verbline/rdma/internal/verbs"
)

func qpInfoOf(qpn uint32, a *verbs.QPAttr, cp verbs.QPCap) QPInfo {
	info := QPInfo{QPN: qpn, DestQPN: a.DestQPN, State: a.State.String(), PathMTU: a.PathMTU.Bytes(),
		TimeoutExp: a.Timeout, RetryCount: int(a.RetryCnt), RNRRetry: int(a.RNRRetry),
		MinRNRTimer: rnrTimerOf(a.MinRNRTimer), MinRNRTimerCode: a.MinRNRTimer,
		SendPSN: a.SQPSN, RecvPSN: a.RQPSN, ServiceLevel: int(a.AH.SL),
		MaxInline: cp.MaxInline, MaxSendWR: cp.MaxSendWR, MaxRecvWR: cp.MaxRecvWR,
		MaxRdAtomic: int(a.MaxRdAtomic), MaxDestRdAtomic: int(a.MaxDestRdAtomic),
		RemoteAtomic: a.AccessFlags&verbs.AccessRemoteAtomic != 0}
	if a.Timeout != 0 {
		info.AckTimeout = ackTimeoutOf(a.Timeout)
	}
	if a.AH.IsGlobal {
		info.TrafficClass, info.HopLimit, info.SGIDIndex = int(a.AH.TrafficClass), int(a.AH.HopLimit), int(a.AH.SGIDIndex)
	}
	return info
}

// qpInfo is Conn.QPInfo on the engine.
func (c *engine) qpInfo() (QPInfo, error) {
	if c.isClosed() {
		return QPInfo{}, net.ErrClosed
	}
	a, cp, err := c.ep.qp.QueryAttr()
	if errors.Is(err, verbs.ErrClosed) {
		err = net.ErrClosed
	}
	if err != nil {
		return QPInfo{}, err
	}
	return qpInfoOf(c.ep.qp.Num, &a, cp), nil
}
