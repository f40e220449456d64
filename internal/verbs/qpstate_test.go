package verbs

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

const testQPN = 0x1a

var allTypes = []QPType{QPTypeRC, QPTypeUC, QPTypeUD}

// ibLimits is a 2-port InfiniBand device with generous limits.
var ibLimits = PortLimits{
	PhysPorts: 2, ActiveMTU: MTU4096, GIDTableLen: 16,
	MaxQPRdAtom: 16, MaxQPInitRdAtom: 16, MaxPKeys: 128,
	AllowedAccess: AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic,
}

// roceLimits is the same device with an Ethernet link layer.
var roceLimits = func() PortLimits { l := ibLimits; l.Ethernet = true; return l }()

type step struct {
	attr QPAttr
	mask AttrMask
}

// minimalPath returns the minimal RESET->INIT->RTR->RTS steps for typ.
func minimalPath(typ QPType) []step {
	switch typ {
	case QPTypeRC:
		return []step{
			{QPAttr{State: StateInit, PKeyIndex: 0, PortNum: 1, AccessFlags: AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead},
				AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags},
			{QPAttr{State: StateRTR, AH: AHAttr{IsGlobal: true, SGIDIndex: 1, PortNum: 1}, PathMTU: MTU1024,
				DestQPN: 0xffffff, RQPSN: 0xffffff, MaxDestRdAtomic: 16, MinRNRTimer: 31},
				AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer},
			{QPAttr{State: StateRTS, SQPSN: 0, Timeout: 31, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
				AttrState | AttrSQPSN | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic},
		}
	case QPTypeUC:
		return []step{
			{QPAttr{State: StateInit, PortNum: 2, AccessFlags: AccessRemoteWrite},
				AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags},
			{QPAttr{State: StateRTR, AH: AHAttr{IsGlobal: true}, PathMTU: MTU4096, DestQPN: 7, RQPSN: 1},
				AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN},
			{QPAttr{State: StateRTS, SQPSN: 1}, AttrState | AttrSQPSN},
		}
	default:
		return []step{
			{QPAttr{State: StateInit, PortNum: 1, QKey: 0x11111111},
				AttrState | AttrPKeyIndex | AttrPort | AttrQKey},
			{QPAttr{State: StateRTR}, AttrState},
			{QPAttr{State: StateRTS, SQPSN: 0x123}, AttrState | AttrSQPSN},
		}
	}
}

// stepFrom returns the minimal step for typ that leaves the given state.
func stepFrom(t *testing.T, typ QPType, from QPState) step {
	t.Helper()
	for i, s := range minimalPath(typ) {
		if QPState(i) == from {
			return s
		}
	}
	t.Fatalf("no minimal step from %s", from)
	return step{}
}

func asTransitionError(t *testing.T, err error) *TransitionError {
	t.Helper()
	var te *TransitionError
	if !errors.As(err, &te) {
		t.Fatalf("error %v (%T) is not a *TransitionError", err, err)
	}
	return te
}

func TestLegalPathsMinimal(t *testing.T) {
	for _, typ := range allTypes {
		for _, lim := range []PortLimits{{}, ibLimits, roceLimits} {
			t.Run(fmt.Sprintf("%s/eth=%v", typ, lim.Ethernet), func(t *testing.T) {
				cur := StateReset
				for _, s := range minimalPath(typ) {
					if err := CheckTransition(testQPN, typ, cur, &s.attr, s.mask, lim); err != nil {
						t.Fatalf("%s->%s: %v", cur, s.attr.State, err)
					}
					cur = s.attr.State
				}
				if cur != StateRTS {
					t.Fatalf("ended in %s", cur)
				}
			})
		}
	}
}

func TestTransitionMasksTable(t *testing.T) {
	// Hand-written from the IB spec / kernel qp_state_table, independent of
	// the table literal.
	tests := []struct {
		typ      QPType
		from, to QPState
		req, opt AttrMask
	}{
		{QPTypeRC, StateReset, StateInit, AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags, 0},
		{QPTypeUC, StateReset, StateInit, AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags, 0},
		{QPTypeUD, StateReset, StateInit, AttrState | AttrPKeyIndex | AttrPort | AttrQKey, 0},
		{QPTypeRC, StateInit, StateInit, 0, AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPTypeUD, StateInit, StateInit, 0, AttrState | AttrPKeyIndex | AttrPort | AttrQKey},
		{QPTypeRC, StateInit, StateRTR,
			AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer,
			AttrAltPath | AttrAccessFlags | AttrPKeyIndex},
		{QPTypeUC, StateInit, StateRTR,
			AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN,
			AttrAltPath | AttrAccessFlags | AttrPKeyIndex},
		{QPTypeUD, StateInit, StateRTR, AttrState, AttrPKeyIndex | AttrQKey},
		{QPTypeRC, StateRTR, StateRTS,
			AttrState | AttrSQPSN | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic,
			AttrCurState | AttrAltPath | AttrAccessFlags | AttrMinRNRTimer | AttrPathMigState},
		{QPTypeUC, StateRTR, StateRTS, AttrState | AttrSQPSN,
			AttrCurState | AttrAltPath | AttrAccessFlags | AttrPathMigState},
		{QPTypeUD, StateRTR, StateRTS, AttrState | AttrSQPSN, AttrCurState | AttrQKey},
		{QPTypeRC, StateRTS, StateRTS, 0,
			AttrState | AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState | AttrMinRNRTimer},
		{QPTypeUD, StateRTS, StateSQD, AttrState, AttrEnSQDAsyncNotify},
		{QPTypeUC, StateSQD, StateSQD, 0,
			AttrState | AttrAV | AttrAltPath | AttrAccessFlags | AttrPKeyIndex | AttrPathMigState},
		{QPTypeUD, StateSQE, StateRTS, AttrState, AttrCurState | AttrQKey},
		{QPTypeRC, StateSQE, StateRTS, AttrState, 0},
		{QPTypeRC, StateRTS, StateErr, AttrState, 0},
		{QPTypeUD, StateErr, StateReset, AttrState, 0},
		{QPTypeUC, StateErr, StateErr, 0, AttrState},
	}
	for _, tc := range tests {
		req, opt, ok := TransitionMasks(tc.typ, tc.from, tc.to)
		if !ok || req != tc.req || opt != tc.opt {
			t.Errorf("%s %s->%s: got (%s; %s; %v), want (%s; %s; true)",
				tc.typ, tc.from, tc.to, req, opt, ok, tc.req, tc.opt)
		}
	}
	// Nothing anywhere allows rate_limit, and cur_state only where the QP
	// may be in RTR/RTS/SQD/SQE.
	for _, typ := range allTypes {
		for from := range QPState(numStates) {
			for to := range QPState(numStates) {
				req, opt, ok := TransitionMasks(typ, from, to)
				if !ok {
					continue
				}
				if (req|opt)&AttrRateLimit != 0 {
					t.Errorf("%s %s->%s allows rate_limit", typ, from, to)
				}
				if (req|opt)&AttrCurState != 0 && (from < StateRTR || from > StateSQE) {
					t.Errorf("%s %s->%s allows cur_state", typ, from, to)
				}
			}
		}
	}
	if _, _, ok := TransitionMasks(QPType(8), StateReset, StateInit); ok {
		t.Error("raw packet type accepted")
	}
	if _, _, ok := TransitionMasks(QPTypeRC, StateReset, QPState(7)); ok {
		t.Error("state 7 accepted")
	}
}

func TestIllegalTransitions(t *testing.T) {
	tests := []struct {
		typ      QPType
		from, to QPState
		mask     AttrMask // AttrState unless an attribute-only modify is meant
	}{
		{QPTypeRC, StateReset, StateRTR, AttrState},
		{QPTypeRC, StateReset, StateRTS, AttrState},
		{QPTypeUD, StateReset, StateSQD, AttrState},
		{QPTypeRC, StateInit, StateRTS, AttrState},
		{QPTypeUD, StateInit, StateRTS, AttrState},
		{QPTypeRC, StateRTR, StateInit, AttrState},
		{QPTypeUC, StateRTS, StateRTR, AttrState},
		{QPTypeRC, StateRTS, StateInit, AttrState},
		{QPTypeRC, StateRTS, StateSQE, AttrState},
		{QPTypeUD, StateSQD, StateRTR, AttrState},
		{QPTypeUD, StateSQE, StateSQD, AttrState},
		{QPTypeRC, StateErr, StateRTS, AttrState},
		{QPTypeUC, StateErr, StateInit, AttrState},
		{QPTypeRC, StateRTR, StateRTR, AttrState},
		{QPTypeRC, StateRTR, StateRTR, AttrSQPSN}, // no attribute-only modify in RTR
		{QPTypeUD, StateSQE, StateSQE, AttrQKey},  // nor in SQE
	}
	for _, tc := range tests {
		name := fmt.Sprintf("%s/%s->%s", tc.typ, tc.from, tc.to)
		t.Run(name, func(t *testing.T) {
			err := CheckTransition(testQPN, tc.typ, tc.from, &QPAttr{State: tc.to}, tc.mask, ibLimits)
			if !errors.Is(err, ErrIllegalTransition) || errors.Is(err, ErrInvalidAttr) {
				t.Fatalf("got %v, want ErrIllegalTransition", err)
			}
			want := fmt.Sprintf("modify QP 0x1a (%s) %s->%s: illegal transition", tc.typ, tc.from, tc.to)
			if noMask(err) != want {
				t.Fatalf("message %q, want %q", err, want)
			}
			te := asTransitionError(t, err)
			if te.QPN != testQPN || te.From != tc.from || te.To != tc.to || te.Attr != "" {
				t.Fatalf("fields %+v", te)
			}
		})
	}
	// An out-of-range current state is illegal too.
	if err := CheckTransition(testQPN, QPTypeRC, QPState(9), &QPAttr{State: StateErr}, AttrState, ibLimits); !errors.Is(err, ErrIllegalTransition) {
		t.Fatalf("from state 9: %v", err)
	}
}

func TestMissingRequired(t *testing.T) {
	for _, typ := range allTypes {
		for i, s := range minimalPath(typ) {
			from := QPState(i)
			req, _, _ := TransitionMasks(typ, from, s.attr.State)
			for _, a := range attrNames {
				if req&a.bit == 0 || a.bit == AttrState {
					continue // dropping AttrState makes it an attribute-only modify; covered elsewhere
				}
				err := CheckTransition(testQPN, typ, from, &s.attr, s.mask&^a.bit, ibLimits)
				if !errors.Is(err, ErrInvalidAttr) {
					t.Errorf("%s %s->%s without %s: %v", typ, from, s.attr.State, a.name, err)
					continue
				}
				want := fmt.Sprintf("modify QP 0x1a (%s) %s->%s: missing required attribute %s",
					typ, from, s.attr.State, a.name)
				if noMask(err) != want {
					t.Errorf("message %q, want %q", err, want)
				}
				if te := asTransitionError(t, err); te.Attr != a.name {
					t.Errorf("Attr %q, want %q", te.Attr, a.name)
				}
			}
		}
	}
	// Several missing are all named.
	s := stepFrom(t, QPTypeRC, StateInit)
	err := CheckTransition(testQPN, QPTypeRC, StateInit, &s.attr, AttrState|AttrAV|AttrRQPSN|AttrMaxDestRdAtomic|AttrMinRNRTimer, ibLimits)
	if err == nil || !strings.HasSuffix(err.Error(), "missing required attributes path_mtu|dest_qpn") {
		t.Fatalf("got %v", err)
	}
}

func TestForbiddenAttributes(t *testing.T) {
	tests := []struct {
		name  string
		typ   QPType
		from  QPState
		extra AttrMask
		want  string // full message, or "" to check only the attribute name
	}{
		{"UD max_rd_atomic at RTS", QPTypeUD, StateRTR, AttrMaxQPRdAtomic,
			"modify QP 0x1a (UD) RTR->RTS: attribute max_rd_atomic not allowed for UD in this transition"},
		{"RC qkey at INIT", QPTypeRC, StateReset, AttrQKey,
			"modify QP 0x1a (RC) RESET->INIT: attribute qkey not allowed for RC in this transition"},
		{"UD access_flags at INIT", QPTypeUD, StateReset, AttrAccessFlags, ""},
		{"UC min_rnr_timer at RTR", QPTypeUC, StateInit, AttrMinRNRTimer, ""},
		{"RC sq_psn at RTR", QPTypeRC, StateInit, AttrSQPSN, ""},
		{"RC cur_state at RTR", QPTypeRC, StateInit, AttrCurState, ""},
		{"UD path_mtu at RTR", QPTypeUD, StateInit, AttrPathMTU, ""},
		{"RC rate_limit at RTS", QPTypeRC, StateRTR, AttrRateLimit, ""},
		{"RC cap at RTS", QPTypeRC, StateRTR, AttrCap, ""},
		{"two at once", QPTypeUD, StateRTR, AttrTimeout | AttrMaxQPRdAtomic,
			"modify QP 0x1a (UD) RTR->RTS: attributes timeout|max_rd_atomic not allowed for UD in this transition"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := stepFrom(t, tc.typ, tc.from)
			err := CheckTransition(testQPN, tc.typ, tc.from, &s.attr, s.mask|tc.extra, ibLimits)
			if !errors.Is(err, ErrInvalidAttr) {
				t.Fatalf("got %v, want ErrInvalidAttr", err)
			}
			if tc.want != "" && noMask(err) != tc.want {
				t.Fatalf("message %q, want %q", err, tc.want)
			}
			if te := asTransitionError(t, err); te.Attr != tc.extra.String() {
				t.Fatalf("Attr %q, want %q", te.Attr, tc.extra)
			}
		})
	}
	// To ERR / RESET nothing but the state may be given.
	err := CheckTransition(testQPN, QPTypeRC, StateRTS, &QPAttr{State: StateErr}, AttrState|AttrSQPSN, ibLimits)
	if !errors.Is(err, ErrInvalidAttr) {
		t.Fatalf("RTS->ERR with sq_psn: %v", err)
	}
}

