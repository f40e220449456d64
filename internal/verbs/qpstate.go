package verbs

// QP state machine: one table (qpStateTable) says, per QP type, which
// transitions are legal and which ibv_modify_qp attributes each one requires
// and permits. Every transition the library requests goes through
// CheckTransition (normally via StateGuard.Modify) before the kernel sees it,
// so a bad request fails with an error that names the QP, both states and the
// offending attribute instead of a bare EINVAL from ibv_modify_qp.
//
// This file is pure Go on purpose: the table and the checks are testable
// without a device.

import (
	"errors"
	"fmt"
	"strings"
	"sync"
)

// QPType is the transport service type of a QP (values of enum ibv_qp_type).
type QPType uint8

const (
	QPTypeRC QPType = 2 // IBV_QPT_RC
	QPTypeUC QPType = 3 // IBV_QPT_UC
	QPTypeUD QPType = 4 // IBV_QPT_UD
)

func (t QPType) String() string {
	switch t {
	case QPTypeRC:
		return "RC"
	case QPTypeUC:
		return "UC"
	case QPTypeUD:
		return "UD"
	}
	return fmt.Sprintf("QPType(%d)", uint8(t))
}

// QPState is a QP state (values of enum ibv_qp_state).
type QPState uint8

const (
	StateReset QPState = iota // IBV_QPS_RESET
	StateInit                 // IBV_QPS_INIT
	StateRTR                  // IBV_QPS_RTR
	StateRTS                  // IBV_QPS_RTS
	StateSQD                  // IBV_QPS_SQD
	StateSQE                  // IBV_QPS_SQE
	StateErr                  // IBV_QPS_ERR

	numStates = int(StateErr) + 1
)

var stateNames = [numStates]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

