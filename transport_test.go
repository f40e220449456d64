//go:build linux && cgo

package rdma

import (
	"testing"
	"time"

	"github.com/verbline/rdma/internal/verbs"
)

// rdmaCMAttrs is what rdma_init_qp_attr gives an RC QP on RoCE (as read
// on Soft-RoCE): RTR with the path, RTS with the peer's retry counts.
func rdmaCMAttrs(to verbs.QPState) (verbs.QPAttr, verbs.AttrMask) {
	switch to {
	case verbs.StateRTR:
		return verbs.QPAttr{State: to, PathMTU: verbs.MTU1024, DestQPN: 0x12, RQPSN: 0x100, MaxDestRdAtomic: 1,
				AH: verbs.AHAttr{IsGlobal: true, SGIDIndex: 1, HopLimit: 64, PortNum: 1}},
			verbs.AttrState | verbs.AttrAV | verbs.AttrPathMTU | verbs.AttrDestQPN | verbs.AttrRQPSN |
				verbs.AttrMaxDestRdAtomic | verbs.AttrMinRNRTimer
	case verbs.StateRTS:
		return verbs.QPAttr{State: to, SQPSN: 0x200, Timeout: 19, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
			verbs.AttrState | verbs.AttrSQPSN | verbs.AttrTimeout | verbs.AttrRetryCnt | verbs.AttrRNRRetry |
				verbs.AttrMaxQPRdAtomic
	}
	return verbs.QPAttr{State: to, PortNum: 1}, verbs.AttrState | verbs.AttrPKeyIndex | verbs.AttrPort | verbs.AttrAccessFlags
}

// The Config goes on top of rdma_cm's attributes at the transition each
// attribute belongs to; unset fields leave rdma_cm's values; a path MTU cap
// never raises the path's.
func TestConfigureTransitions(t *testing.T) {
	run := func(cfg Config) (rtr, rts verbs.QPAttr, rtrMask, rtsMask verbs.AttrMask, e *endpoint) {
		c := cfg.withDefaults()
		e = &endpoint{}
		e.setTransport(&c)
		rtr, m := rdmaCMAttrs(verbs.StateRTR)
		rtrMask = e.configure(verbs.StateRTR, &rtr, m)
		rts, m = rdmaCMAttrs(verbs.StateRTS)
		rtsMask = e.configure(verbs.StateRTS, &rts, m)
		return
	}
	rtr, rts, rtrMask, rtsMask, e := run(Config{})
	cmRTR, cmRTRMask := rdmaCMAttrs(verbs.StateRTR)
	if rtr != cmRTR || rtrMask != cmRTRMask {
		t.Errorf("zero Config changed RTR: %+v %s", rtr, rtrMask)
	}
	if rts.Timeout != 19 || rts.RetryCnt != 6 || rts.RNRRetry != 6 || e.ackTimeoutSet != 19 {
		t.Errorf("zero Config at RTS: %+v (want rdma_cm's timeout, retries 6)", rts)
	}
	_, cmRTSMask := rdmaCMAttrs(verbs.StateRTS)
	if rtsMask != cmRTSMask {
		t.Errorf("RTS mask %s", rtsMask)
	}

	rtr, rts, _, _, e = run(Config{AckTimeout: 30 * time.Millisecond, RetryCount: 2, RNRRetry: 3,
		MinRNRTimer: 100 * time.Microsecond, MaxPathMTU: 700, ServiceLevel: 9, TrafficClass: 40})
	if rtr.PathMTU != verbs.MTU512 || rtr.MinRNRTimer != 7 || rtr.AH.SL != 9 || rtr.AH.TrafficClass != 40 ||
		e.avSet != rtr.AH || rtr.AH.HopLimit != 64 || rtr.DestQPN != 0x12 {
		t.Errorf("RTR: %+v", rtr)
	}
	if rts.Timeout != 13 || rts.RetryCnt != 2 || rts.RNRRetry != 3 || rts.SQPSN != 0x200 {
		t.Errorf("RTS: %+v", rts)
	}
	if rtr, _, _, _, _ = run(Config{MaxPathMTU: 4096}); rtr.PathMTU != verbs.MTU1024 {
		t.Errorf("a 4096 cap raised the path's 1024 to %s", rtr.PathMTU)
	}
	var init verbs.QPAttr
	if m := (&endpoint{}).configure(verbs.StateInit, &init, verbs.AttrState); m&verbs.AttrAccessFlags == 0 ||
		init.AccessFlags != verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead {
		t.Errorf("INIT: %+v %s", init, m)
	}
	// rdma_cm gives the passive side remote atomics whatever the devices
	// have: INIT assigns the rights, with atomics only where negotiated,
	// and RTR grants them to a dialer that learnt it late; the listener's
	// depths land at RTR and RTS.
	init = verbs.QPAttr{AccessFlags: verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic}
	(&endpoint{}).configure(verbs.StateInit, &init, verbs.AttrState)
	if init.AccessFlags&verbs.AccessRemoteAtomic != 0 {
		t.Errorf("INIT without negotiated atomics kept rdma_cm's REMOTE_ATOMIC: %s", init.AccessFlags)
	}
	e = &endpoint{remoteAtomic: true, rdAtomic: 3, destRdAtomic: 5}
	rtr, rts = verbs.QPAttr{}, verbs.QPAttr{}
	if m := e.configure(verbs.StateRTR, &rtr, verbs.AttrState); m&(verbs.AttrAccessFlags|verbs.AttrMaxDestRdAtomic) !=
		verbs.AttrAccessFlags|verbs.AttrMaxDestRdAtomic || rtr.AccessFlags&verbs.AccessRemoteAtomic == 0 || rtr.MaxDestRdAtomic != 5 {
		t.Errorf("RTR with atomics and responder resources 5: %+v %s", rtr, m)
	}
	if m := e.configure(verbs.StateRTS, &rts, verbs.AttrState); m&verbs.AttrMaxQPRdAtomic == 0 || rts.MaxRdAtomic != 3 {
		t.Errorf("RTS with initiator depth 3: %+v %s", rts, m)
	}
	rtr = verbs.QPAttr{}
	if m := (&endpoint{}).configure(verbs.StateRTR, &rtr, verbs.AttrState); m&(verbs.AttrAccessFlags|verbs.AttrMaxDestRdAtomic) != 0 {
		t.Errorf("RTR of a dialer without atomics changed rdma_cm's rights or depth: %s", m)
	}
}

func TestQPInfoOf(t *testing.T) {
	a := verbs.QPAttr{State: verbs.StateRTS, PathMTU: verbs.MTU2048, DestQPN: 0x33, SQPSN: 5, RQPSN: 6, Timeout: 0,
		RetryCnt: 4, RNRRetry: 5, MinRNRTimer: 12, MaxRdAtomic: 2, MaxDestRdAtomic: 3,
		AH: verbs.AHAttr{SL: 2, TrafficClass: 40}} // no GRH: no traffic class
	got := qpInfoOf(0x32, &a, verbs.QPCap{MaxInline: 64, MaxSendWR: 10, MaxRecvWR: 20})
	want := QPInfo{QPN: 0x32, DestQPN: 0x33, State: "RTS", PathMTU: 2048, RetryCount: 4, RNRRetry: 5,
		MinRNRTimer: 640 * time.Microsecond, MinRNRTimerCode: 12, SendPSN: 5, RecvPSN: 6, ServiceLevel: 2,
		MaxInline: 64, MaxSendWR: 10, MaxRecvWR: 20, MaxRdAtomic: 2, MaxDestRdAtomic: 3}
	if got != want {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	a.Timeout, a.AH.IsGlobal, a.AH.HopLimit, a.AH.SGIDIndex = 14, true, 64, 1
	got = qpInfoOf(0x32, &a, verbs.QPCap{})
	if got.AckTimeout != ackTimeoutOf(14) || got.TimeoutExp != 14 || got.TrafficClass != 40 || got.HopLimit != 64 || got.SGIDIndex != 1 {
		t.Fatalf("with a GRH and a timeout: %+v", got)
	}
}