func TestValueChecks(t *testing.T) {
	type tc struct {
		name string
		typ  QPType
		from QPState
		lim  PortLimits
		mod  func(*QPAttr)
		attr string // expected TransitionError.Attr
		want string // expected message, or "" to skip
	}
	tests := []tc{
		{"rq_psn 1<<24", QPTypeRC, StateInit, ibLimits, func(a *QPAttr) { a.RQPSN = 1 << 24 }, "rq_psn",
			"modify QP 0x1a (RC) INIT->RTR: rq_psn 0x1000000 exceeds 24 bits"},
		{"sq_psn 1<<24", QPTypeUD, StateRTR, ibLimits, func(a *QPAttr) { a.SQPSN = 1 << 24 }, "sq_psn", ""},
		{"dest_qpn 1<<24", QPTypeUC, StateInit, ibLimits, func(a *QPAttr) { a.DestQPN = 1 << 24 }, "dest_qpn",
			"modify QP 0x1a (UC) INIT->RTR: dest_qpn 0x1000000 exceeds 24 bits"},
		{"path_mtu above active", QPTypeRC, StateInit, PortLimits{ActiveMTU: MTU1024},
			func(a *QPAttr) { a.PathMTU = MTU4096 }, "path_mtu",
			"modify QP 0x1a (RC) INIT->RTR: path_mtu 4096 exceeds port active_mtu 1024"},
		{"path_mtu 0", QPTypeUC, StateInit, ibLimits, func(a *QPAttr) { a.PathMTU = 0 }, "path_mtu", ""},
		{"path_mtu 6", QPTypeRC, StateInit, PortLimits{}, func(a *QPAttr) { a.PathMTU = 6 }, "path_mtu", ""},
		{"port 0", QPTypeRC, StateReset, PortLimits{}, func(a *QPAttr) { a.PortNum = 0 }, "port", ""},
		{"port 3 of 2", QPTypeUD, StateReset, ibLimits, func(a *QPAttr) { a.PortNum = 3 }, "port",
			"modify QP 0x1a (UD) RESET->INIT: port 3 out of range (device has 2 ports)"},
		{"pkey_index", QPTypeRC, StateReset, ibLimits, func(a *QPAttr) { a.PKeyIndex = 128 }, "pkey_index", ""},
		{"timeout 32", QPTypeRC, StateRTR, ibLimits, func(a *QPAttr) { a.Timeout = 32 }, "timeout", ""},
		{"retry_cnt 8", QPTypeRC, StateRTR, ibLimits, func(a *QPAttr) { a.RetryCnt = 8 }, "retry_cnt", ""},
		{"rnr_retry 8", QPTypeRC, StateRTR, ibLimits, func(a *QPAttr) { a.RNRRetry = 8 }, "rnr_retry", ""},
		{"min_rnr_timer 32", QPTypeRC, StateInit, ibLimits, func(a *QPAttr) { a.MinRNRTimer = 32 }, "min_rnr_timer", ""},
		{"max_rd_atomic", QPTypeRC, StateRTR, ibLimits, func(a *QPAttr) { a.MaxRdAtomic = 17 }, "max_rd_atomic", ""},
		{"max_dest_rd_atomic", QPTypeRC, StateInit, ibLimits, func(a *QPAttr) { a.MaxDestRdAtomic = 17 }, "max_dest_rd_atomic", ""},
		{"RoCE AV without GRH", QPTypeRC, StateInit, roceLimits, func(a *QPAttr) { a.AH.IsGlobal = false }, "ah.is_global", ""},
		{"sgid_index out of range", QPTypeUC, StateInit, roceLimits, func(a *QPAttr) { a.AH.SGIDIndex = 16 }, "ah.sgid_index",
			"modify QP 0x1a (UC) INIT->RTR: ah.sgid_index 16 out of range (GID table has 16 entries)"},
		{"flow_label", QPTypeRC, StateInit, ibLimits, func(a *QPAttr) { a.AH.FlowLabel = 1 << 20 }, "ah.flow_label", ""},
		{"sl 16", QPTypeRC, StateInit, ibLimits, func(a *QPAttr) { a.AH.SL = 16 }, "ah.sl", ""},
		{"ah port 3 of 2", QPTypeRC, StateInit, ibLimits, func(a *QPAttr) { a.AH.PortNum = 3 }, "ah.port_num", ""},
		{"access not allowed", QPTypeRC, StateReset, PortLimits{AllowedAccess: AccessLocalWrite | AccessRemoteWrite},
			func(a *QPAttr) { a.AccessFlags = AccessRemoteWrite | AccessRemoteRead }, "access_flags",
			"modify QP 0x1a (RC) RESET->INIT: access_flags remote_read not permitted (allowed: local_write|remote_write)"},
		{"UC remote atomic", QPTypeUC, StateReset, PortLimits{}, func(a *QPAttr) { a.AccessFlags = AccessRemoteAtomic }, "access_flags", ""},
		{"UC remote read", QPTypeUC, StateReset, PortLimits{}, func(a *QPAttr) { a.AccessFlags = AccessRemoteRead }, "access_flags", ""},
		{"unknown access bit", QPTypeRC, StateReset, PortLimits{}, func(a *QPAttr) { a.AccessFlags = 1 << 4 }, "access_flags", ""},
		{"unknown access bit above flush", QPTypeRC, StateReset, PortLimits{}, func(a *QPAttr) { a.AccessFlags = 1 << 10 }, "access_flags", ""},
		{"target state 9", QPTypeRC, StateReset, PortLimits{}, func(a *QPAttr) { a.State = 9 }, "state", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := stepFrom(t, tc.typ, tc.from)
			tc.mod(&s.attr)
			err := CheckTransition(testQPN, tc.typ, tc.from, &s.attr, s.mask, tc.lim)
			if !errors.Is(err, ErrInvalidAttr) || errors.Is(err, ErrIllegalTransition) {
				t.Fatalf("got %v, want ErrInvalidAttr", err)
			}
			if te := asTransitionError(t, err); te.Attr != tc.attr {
				t.Fatalf("Attr %q, want %q (%v)", te.Attr, tc.attr, err)
			}
			if tc.want != "" && noMask(err) != tc.want {
				t.Fatalf("message %q, want %q", err, tc.want)
			}
		})
	}
}