func (s QPState) String() string {
	if int(s) < numStates {
		return stateNames[s]
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// AttrMask selects the ibv_qp_attr fields an ibv_modify_qp call changes
// (bit values of enum ibv_qp_attr_mask).
type AttrMask uint32

const (
	AttrState            AttrMask = 1 << 0  // IBV_QP_STATE
	AttrCurState         AttrMask = 1 << 1  // IBV_QP_CUR_STATE
	AttrEnSQDAsyncNotify AttrMask = 1 << 2  // IBV_QP_EN_SQD_ASYNC_NOTIFY
	AttrAccessFlags      AttrMask = 1 << 3  // IBV_QP_ACCESS_FLAGS
	AttrPKeyIndex        AttrMask = 1 << 4  // IBV_QP_PKEY_INDEX
	AttrPort             AttrMask = 1 << 5  // IBV_QP_PORT
	AttrQKey             AttrMask = 1 << 6  // IBV_QP_QKEY
	AttrAV               AttrMask = 1 << 7  // IBV_QP_AV
	AttrPathMTU          AttrMask = 1 << 8  // IBV_QP_PATH_MTU
	AttrTimeout          AttrMask = 1 << 9  // IBV_QP_TIMEOUT
	AttrRetryCnt         AttrMask = 1 << 10 // IBV_QP_RETRY_CNT
	AttrRNRRetry         AttrMask = 1 << 11 // IBV_QP_RNR_RETRY
	AttrRQPSN            AttrMask = 1 << 12 // IBV_QP_RQ_PSN
	AttrMaxQPRdAtomic    AttrMask = 1 << 13 // IBV_QP_MAX_QP_RD_ATOMIC (sets max_rd_atomic)
	AttrAltPath          AttrMask = 1 << 14 // IBV_QP_ALT_PATH
	AttrMinRNRTimer      AttrMask = 1 << 15 // IBV_QP_MIN_RNR_TIMER
	AttrSQPSN            AttrMask = 1 << 16 // IBV_QP_SQ_PSN
	AttrMaxDestRdAtomic  AttrMask = 1 << 17 // IBV_QP_MAX_DEST_RD_ATOMIC
	AttrPathMigState     AttrMask = 1 << 18 // IBV_QP_PATH_MIG_STATE
	AttrCap              AttrMask = 1 << 19 // IBV_QP_CAP
	AttrDestQPN          AttrMask = 1 << 20 // IBV_QP_DEST_QPN
	AttrRateLimit        AttrMask = 1 << 25 // IBV_QP_RATE_LIMIT
)

// attrNames gives each mask bit the name used in String and in errors, and
// its enum ibv_qp_attr_mask name (VerbsString). The short names follow the
// IBV_QP_* suffix, except MAX_QP_RD_ATOMIC, which is named after the
// ibv_qp_attr field it sets (max_rd_atomic) so that it is not confused with
// max_dest_rd_atomic.
var attrNames = [...]struct {
	bit       AttrMask
	name, ibv string
}{
	{AttrState, "state", "IBV_QP_STATE"},
	{AttrCurState, "cur_state", "IBV_QP_CUR_STATE"},
	{AttrEnSQDAsyncNotify, "en_sqd_async_notify", "IBV_QP_EN_SQD_ASYNC_NOTIFY"},
	{AttrAccessFlags, "access_flags", "IBV_QP_ACCESS_FLAGS"},
	{AttrPKeyIndex, "pkey_index", "IBV_QP_PKEY_INDEX"},
	{AttrPort, "port", "IBV_QP_PORT"},
	{AttrQKey, "qkey", "IBV_QP_QKEY"},
	{AttrAV, "av", "IBV_QP_AV"},
	{AttrPathMTU, "path_mtu", "IBV_QP_PATH_MTU"},
	{AttrTimeout, "timeout", "IBV_QP_TIMEOUT"},
	{AttrRetryCnt, "retry_cnt", "IBV_QP_RETRY_CNT"},
	{AttrRNRRetry, "rnr_retry", "IBV_QP_RNR_RETRY"},
	{AttrRQPSN, "rq_psn", "IBV_QP_RQ_PSN"},
	{AttrMaxQPRdAtomic, "max_rd_atomic", "IBV_QP_MAX_QP_RD_ATOMIC"},
	{AttrAltPath, "alt_path", "IBV_QP_ALT_PATH"},
	{AttrMinRNRTimer, "min_rnr_timer", "IBV_QP_MIN_RNR_TIMER"},
	{AttrSQPSN, "sq_psn", "IBV_QP_SQ_PSN"},
	{AttrMaxDestRdAtomic, "max_dest_rd_atomic", "IBV_QP_MAX_DEST_RD_ATOMIC"},
	{AttrPathMigState, "path_mig_state", "IBV_QP_PATH_MIG_STATE"},
	{AttrCap, "cap", "IBV_QP_CAP"},
	{AttrDestQPN, "dest_qpn", "IBV_QP_DEST_QPN"},
	{AttrRateLimit, "rate_limit", "IBV_QP_RATE_LIMIT"},
}

// String lists the set bits in ascending order, e.g. "path_mtu|dest_qpn".
// Bits without a name (libibverbs-internal ones) are shown as one hex value.
// The empty mask is "none".
func (m AttrMask) String() string { return m.names(false) }

// VerbsString is String with the enum ibv_qp_attr_mask names, as in
// ibv_modify_qp(3): "IBV_QP_STATE|IBV_QP_PATH_MTU". Errors of a modify show
// the whole mask this way.
func (m AttrMask) VerbsString() string { return m.names(true) }

func (m AttrMask) names(ibv bool) string {
	if m == 0 {
		return "none"
	}
	var parts []string
	for _, a := range attrNames {
		if m&a.bit != 0 {
			if ibv {
				parts = append(parts, a.ibv)
			} else {
				parts = append(parts, a.name)
			}
			m &^= a.bit
		}
	}
	if m != 0 {
		parts = append(parts, fmt.Sprintf("0x%x", uint32(m)))
	}
	return strings.Join(parts, "|")
}

// Values lists the values of the scalar attributes mask selects, in mask
// order, e.g. "state=RTS timeout=14 retry_cnt=6 sq_psn=0x1234" (the address
// vector as its GRH traffic class, service level and sgid index; access
// flags by name). Errors of a modify show it, so a refused value is visible.
func (a *QPAttr) Values(mask AttrMask) string {
	var b strings.Builder
	add := func(format string, args ...any) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, format, args...)
	}
	for _, n := range attrNames {
		if mask&n.bit == 0 {
			continue
		}
		switch n.bit {
		case AttrState:
			add("state=%s", a.State)
		case AttrCurState:
			add("cur_state=%s", a.CurState)
		case AttrAccessFlags:
			add("access_flags=%s", a.AccessFlags)
		case AttrPKeyIndex:
			add("pkey_index=%d", a.PKeyIndex)
		case AttrPort:
			add("port=%d", a.PortNum)
		case AttrQKey:
			add("qkey=0x%x", a.QKey)
		case AttrAV:
			add("av.sl=%d", a.AH.SL)
			if a.AH.IsGlobal {
				add("av.traffic_class=%d av.sgid_index=%d av.hop_limit=%d", a.AH.TrafficClass, a.AH.SGIDIndex, a.AH.HopLimit)
			}
		case AttrPathMTU:
			add("path_mtu=%s", a.PathMTU)
		case AttrTimeout:
			add("timeout=%d", a.Timeout)
		case AttrRetryCnt:
			add("retry_cnt=%d", a.RetryCnt)
		case AttrRNRRetry:
			add("rnr_retry=%d", a.RNRRetry)
		case AttrRQPSN:
			add("rq_psn=0x%x", a.RQPSN)
		case AttrMaxQPRdAtomic:
			add("max_rd_atomic=%d", a.MaxRdAtomic)
		case AttrMinRNRTimer:
			add("min_rnr_timer=%d", a.MinRNRTimer)
		case AttrSQPSN:
			add("sq_psn=0x%x", a.SQPSN)
		case AttrMaxDestRdAtomic:
			add("max_dest_rd_atomic=%d", a.MaxDestRdAtomic)
		case AttrDestQPN:
			add("dest_qpn=0x%x", a.DestQPN)
		}
	}
	return b.String()
}