func TestValueChecksOnlyWhenSetOrConfigured(t *testing.T) {
	// Garbage in fields the mask does not select is ignored.
	s := stepFrom(t, QPTypeUD, StateRTR)
	s.attr.RQPSN, s.attr.DestQPN, s.attr.Timeout, s.attr.PathMTU = 1<<30, 1<<30, 200, 9
	if err := CheckTransition(testQPN, QPTypeUD, StateRTR, &s.attr, s.mask, roceLimits); err != nil {
		t.Fatal(err)
	}
	// An IB port without limits accepts an LID-routed AV and any sgid_index.
	s = stepFrom(t, QPTypeRC, StateInit)
	s.attr.AH = AHAttr{DLID: 5, SGIDIndex: 200}
	if err := CheckTransition(testQPN, QPTypeRC, StateInit, &s.attr, s.mask, PortLimits{}); err != nil {
		t.Fatal(err)
	}
	// UC may grant remote write and local write.
	s = stepFrom(t, QPTypeUC, StateReset)
	s.attr.AccessFlags = AccessLocalWrite | AccessRemoteWrite
	if err := CheckTransition(testQPN, QPTypeUC, StateReset, &s.attr, s.mask, ibLimits); err != nil {
		t.Fatal(err)
	}
}

func TestAnyToErrAndReset(t *testing.T) {
	for _, typ := range allTypes {
		for from := range QPState(numStates) {
			for _, to := range []QPState{StateErr, StateReset} {
				if err := CheckTransition(testQPN, typ, from, &QPAttr{State: to}, AttrState, ibLimits); err != nil {
					t.Errorf("%s %s->%s: %v", typ, from, to, err)
				}
			}
		}
	}
}