// MTU is a path MTU (values of enum ibv_mtu).
type MTU uint8

const (
	MTU256  MTU = iota + 1 // IBV_MTU_256
	MTU512                 // IBV_MTU_512
	MTU1024                // IBV_MTU_1024
	MTU2048                // IBV_MTU_2048
	MTU4096                // IBV_MTU_4096
)

// Bytes returns the MTU in bytes, or 0 if m is not a valid MTU.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// String returns the size in bytes ("1024"), or "MTU(n)" if m is invalid.
func (m MTU) String() string {
	if b := m.Bytes(); b != 0 {
		return fmt.Sprint(b)
	}
	return fmt.Sprintf("MTU(%d)", uint8(m))
}

// AccessFlags are the remote access rights of a QP or MR (enum ibv_access_flags).
type AccessFlags uint32

const (
	AccessLocalWrite   AccessFlags = 1 << 0 // IBV_ACCESS_LOCAL_WRITE
	AccessRemoteWrite  AccessFlags = 1 << 1 // IBV_ACCESS_REMOTE_WRITE
	AccessRemoteRead   AccessFlags = 1 << 2 // IBV_ACCESS_REMOTE_READ
	AccessRemoteAtomic AccessFlags = 1 << 3 // IBV_ACCESS_REMOTE_ATOMIC
	AccessMWBind       AccessFlags = 1 << 4 // IBV_ACCESS_MW_BIND (MRs only: memory windows may be bound to it)
	// IBV_ACCESS_FLUSH_GLOBAL and IBV_ACCESS_FLUSH_PERSISTENT: the QP serves
	// RDMA FLUSH. rdma_cm's initial attributes grant both, beside remote
	// read, on devices that support FLUSH (rxe from Linux 6.2).
	AccessFlushGlobal     AccessFlags = 1 << 8
	AccessFlushPersistent AccessFlags = 1 << 9

	// qpAccessKnown is what a QP's access_flags may contain.
	qpAccessKnown = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic |
		AccessFlushGlobal | AccessFlushPersistent
)

// String lists the set flags, e.g. "local_write|remote_read"; "none" for 0.
func (f AccessFlags) String() string {
	if f == 0 {
		return "none"
	}
	var parts []string
	for _, a := range [...]struct {
		bit  AccessFlags
		name string
	}{
		{AccessLocalWrite, "local_write"},
		{AccessRemoteWrite, "remote_write"},
		{AccessRemoteRead, "remote_read"},
		{AccessRemoteAtomic, "remote_atomic"},
		{AccessMWBind, "mw_bind"},
		{AccessFlushGlobal, "flush_global"},
		{AccessFlushPersistent, "flush_persistent"},
	} {
		if f&a.bit != 0 {
			parts = append(parts, a.name)
			f &^= a.bit
		}
	}
	if f != 0 {
		parts = append(parts, fmt.Sprintf("0x%x", uint32(f)))
	}
	return strings.Join(parts, "|")
}

// AHAttr is an address vector (struct ibv_ah_attr with its GRH flattened).
type AHAttr struct {
	IsGlobal     bool // GRH present; mandatory on RoCE
	DGID         [16]byte
	FlowLabel    uint32
	SGIDIndex    uint8
	HopLimit     uint8
	TrafficClass uint8
	DLID         uint16
	SL           uint8
	SrcPathBits  uint8
	StaticRate   uint8
	PortNum      uint8
}

// QPAttr holds the ibv_qp_attr fields the library sets. Only the fields
// selected by the accompanying AttrMask are meaningful.
type QPAttr struct {
	State, CurState                                                        QPState
	PathMTU                                                                MTU
	QKey, RQPSN, SQPSN, DestQPN                                            uint32
	AccessFlags                                                            AccessFlags
	PKeyIndex                                                              uint16
	PortNum                                                                uint8
	AH                                                                     AHAttr
	MaxRdAtomic, MaxDestRdAtomic, MinRNRTimer, Timeout, RetryCnt, RNRRetry uint8
}

// PortLimits is what the port/device allows, used for value checks.
// A zero field means "not checked", except where noted.
type PortLimits struct {
	PhysPorts       uint8       // number of ports on the device (port numbers are 1..PhysPorts)
	ActiveMTU       MTU         // path_mtu must not exceed this
	GIDTableLen     int         // sgid_index must be < this
	Ethernet        bool        // RoCE link layer: AV must have IsGlobal (GRH) with a valid sgid_index
	MaxQPRdAtom     uint8       // device limit for max_dest_rd_atomic (responder resources)
	MaxQPInitRdAtom uint8       // device limit for max_rd_atomic (initiator depth)
	MaxPKeys        uint16      // pkey_index must be < this
	AllowedAccess   AccessFlags // QP access_flags must be a subset of this
}

var (
	// ErrIllegalTransition: the QP type does not allow going from the
	// current state to the requested one.
	ErrIllegalTransition = errors.New("illegal QP state transition")
	// ErrInvalidAttr: an attribute is missing, not allowed in this
	// transition, or has an out-of-range value.
	ErrInvalidAttr = errors.New("invalid QP attribute")
	// ErrUnsupportedQPType: the state table covers RC, UC and UD only.
	ErrUnsupportedQPType = errors.New("unsupported QP type")
)

// TransitionError is a modify refused in Go, before the kernel saw it. It
// names the QP, both states, the attribute mask asked for and the offending
// attribute. Attr is the attribute's name (AttrMask.String spelling, or e.g.
// "ah.sgid_index" for a field inside the address vector); it is empty for an
// illegal transition. Reason is the human-readable detail after the prefix.
type TransitionError struct {
	QPN      uint32
	Type     QPType
	From, To QPState
	Mask     AttrMask // the attributes the modify asked to set (0: not recorded)
	Attr     string
	Reason   string

	kind error // sentinel matched by errors.Is; see Unwrap
}

func (e *TransitionError) Error() string {
	return modifyPrefix(e.QPN, e.Type, e.From, e.To, e.Mask) + ": " + e.Reason
}

// modifyPrefix is what every modify error starts with:
// "modify QP 0x1a (RC) INIT->RTR [IBV_QP_STATE|IBV_QP_AV|...]".
func modifyPrefix(qpn uint32, typ QPType, from, to QPState, mask AttrMask) string {
	s := fmt.Sprintf("modify QP 0x%x (%s) %s->%s", qpn, typ, from, to)
	if mask != 0 {
		s += " [" + mask.VerbsString() + "]"
	}
	return s
}

// ModifyError is a modify the device (ibv_modify_qp) refused after the Go
// checks passed: the QP, both states, the mask in ibv_qp_attr_mask names,
// the values of the attributes set, and the error (a syscall.Errno from
// ibv_modify_qp, which Unwrap returns, so errors.Is(err, syscall.EINVAL)
// holds).
type ModifyError struct {
	QPN      uint32
	Type     QPType
	From, To QPState
	Mask     AttrMask
	Values   string // QPAttr.Values(Mask)
	Err      error
}

func (e *ModifyError) Error() string {
	s := modifyPrefix(e.QPN, e.Type, e.From, e.To, e.Mask)
	if e.Values != "" {
		s += " (" + e.Values + ")"
	}
	return s + ": " + e.Err.Error()
}

func (e *ModifyError) Unwrap() error { return e.Err }

// Unwrap returns ErrIllegalTransition, ErrInvalidAttr or
// ErrUnsupportedQPType. For a TransitionError built outside this package
// it falls back to "no Attr means illegal transition".
func (e *TransitionError) Unwrap() error {
	switch {
	case e.kind != nil:
		return e.kind
	case e.Attr == "":
		return ErrIllegalTransition
	default:
		return ErrInvalidAttr
	}
}

// masks are the attributes a transition requires and additionally permits
// for one QP type (AttrState is added by TransitionMasks, not stored here).
type masks struct{ req, opt AttrMask }

// transitionRule is one from->to cell of the table.
type transitionRule struct {
	valid      bool // transition allowed at all (for every supported type)
	rc, uc, ud masks
}

func (r *transitionRule) forType(t QPType) masks {
	switch t {
	case QPTypeRC:
		return r.rc
	case QPTypeUC:
		return r.uc
	default:
		return r.ud
	}
}