func TestAttributeOnlyModify(t *testing.T) {
	tests := []struct {
		typ  QPType
		cur  QPState
		attr QPAttr
		mask AttrMask
	}{
		{QPTypeRC, StateRTS, QPAttr{MinRNRTimer: 12}, AttrMinRNRTimer},
		{QPTypeRC, StateRTS, QPAttr{State: StateRTS, MinRNRTimer: 12}, AttrState | AttrMinRNRTimer},
		{QPTypeUD, StateRTS, QPAttr{QKey: 5, CurState: StateRTS}, AttrQKey | AttrCurState},
		{QPTypeRC, StateSQD, QPAttr{Timeout: 14, RetryCnt: 7, PortNum: 2}, AttrTimeout | AttrRetryCnt | AttrPort},
		{QPTypeUC, StateInit, QPAttr{AccessFlags: AccessRemoteWrite}, AttrAccessFlags},
		{QPTypeRC, StateRTS, QPAttr{}, 0},
	}
	for _, tc := range tests {
		if err := CheckTransition(testQPN, tc.typ, tc.cur, &tc.attr, tc.mask, ibLimits); err != nil {
			t.Errorf("%s %s (%s): %v", tc.typ, tc.cur, tc.mask, err)
		}
	}
}

func TestDrainAndResume(t *testing.T) {
	for _, typ := range allTypes {
		steps := []struct {
			from QPState
			attr QPAttr
			mask AttrMask
		}{
			{StateRTS, QPAttr{State: StateSQD}, AttrState | AttrEnSQDAsyncNotify},
			{StateSQD, QPAttr{State: StateRTS, CurState: StateSQD}, AttrState | AttrCurState},
			{StateSQE, QPAttr{State: StateRTS}, AttrState},
		}
		for _, s := range steps {
			if err := CheckTransition(testQPN, typ, s.from, &s.attr, s.mask, ibLimits); err != nil {
				t.Errorf("%s %s->%s: %v", typ, s.from, s.attr.State, err)
			}
		}
	}
}

func TestCurStateMismatch(t *testing.T) {
	attr := &QPAttr{State: StateRTS, CurState: StateSQD}
	err := CheckTransition(testQPN, QPTypeUD, StateSQE, attr, AttrState|AttrCurState, ibLimits)
	if !errors.Is(err, ErrInvalidAttr) || asTransitionError(t, err).Attr != "cur_state" {
		t.Fatalf("got %v", err)
	}
}

func TestUnsupportedTypeAndNilAttr(t *testing.T) {
	err := CheckTransition(testQPN, QPType(8), StateReset, &QPAttr{State: StateInit}, AttrState|AttrPort, ibLimits)
	if !errors.Is(err, ErrUnsupportedQPType) || !strings.Contains(err.Error(), "unsupported QP type") {
		t.Fatalf("got %v", err)
	}
	if !strings.HasPrefix(err.Error(), "modify QP 0x1a (QPType(8)) RESET->INIT [IBV_QP_STATE|IBV_QP_PORT]: ") {
		t.Fatalf("got %q", err)
	}
	err = CheckTransition(testQPN, QPTypeRC, StateReset, nil, AttrState, ibLimits)
	if !errors.Is(err, ErrInvalidAttr) {
		t.Fatalf("nil attr: %v", err)
	}
}

func TestTransitionErrorUnwrapFallback(t *testing.T) {
	e := &TransitionError{QPN: 0xabc, Type: QPTypeUC, From: StateInit, To: StateRTS, Reason: "illegal transition"}
	if !errors.Is(e, ErrIllegalTransition) || errors.Is(e, ErrInvalidAttr) {
		t.Fatal("fallback for empty Attr")
	}
	if got := e.Error(); got != "modify QP 0xabc (UC) INIT->RTS: illegal transition" {
		t.Fatalf("got %q", got)
	}
	e = &TransitionError{Attr: "qkey", Reason: "x"}
	if !errors.Is(e, ErrInvalidAttr) || errors.Is(e, ErrIllegalTransition) {
		t.Fatal("fallback for Attr")
	}
}

func TestStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{(AttrPathMTU | AttrDestQPN).String(), "path_mtu|dest_qpn"},
		{AttrMask(0).String(), "none"},
		{(AttrState | 1<<21).String(), "state|0x200000"},
		{AttrMaxQPRdAtomic.String(), "max_rd_atomic"},
		{AttrRateLimit.String(), "rate_limit"},
		{StateReset.String(), "RESET"},
		{StateSQE.String(), "SQE"},
		{StateErr.String(), "ERR"},
		{QPState(7).String(), "QPState(7)"},
		{QPTypeRC.String(), "RC"},
		{QPTypeUC.String(), "UC"},
		{QPTypeUD.String(), "UD"},
		{MTU2048.String(), "2048"},
		{MTU(0).String(), "MTU(0)"},
		{(AccessLocalWrite | AccessRemoteAtomic).String(), "local_write|remote_atomic"},
		{(AccessRemoteRead | AccessFlushGlobal | AccessFlushPersistent).String(), "remote_read|flush_global|flush_persistent"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	for m, b := range map[MTU]int{0: 0, MTU256: 256, MTU512: 512, MTU1024: 1024, MTU2048: 2048, MTU4096: 4096, 6: 0} {
		if m.Bytes() != b {
			t.Errorf("MTU(%d).Bytes() = %d, want %d", m, m.Bytes(), b)
		}
	}
	// Bit values must match enum ibv_qp_attr_mask.
	if AttrDestQPN != 1<<20 || AttrCap != 1<<19 || AttrMaxQPRdAtomic != 1<<13 || AttrRateLimit != 1<<25 {
		t.Fatal("attr mask bit values drifted from verbs.h")
	}
	if len(attrNames) != 22 {
		t.Fatalf("%d attr names", len(attrNames))
	}
}

func okApply(*QPAttr, AttrMask) error { return nil }

func TestStateGuardPath(t *testing.T) {
	for _, typ := range allTypes {
		g := NewStateGuard(testQPN, typ)
		if g.State() != StateReset {
			t.Fatalf("new guard in %s", g.State())
		}
		for _, s := range minimalPath(typ) {
			var gotMask AttrMask
			apply := func(a *QPAttr, m AttrMask) error { gotMask = m; return nil }
			if err := g.Modify(&s.attr, s.mask, ibLimits, apply); err != nil {
				t.Fatalf("%s: %v", typ, err)
			}
			if gotMask != s.mask || g.State() != s.attr.State {
				t.Fatalf("%s: apply saw %s, state %s", typ, gotMask, g.State())
			}
		}
		// Attribute-only modify keeps RTS.
		if err := g.Modify(&QPAttr{}, 0, ibLimits, okApply); err != nil || g.State() != StateRTS {
			t.Fatalf("%s: no-op modify: %v, %s", typ, err, g.State())
		}
	}
}

func TestStateGuardRejectsWithoutApply(t *testing.T) {
	g := NewStateGuard(testQPN, QPTypeRC)
	called := false
	err := g.Modify(&QPAttr{State: StateRTS}, AttrState, ibLimits, func(*QPAttr, AttrMask) error { called = true; return nil })
	if !errors.Is(err, ErrIllegalTransition) || called || g.State() != StateReset {
		t.Fatalf("err %v, called %v, state %s", err, called, g.State())
	}
}

func TestStateGuardApplyError(t *testing.T) {
	g := NewStateGuard(testQPN, QPTypeUC)
	kernelErr := errors.New("ibv_modify_qp: Invalid argument")
	s := stepFrom(t, QPTypeUC, StateReset)
	err := g.Modify(&s.attr, s.mask, ibLimits, func(*QPAttr, AttrMask) error { return kernelErr })
	if !errors.Is(err, kernelErr) || errors.Is(err, ErrInvalidAttr) || errors.Is(err, ErrIllegalTransition) {
		t.Fatalf("got %v", err)
	}
	if want := "modify QP 0x1a (UC) RESET->INIT [IBV_QP_STATE|IBV_QP_ACCESS_FLAGS|IBV_QP_PKEY_INDEX|IBV_QP_PORT] " +
		"(state=INIT access_flags=remote_write pkey_index=0 port=2): ibv_modify_qp: Invalid argument"; err.Error() != want {
		t.Fatalf("message %q, want %q", err, want)
	}
	if g.State() != StateReset {
		t.Fatalf("state %s after failed apply", g.State())
	}
	// The same request then succeeds.
	if err := g.Modify(&s.attr, s.mask, ibLimits, okApply); err != nil || g.State() != StateInit {
		t.Fatalf("retry: %v, %s", err, g.State())
	}
}