// qpStateTable[from][to] is the IB spec / kernel qp_state_table restricted
// to RC, UC and UD. A zero cell is an illegal transition. AttrRateLimit is
// allowed nowhere (the kernel permits it for raw packet QPs only).
var qpStateTable = func() (t [numStates][numStates]transitionRule) {
	// Attributes shared by several cells.
	const (
		// The path-level attributes RC and UC may retune while sending.
		rcucPath = AttrAltPath | AttrAccessFlags | AttrPathMigState
		// cur_state lets the caller assert the state the QP is in; the
		// kernel accepts it only where the QP may have moved on its own
		// (RTR/RTS/SQD/SQE) to a state it can send from.
		cur = AttrCurState
	)

	// Connection setup. UD has no peer, so it carries a Q_Key instead of
	// access flags and needs nothing to reach RTR.
	t[StateReset][StateInit] = transitionRule{valid: true,
		rc: masks{req: AttrPKeyIndex | AttrPort | AttrAccessFlags},
		uc: masks{req: AttrPKeyIndex | AttrPort | AttrAccessFlags},
		ud: masks{req: AttrPKeyIndex | AttrPort | AttrQKey},
	}
	t[StateInit][StateInit] = transitionRule{valid: true,
		rc: masks{opt: AttrPKeyIndex | AttrPort | AttrAccessFlags},
		uc: masks{opt: AttrPKeyIndex | AttrPort | AttrAccessFlags},
		ud: masks{opt: AttrPKeyIndex | AttrPort | AttrQKey},
	}
	// RTR fixes the receive side: who the peer is and the first PSN we
	// expect; RC also sizes its responder resources and RNR NAK timer.
	t[StateInit][StateRTR] = transitionRule{valid: true,
		rc: masks{
			req: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer,
			opt: AttrAltPath | AttrAccessFlags | AttrPKeyIndex,
		},
		uc: masks{
			req: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN,
			opt: AttrAltPath | AttrAccessFlags | AttrPKeyIndex,
		},
		ud: masks{opt: AttrPKeyIndex | AttrQKey},
	}
	// RTS enables the send side: first PSN to send; RC adds its ack
	// timeout, retry budgets and initiator depth.
	t[StateRTR][StateRTS] = transitionRule{valid: true,
		rc: masks{
			req: AttrSQPSN | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic,
			opt: cur | rcucPath | AttrMinRNRTimer,
		},
		uc: masks{req: AttrSQPSN, opt: cur | rcucPath},
		ud: masks{req: AttrSQPSN, opt: cur | AttrQKey},
	}
	// Attribute-only modify while running.
	t[StateRTS][StateRTS] = transitionRule{valid: true,
		rc: masks{opt: cur | rcucPath | AttrMinRNRTimer},
		uc: masks{opt: cur | rcucPath},
		ud: masks{opt: cur | AttrQKey},
	}
	// Drain the send queue; optionally ask for the SQ drained event.
	t[StateRTS][StateSQD] = transitionRule{valid: true,
		rc: masks{opt: AttrEnSQDAsyncNotify},
		uc: masks{opt: AttrEnSQDAsyncNotify},
		ud: masks{opt: AttrEnSQDAsyncNotify},
	}
	// Resume sending after a drain.
	t[StateSQD][StateRTS] = transitionRule{valid: true,
		rc: masks{opt: cur | rcucPath | AttrMinRNRTimer},
		uc: masks{opt: cur | rcucPath},
		ud: masks{opt: cur | AttrQKey},
	}
	// While drained, most of the path (even the port and AV for RC) may be
	// changed; this is what SQD exists for.
	t[StateSQD][StateSQD] = transitionRule{valid: true,
		rc: masks{opt: AttrPort | AttrAV | AttrTimeout | AttrRetryCnt | AttrRNRRetry |
			AttrMaxQPRdAtomic | AttrMaxDestRdAtomic | AttrAltPath | AttrAccessFlags |
			AttrPKeyIndex | AttrMinRNRTimer | AttrPathMigState},
		uc: masks{opt: AttrAV | AttrAltPath | AttrAccessFlags | AttrPKeyIndex | AttrPathMigState},
		ud: masks{opt: AttrPKeyIndex | AttrQKey},
	}
	// Recover from a send queue error. RC never enters SQE (its send
	// errors move it to ERR); the kernel still lists the cell, with
	// nothing but the state allowed.
	t[StateSQE][StateRTS] = transitionRule{valid: true,
		uc: masks{opt: cur | AttrAccessFlags},
		ud: masks{opt: cur | AttrQKey},
	}
	// Any state may be reset or errored, with no attribute but the state.
	for from := range numStates {
		t[from][StateReset] = transitionRule{valid: true}
		t[from][StateErr] = transitionRule{valid: true}
	}
	return t
}()