func TestStateGuardForce(t *testing.T) {
	g := NewStateGuard(testQPN, QPTypeRC)
	for _, s := range minimalPath(QPTypeRC) {
		if err := g.Modify(&s.attr, s.mask, ibLimits, okApply); err != nil {
			t.Fatal(err)
		}
	}
	g.Force(StateErr) // e.g. IBV_EVENT_QP_FATAL
	if g.State() != StateErr {
		t.Fatalf("state %s", g.State())
	}
	// Checks now start from ERR: only RESET or ERR are legal, and ERR->ERR
	// takes no attributes.
	err := g.Modify(&QPAttr{State: StateRTS}, AttrState, ibLimits, okApply)
	if !errors.Is(err, ErrIllegalTransition) || !strings.Contains(err.Error(), "(RC) ERR->RTS [IBV_QP_STATE]: ") {
		t.Fatalf("got %v", err)
	}
	err = g.Modify(&QPAttr{MinRNRTimer: 1}, AttrMinRNRTimer, ibLimits, okApply)
	if !errors.Is(err, ErrInvalidAttr) || !strings.Contains(err.Error(), "ERR->ERR") {
		t.Fatalf("got %v", err)
	}
	if err := g.Modify(&QPAttr{State: StateReset}, AttrState, ibLimits, okApply); err != nil || g.State() != StateReset {
		t.Fatalf("ERR->RESET: %v, %s", err, g.State())
	}
}

func TestStateGuardConcurrent(t *testing.T) {
	const n = 64
	g := NewStateGuard(testQPN, QPTypeRC)
	toInit := stepFrom(t, QPTypeRC, StateReset)
	if err := g.Modify(&toInit.attr, toInit.mask, ibLimits, okApply); err != nil {
		t.Fatal(err)
	}

	// n goroutines race to take the QP INIT->RTR. The guard serializes them:
	// exactly one sees INIT and succeeds; every later one sees RTR, where
	// RTR->RTR is illegal. apply checks that it never runs concurrently.
	var (
		inApply, applies atomic.Int32
		start            = make(chan struct{})
		wg               sync.WaitGroup
		errs             = make([]error, n)
	)
	rtr := stepFrom(t, QPTypeRC, StateInit)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			attr := rtr.attr // each goroutine its own copy
			<-start
			errs[i] = g.Modify(&attr, rtr.mask, ibLimits, func(*QPAttr, AttrMask) error {
				if inApply.Add(1) != 1 {
					t.Error("apply ran concurrently")
				}
				applies.Add(1)
				inApply.Add(-1)
				return nil
			})
		}()
	}
	close(start)
	wg.Wait()

	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, ErrIllegalTransition) && strings.Contains(err.Error(), "RTR->RTR"):
		default:
			t.Errorf("unexpected error %v", err)
		}
	}
	if ok != 1 || applies.Load() != 1 || g.State() != StateRTR {
		t.Fatalf("%d succeeded, %d applies, state %s", ok, applies.Load(), g.State())
	}

	// Concurrent attribute-only modifies in RTS all succeed, one at a time,
	// while readers poll State.
	rts := stepFrom(t, QPTypeRC, StateRTR)
	if err := g.Modify(&rts.attr, rts.mask, ibLimits, okApply); err != nil {
		t.Fatal(err)
	}
	applies.Store(0)
	for i := range n {
		wg.Add(2)
		go func() {
			defer wg.Done()
			attr := QPAttr{MinRNRTimer: uint8(i % 32)}
			if err := g.Modify(&attr, AttrMinRNRTimer, ibLimits, func(*QPAttr, AttrMask) error {
				if inApply.Add(1) != 1 {
					t.Error("apply ran concurrently")
				}
				applies.Add(1)
				inApply.Add(-1)
				return nil
			}); err != nil {
				t.Error(err)
			}
		}()
		go func() {
			defer wg.Done()
			if s := g.State(); s != StateRTS {
				t.Errorf("state %s", s)
			}
		}()
	}
	wg.Wait()
	if applies.Load() != n {
		t.Fatalf("%d applies, want %d", applies.Load(), n)
	}
}

// noMask is err's message without the " [IBV_QP_...]" mask after the
// transition, for tests that check the rest of it (TestErrorNamesMask
// checks the mask).
func noMask(err error) string {
	s := err.Error()
	if i := strings.Index(s, " [IBV_QP_"); i >= 0 {
		if j := strings.Index(s[i:], "]"); j >= 0 {
			return s[:i] + s[i+j+1:]
		}
	}
	return s
}

// Every modify error names the whole mask asked for, in ibv_qp_attr_mask
// names; a refusal by the device also names the values set and unwraps to
// the errno.
func TestErrorNamesMask(t *testing.T) {
	s := stepFrom(t, QPTypeRC, StateRTR) // RTR->RTS
	attr := s.attr
	attr.SQPSN = 1 << 24
	err := CheckTransition(testQPN, QPTypeRC, StateRTR, &attr, s.mask, ibLimits)
	te := asTransitionError(t, err)
	if te.Mask != s.mask {
		t.Fatalf("Mask %s, want %s", te.Mask, s.mask)
	}
	want := "modify QP 0x1a (RC) RTR->RTS [IBV_QP_STATE|IBV_QP_TIMEOUT|IBV_QP_RETRY_CNT|IBV_QP_RNR_RETRY|" +
		"IBV_QP_MAX_QP_RD_ATOMIC|IBV_QP_SQ_PSN]: sq_psn 0x1000000 exceeds 24 bits"
	if err.Error() != want {
		t.Fatalf("got  %q\nwant %q", err, want)
	}
	g := NewStateGuard(testQPN, QPTypeRC)
	for _, st := range minimalPath(QPTypeRC)[:2] { // RESET->INIT->RTR
		if err := g.Modify(&st.attr, st.mask, ibLimits, okApply); err != nil {
			t.Fatal(err)
		}
	}
	attr = s.attr
	attr.Timeout, attr.RetryCnt, attr.RNRRetry, attr.SQPSN, attr.MaxRdAtomic = 14, 6, 7, 0x1234, 1
	err = g.Modify(&attr, s.mask, ibLimits, func(*QPAttr, AttrMask) error {
		return fmt.Errorf("ibv_modify_qp: %w", syscall.EINVAL)
	})
	var me *ModifyError
	if !errors.As(err, &me) || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("got %#v", err)
	}
	want = "modify QP 0x1a (RC) RTR->RTS [IBV_QP_STATE|IBV_QP_TIMEOUT|IBV_QP_RETRY_CNT|IBV_QP_RNR_RETRY|" +
		"IBV_QP_MAX_QP_RD_ATOMIC|IBV_QP_SQ_PSN] (state=RTS timeout=14 retry_cnt=6 rnr_retry=7 max_rd_atomic=1 sq_psn=0x1234): " +
		"ibv_modify_qp: invalid argument"
	if err.Error() != want {
		t.Fatalf("got  %q\nwant %q", err, want)
	}
	if got := (AttrState | AttrAV | AttrMinRNRTimer | 1<<30).VerbsString(); got != "IBV_QP_STATE|IBV_QP_AV|IBV_QP_MIN_RNR_TIMER|0x40000000" {
		t.Errorf("VerbsString: %q", got)
	}
}

// TestFlushAccessAccepted: the initial attributes rdma_cm gives a QP on a
// device that supports RDMA FLUSH (rxe from Linux 6.2) grant the two flush
// rights beside remote read and atomics; the guard accepts them.
func TestFlushAccessAccepted(t *testing.T) {
	s := stepFrom(t, QPTypeRC, StateReset)
	s.attr.AccessFlags = AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic | AccessFlushGlobal | AccessFlushPersistent
	if err := CheckTransition(testQPN, QPTypeRC, StateReset, &s.attr, s.mask, PortLimits{}); err != nil {
		t.Fatal(err)
	}
}

// TestIWARPInitRule: an iWARP RC QP enters INIT with only its access flags
// (what rdma_init_qp_attr gives an iWARP id); a P_Key index and a port may
// come too, nothing else may; every other transition keeps the table's
// rules. An InfiniBand QP still needs its P_Key index and port.
func TestIWARPInitRule(t *testing.T) {
	apply := func(*QPAttr, AttrMask) error { return nil }
	access := &QPAttr{State: StateInit, AccessFlags: AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead}
	iw := newGuard(7, QPTypeRC, true)
	if err := iw.Modify(access, AttrState|AttrAccessFlags, PortLimits{}, apply); err != nil || iw.State() != StateInit {
		t.Fatalf("iWARP RESET->INIT with access flags: %v (state %s)", err, iw.State())
	}
	if err := iw.Modify(access, AttrAccessFlags, PortLimits{}, apply); err != nil {
		t.Fatalf("iWARP INIT->INIT with access flags: %v", err)
	}
	if err := iw.Modify(&QPAttr{State: StateInit, QKey: 1}, AttrState|AttrQKey, PortLimits{}, apply); !errors.Is(err, ErrInvalidAttr) {
		t.Fatalf("iWARP INIT with a Q_Key: %v, want ErrInvalidAttr", err)
	}
	if err := iw.Modify(&QPAttr{State: StateRTR}, AttrState, PortLimits{}, apply); !errors.Is(err, ErrInvalidAttr) {
		t.Fatalf("iWARP INIT->RTR without a path: %v, want the table's ErrInvalidAttr", err)
	}
	bad := newGuard(8, QPTypeRC, true)
	if err := bad.Modify(&QPAttr{State: StateInit}, AttrState, PortLimits{}, apply); !errors.Is(err, ErrInvalidAttr) ||
		!strings.Contains(err.Error(), "access_flags") {
		t.Fatalf("iWARP RESET->INIT without access flags: %v, want ErrInvalidAttr naming access_flags", err)
	}
	ib := newGuard(9, QPTypeRC, false)
	if err := ib.Modify(access, AttrState|AttrAccessFlags, PortLimits{}, apply); !errors.Is(err, ErrInvalidAttr) ||
		!strings.Contains(err.Error(), "pkey_index") {
		t.Fatalf("InfiniBand RESET->INIT without P_Key index and port: %v, want ErrInvalidAttr naming them", err)
	}
}