func supportedType(t QPType) bool {
	return t == QPTypeRC || t == QPTypeUC || t == QPTypeUD
}

// TransitionMasks returns the attributes required and additionally allowed
// when a QP of type typ moves from one state to another. AttrState is in
// required when the state changes and in optional for an attribute-only
// modify (from == to), where it may be given or left out. ok is false for an
// illegal transition, an unsupported type or an out-of-range state.
func TransitionMasks(typ QPType, from, to QPState) (required, optional AttrMask, ok bool) {
	if !supportedType(typ) || int(from) >= numStates || int(to) >= numStates {
		return 0, 0, false
	}
	r := &qpStateTable[from][to]
	if !r.valid {
		return 0, 0, false
	}
	m := r.forType(typ)
	if from != to {
		return m.req | AttrState, m.opt, true
	}
	return m.req, m.opt | AttrState, true
}

// Value limits from the IB spec field widths.
const (
	max24       = 1<<24 - 1 // PSNs and QP numbers are 24 bits
	maxTimer5   = 31        // timeout and min_rnr_timer are 5-bit codes
	maxRetry3   = 7         // retry_cnt and rnr_retry are 3 bits (7 = infinite RNR retry)
	maxSL       = 15        // service level is 4 bits
	maxFlowLbl  = 1<<20 - 1 // GRH flow label is 20 bits
	firstPortNo = 1         // CA ports are numbered from 1
)

// CheckTransition validates modifying a QP of type typ from cur with
// (attr, mask), in this order:
//
//   - the target state is attr.State if mask has AttrState, else cur (an
//     attribute-only modify, legal only where the table has a from==to cell:
//     INIT, RTS, SQD, and trivially RESET and ERR);
//   - the transition is legal for typ (ErrIllegalTransition);
//   - every required attribute is in mask and nothing outside
//     required|optional is (ErrInvalidAttr, naming all offenders);
//   - if AttrCurState is given, attr.CurState must equal cur, because the
//     kernel validates against cur_qp_state and the two must agree;
//   - every attribute in mask has a value the spec and lim allow.
//
// attr must not be nil.
func CheckTransition(qpn uint32, typ QPType, cur QPState, attr *QPAttr, mask AttrMask, lim PortLimits) error {
	to := cur
	if attr != nil && mask&AttrState != 0 {
		to = attr.State
	}
	fail := func(kind error, name, format string, args ...any) error {
		return &TransitionError{QPN: qpn, Type: typ, From: cur, To: to, Mask: mask,
			Attr: name, Reason: fmt.Sprintf(format, args...), kind: kind}
	}

	if !supportedType(typ) {
		return fail(ErrUnsupportedQPType, "qp_type", "unsupported QP type")
	}
	if attr == nil {
		return fail(ErrInvalidAttr, "attr", "nil attributes")
	}
	if int(to) >= numStates {
		return fail(ErrInvalidAttr, "state", "target state %s out of range", to)
	}
	req, opt, ok := TransitionMasks(typ, cur, to)
	if !ok {
		return fail(ErrIllegalTransition, "", "illegal transition")
	}
	if missing := req &^ mask; missing != 0 {
		return fail(ErrInvalidAttr, missing.String(), "missing required %s %s", plural("attribute", missing), missing)
	}
	if extra := mask &^ (req | opt); extra != 0 {
		return fail(ErrInvalidAttr, extra.String(), "%s %s not allowed for %s in this transition",
			plural("attribute", extra), extra, typ)
	}
	if mask&AttrCurState != 0 && attr.CurState != cur {
		return fail(ErrInvalidAttr, "cur_state", "cur_state %s does not match the QP's state %s", attr.CurState, cur)
	}

	// Value checks, only for the attributes being set.
	bad := func(name, format string, args ...any) error {
		return fail(ErrInvalidAttr, name, name+" "+format, args...)
	}
	if mask&AttrPKeyIndex != 0 && lim.MaxPKeys != 0 && attr.PKeyIndex >= lim.MaxPKeys {
		return bad("pkey_index", "%d out of range (P_Key table has %d entries)", attr.PKeyIndex, lim.MaxPKeys)
	}
	if mask&AttrPort != 0 {
		if err := checkPort("port", attr.PortNum, lim, bad); err != nil {
			return err
		}
	}
	if mask&AttrAccessFlags != 0 {
		f := attr.AccessFlags
		if unknown := f &^ qpAccessKnown; unknown != 0 {
			return bad("access_flags", "has unknown bits 0x%x", uint32(unknown))
		}
		// UC is send and RDMA write only: the responder never serves
		// reads or atomics, so granting them is a bug in the caller.
		if noUC := f & (AccessRemoteRead | AccessRemoteAtomic); typ == QPTypeUC && noUC != 0 {
			return bad("access_flags", "%s not supported by UC", noUC)
		}
		if lim.AllowedAccess != 0 && f&^lim.AllowedAccess != 0 {
			return bad("access_flags", "%s not permitted (allowed: %s)", f&^lim.AllowedAccess, lim.AllowedAccess)
		}
	}
	if mask&AttrAV != 0 {
		if err := checkAV(&attr.AH, lim, bad); err != nil {
			return err
		}
	}
	if mask&AttrPathMTU != 0 {
		if attr.PathMTU.Bytes() == 0 {
			return bad("path_mtu", "%s invalid (want 256..4096)", attr.PathMTU)
		}
		if lim.ActiveMTU != 0 && attr.PathMTU > lim.ActiveMTU {
			return bad("path_mtu", "%s exceeds port active_mtu %s", attr.PathMTU, lim.ActiveMTU)
		}
	}
	if mask&AttrTimeout != 0 && attr.Timeout > maxTimer5 {
		return bad("timeout", "%d exceeds %d", attr.Timeout, maxTimer5)
	}
	if mask&AttrRetryCnt != 0 && attr.RetryCnt > maxRetry3 {
		return bad("retry_cnt", "%d exceeds %d", attr.RetryCnt, maxRetry3)
	}
	if mask&AttrRNRRetry != 0 && attr.RNRRetry > maxRetry3 {
		return bad("rnr_retry", "%d exceeds %d", attr.RNRRetry, maxRetry3)
	}
	if mask&AttrRQPSN != 0 && attr.RQPSN > max24 {
		return bad("rq_psn", "0x%x exceeds 24 bits", attr.RQPSN)
	}
	if mask&AttrMaxQPRdAtomic != 0 && lim.MaxQPInitRdAtom != 0 && attr.MaxRdAtomic > lim.MaxQPInitRdAtom {
		return bad("max_rd_atomic", "%d exceeds device max_qp_init_rd_atom %d", attr.MaxRdAtomic, lim.MaxQPInitRdAtom)
	}
	if mask&AttrMinRNRTimer != 0 && attr.MinRNRTimer > maxTimer5 {
		return bad("min_rnr_timer", "%d exceeds %d", attr.MinRNRTimer, maxTimer5)
	}
	if mask&AttrSQPSN != 0 && attr.SQPSN > max24 {
		return bad("sq_psn", "0x%x exceeds 24 bits", attr.SQPSN)
	}
	if mask&AttrMaxDestRdAtomic != 0 && lim.MaxQPRdAtom != 0 && attr.MaxDestRdAtomic > lim.MaxQPRdAtom {
		return bad("max_dest_rd_atomic", "%d exceeds device max_qp_rd_atom %d", attr.MaxDestRdAtomic, lim.MaxQPRdAtom)
	}
	if mask&AttrDestQPN != 0 && attr.DestQPN > max24 {
		return bad("dest_qpn", "0x%x exceeds 24 bits", attr.DestQPN)
	}
	return nil
}

type badFunc func(name, format string, args ...any) error

// checkPort: ports are numbered 1..PhysPorts; 0 is never a valid CA port.
func checkPort(name string, port uint8, lim PortLimits, bad badFunc) error {
	if port < firstPortNo {
		return bad(name, "0 invalid (ports are numbered from 1)")
	}
	if lim.PhysPorts != 0 && port > lim.PhysPorts {
		return bad(name, "%d out of range (device has %d ports)", port, lim.PhysPorts)
	}
	return nil
}

// checkAV validates the primary address vector.
func checkAV(ah *AHAttr, lim PortLimits, bad badFunc) error {
	// RoCE addresses the peer by GID only (there are no LIDs on Ethernet),
	// so the GRH is mandatory there.
	if lim.Ethernet && !ah.IsGlobal {
		return bad("ah.is_global", "false on a RoCE port (the address vector needs a GRH)")
	}
	if ah.IsGlobal {
		if lim.GIDTableLen != 0 && int(ah.SGIDIndex) >= lim.GIDTableLen {
			return bad("ah.sgid_index", "%d out of range (GID table has %d entries)", ah.SGIDIndex, lim.GIDTableLen)
		}
		if ah.FlowLabel > maxFlowLbl {
			return bad("ah.flow_label", "0x%x exceeds 20 bits", ah.FlowLabel)
		}
	}
	if ah.SL > maxSL {
		return bad("ah.sl", "%d exceeds %d", ah.SL, maxSL)
	}
	if ah.PortNum != 0 { // 0: the QP's port is used
		return checkPort("ah.port_num", ah.PortNum, lim, bad)
	}
	return nil
}

func plural(word string, m AttrMask) string {
	if m&(m-1) != 0 {
		return word + "s"
	}
	return word
}

// StateGuard serializes the transitions of one QP and tracks its state, so
// that the state CheckTransition validates against is the state the kernel
// has (as far as the library knows; see Force).
type StateGuard struct {
	mu    sync.Mutex
	qpn   uint32
	typ   QPType
	iwarp bool // INIT takes only access flags (QPConfig.IWARP)
	state QPState
}

// NewStateGuard returns a guard for a freshly created QP, in StateReset.
func NewStateGuard(qpn uint32, typ QPType) *StateGuard {
	return &StateGuard{qpn: qpn, typ: typ, state: StateReset}
}

// newGuard is the guard for a QP of type typ on an iWARP device or not
// (QPConfig.IWARP).
func newGuard(qpn uint32, typ QPType, iwarp bool) *StateGuard {
	g := NewStateGuard(qpn, typ)
	g.iwarp = iwarp && typ == QPTypeRC
	return g
}

// checkIWARPInit validates a move of an iWARP RC QP into INIT (from RESET
// or INIT): the access flags, which a state change requires, and nothing
// else (rdma_init_qp_attr gives an iWARP id only those; the device has no
// P_Keys and the CM ties the QP to its port).
func checkIWARPInit(qpn uint32, cur QPState, attr *QPAttr, mask AttrMask) error {
	req, opt := AttrState|AttrAccessFlags, AttrPKeyIndex|AttrPort
	if cur == StateInit {
		req, opt = 0, AttrState|AttrAccessFlags|AttrPKeyIndex|AttrPort
	}
	fail := func(name, format string, args ...any) error {
		return &TransitionError{QPN: qpn, Type: QPTypeRC, From: cur, To: StateInit, Mask: mask,
			Attr: name, Reason: fmt.Sprintf(format, args...), kind: ErrInvalidAttr}
	}
	if missing := req &^ mask; missing != 0 {
		return fail(missing.String(), "missing required %s %s (iWARP)", plural("attribute", missing), missing)
	}
	if extra := mask &^ (req | opt); extra != 0 {
		return fail(extra.String(), "%s %s not allowed for an iWARP RC QP moving to INIT", plural("attribute", extra), extra)
	}
	if mask&AttrAccessFlags != 0 && attr.AccessFlags&^qpAccessKnown != 0 {
		return fail("access_flags", "unknown access flags %s", attr.AccessFlags&^qpAccessKnown)
	}
	return nil
}

// State returns the QP's current state.
func (g *StateGuard) State() QPState {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state
}

// Modify validates (attr, mask) against the current state and, only if
// that passes, calls apply (the real ibv_modify_qp). The guard's lock is held
// throughout, so concurrent Modify calls on one QP run one after another,
// each seeing the state the previous one left. On success the state becomes
// the target; if apply fails the state is unchanged and apply's error is
// returned in a *ModifyError (QP, states, mask and values).
func (g *StateGuard) Modify(attr *QPAttr, mask AttrMask, lim PortLimits, apply func(*QPAttr, AttrMask) error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	to := g.state
	if attr != nil && mask&AttrState != 0 {
		to = attr.State
	}
	check := CheckTransition
	if g.iwarp && to == StateInit && (g.state == StateReset || g.state == StateInit) {
		check = func(qpn uint32, _ QPType, cur QPState, attr *QPAttr, mask AttrMask, _ PortLimits) error {
			return checkIWARPInit(qpn, cur, attr, mask)
		}
	}
	if err := check(g.qpn, g.typ, g.state, attr, mask, lim); err != nil {
		return err
	}
	if err := apply(attr, mask); err != nil {
		return &ModifyError{QPN: g.qpn, Type: g.typ, From: g.state, To: to, Mask: mask,
			Values: attr.Values(mask), Err: err}
	}
	g.state = to
	return nil
}

// Force records a state change that happened outside the library's request
// (e.g. the QP went to ERR asynchronously, or a query showed another state).
func (g *StateGuard) Force(s QPState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.state = s
}
