//go:build linux && cgo

package verbs

/*
#include <stddef.h>
#include <string.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

// gosendwr / gorecvwr are the flat work requests shared with Go (layouts = verbs.SendWR / RecvWR).
typedef struct {
	uint64_t wr_id, addr, remote_addr;
	uint32_t len, lkey, opcode, flags, imm, rkey;
	uint64_t compare_add, swap; // atomics only
	uint64_t tail_addr;         // a second SGE after addr/len when tail_len > 0
	uint32_t tail_len, tail_lkey;
} gosendwr;
enum { offsetof_gosendwr_tail_addr = offsetof(gosendwr, tail_addr) };
typedef struct {
	uint64_t wr_id, addr;
	uint32_t len, lkey;
} gorecvwr;

// gobindwr is a memory-window bind posted ahead of a batch of sends (built
// by QP.PostBindSend from a BindWR). rkey is the window's key after the bind.
typedef struct {
	struct ibv_mw *mw;
	struct ibv_mr *mr;
	uint64_t wr_id, addr, len;
	uint32_t access, rkey, flags, pad;
} gobindwr;

#define POST_BATCH 64

// post_send chains an optional window bind b and n work requests (one SGE
// each, none for zero length, and a second for a tail) and posts them in one ibv_post_send: one
// doorbell. Returns 0, or -(errno + 256*bad) where bad is the index of the
// first request not posted, the bind counting as request 0 (no
// out-parameter: a Go pointer argument would make the caller allocate).
static int post_send(struct ibv_qp *qp, gobindwr *b, gosendwr *in, int n) {
	struct ibv_send_wr wr[POST_BATCH + 1], *badwr = NULL;
	struct ibv_sge sge[2 * POST_BATCH];
	if (n > POST_BATCH) n = POST_BATCH;
	int k = b ? 1 : 0;
	memset(wr, 0, sizeof(wr[0]) * (n + k));
	if (b) {
		wr[0].wr_id = b->wr_id;
		wr[0].opcode = IBV_WR_BIND_MW;
		wr[0].send_flags = b->flags;
		wr[0].bind_mw.mw = b->mw;
		wr[0].bind_mw.rkey = b->rkey;
		wr[0].bind_mw.bind_info.mr = b->mr;
		wr[0].bind_mw.bind_info.addr = b->addr;
		wr[0].bind_mw.bind_info.length = b->len;
		wr[0].bind_mw.bind_info.mw_access_flags = b->access;
		wr[0].next = n > 0 ? &wr[1] : NULL;
	}
	for (int i = 0; i < n; i++) {
		struct ibv_send_wr *w = &wr[k + i];
		struct ibv_sge *s = &sge[2 * i];
		int ns = 0;
		if (in[i].len) {
			s[ns].addr = in[i].addr;
			s[ns].length = in[i].len;
			s[ns].lkey = in[i].lkey;
			ns++;
		}
		if (in[i].tail_len) {
			s[ns].addr = in[i].tail_addr;
			s[ns].length = in[i].tail_len;
			s[ns].lkey = in[i].tail_lkey;
			ns++;
		}
		w->wr_id = in[i].wr_id;
		w->sg_list = s;
		w->num_sge = ns;
		w->opcode = in[i].opcode;
		w->send_flags = in[i].flags;
		w->imm_data = htonl(in[i].imm);
		if (in[i].opcode == IBV_WR_LOCAL_INV)
			w->invalidate_rkey = in[i].rkey; // shares a union with imm_data
		if (in[i].opcode == IBV_WR_ATOMIC_CMP_AND_SWP || in[i].opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
			// wr.atomic shares a union with wr.rdma, its rkey elsewhere.
			w->wr.atomic.remote_addr = in[i].remote_addr;
			w->wr.atomic.compare_add = in[i].compare_add;
			w->wr.atomic.swap = in[i].swap;
			w->wr.atomic.rkey = in[i].rkey;
		} else {
			w->wr.rdma.remote_addr = in[i].remote_addr;
			w->wr.rdma.rkey = in[i].rkey;
		}
		w->next = i + 1 < n ? &wr[k + i + 1] : NULL;
	}
	int ret = ibv_post_send(qp, wr, &badwr);
	int bad = ret == 0 ? n + k : badwr ? (int)(badwr - wr) : 0;
	// Providers name the window by its current rkey in the next bind (rxe
	// passes it to the kernel, which checks it), as ibv_bind_mw does.
	if (b && bad > 0) b->mw->rkey = b->rkey;
	if (ret == 0) return 0;
	return -((ret > 0 ? ret : -ret) + 256 * bad);
}

static int post_recv(struct ibv_qp *qp, gorecvwr *in, int n) {
	struct ibv_recv_wr wr[POST_BATCH], *badwr = NULL;
	struct ibv_sge sge[POST_BATCH];
	if (n > POST_BATCH) n = POST_BATCH;
	for (int i = 0; i < n; i++) {
		sge[i].addr = in[i].addr;
		sge[i].length = in[i].len;
		sge[i].lkey = in[i].lkey;
		wr[i].wr_id = in[i].wr_id;
		wr[i].sg_list = &sge[i];
		wr[i].num_sge = in[i].len ? 1 : 0;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	int ret = ibv_post_recv(qp, wr, &badwr);
	if (ret == 0) return 0;
	int bad = badwr ? (int)(badwr - wr) : 0;
	return -((ret > 0 ? ret : -ret) + 256 * bad);
}

// post_recv_send posts receives, then sends, in one crossing from Go: a
// receiver that answers (a ping-pong) reposts what it read with its reply.
// The receives go first, so credits the sends grant are for posted
// receives. Returns 0, or the failed call's code with 1<<20 set when it
// was the send.
static int post_recv_send(struct ibv_qp *qp, gorecvwr *rin, int nr, gobindwr *b, gosendwr *sin, int ns) {
	int ret = post_recv(qp, rin, nr);
	if (ret != 0) return ret;
	ret = post_send(qp, b, sin, ns);
	return ret == 0 ? 0 : -((-ret) | (1 << 20));
}

// The fast-call form of post_recv / post_send / post_recv_send
// (fastcall.go): one argument block, called through the runtime's
// asmcgocall.
typedef struct {
	struct ibv_qp *qp;
	gorecvwr *rin;
	gosendwr *sin;
	gobindwr *bind;
	int32_t nr, ns, ret;
} post_args;

static void post_fast(void *p) {
	post_args *a = p;
	if (a->nr > 0 && (a->ns > 0 || a->bind))
		a->ret = post_recv_send(a->qp, a->rin, a->nr, a->bind, a->sin, a->ns);
	else if (a->ns > 0 || a->bind)
		a->ret = post_send(a->qp, a->bind, a->sin, a->ns);
	else
		a->ret = post_recv(a->qp, a->rin, a->nr);
}

static void *post_fast_fn(void) { return (void *)post_fast; }

// ibv_modify_qp's fast form (fastcall.go: transitions without an address vector).
typedef struct {
	struct ibv_qp *qp;
	struct ibv_qp_attr *attr;
	int mask, ret;
} modify_args;

static void modify_fast(void *p) {
	modify_args *a = p;
	a->ret = ibv_modify_qp(a->qp, a->attr, a->mask);
}

static void *modify_fast_fn(void) { return (void *)modify_fast; }

static int post_send_ud(struct ibv_qp *qp, struct ibv_ah *ah, uint32_t rqpn, uint32_t qkey,
		uint64_t wr_id, uint64_t addr, uint32_t len, uint32_t lkey) {
	struct ibv_sge sge = { .addr = addr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = rqpn;
	wr.wr.ud.remote_qkey = qkey;
	int ret = ibv_post_send(qp, &wr, &bad);
	return ret > 0 ? -ret : ret;
}

static struct ibv_qp *create_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq, int type,
		uint32_t send_wr, uint32_t recv_wr, uint32_t sge, uint32_t inline_data, uint32_t *max_inline) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.qp_type = type;
	a.cap.max_send_wr = send_wr;
	a.cap.max_recv_wr = recv_wr;
	a.cap.max_send_sge = sge;
	a.cap.max_recv_sge = sge;
	a.cap.max_inline_data = inline_data;
	a.sq_sig_all = 0;
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	if (qp) *max_inline = a.cap.max_inline_data;
	return qp;
}
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// Send opcodes and flags (subset of ibv_wr_opcode / ibv_send_flags the library uses).
const (
	OpRDMAWrite        uint32 = C.IBV_WR_RDMA_WRITE
	OpRDMAWriteWithImm uint32 = C.IBV_WR_RDMA_WRITE_WITH_IMM
	OpSend             uint32 = C.IBV_WR_SEND
	OpSendWithImm      uint32 = C.IBV_WR_SEND_WITH_IMM
	OpRDMARead         uint32 = C.IBV_WR_RDMA_READ
	OpLocalInv         uint32 = C.IBV_WR_LOCAL_INV // invalidates the memory window named by RKey
	// The atomics: one 8-byte word at RemoteAddr (8-byte aligned); the
	// word's value before the operation lands in the local SGE (8 bytes).
	OpAtomicCompareSwap uint32 = C.IBV_WR_ATOMIC_CMP_AND_SWP   // CompareAdd compared, Swap written if equal
	OpAtomicFetchAdd    uint32 = C.IBV_WR_ATOMIC_FETCH_AND_ADD // CompareAdd added

	SendSignaled uint32 = C.IBV_SEND_SIGNALED
	SendInline   uint32 = C.IBV_SEND_INLINE
	SendFence    uint32 = C.IBV_SEND_FENCE
)

// SendWR is one send-queue work request: one scatter/gather entry, and a
// second one (the tail) where TailLen is set.
type SendWR struct {
	WRID       uint64
	Addr       uint64
	RemoteAddr uint64
	Len        uint32
	LKey       uint32
	Opcode     uint32
	Flags      uint32
	Imm        uint32 // host byte order
	RKey       uint32
	CompareAdd uint64 // the atomics' compare (CompareSwap) or addend (FetchAdd)
	Swap       uint64 // CompareSwap's new value
	// A second scatter/gather entry, sent after Addr/Len when TailLen > 0
	// (a send's trailer kept apart from a zero-copy payload).
	TailAddr          uint64
	TailLen, TailLKey uint32
}

// RecvWR is one receive work request with a single scatter/gather entry.
type RecvWR struct {
	WRID uint64
	Addr uint64
	Len  uint32
	LKey uint32
}

// QPConfig sizes a queue pair.
type QPConfig struct {
	Type       QPType
	SendCQ     *CQ
	RecvCQ     *CQ
	SendWR     int
	RecvWR     int
	InlineData int
	// IWARP: the QP is on an iWARP device. The iWARP CM moves it from INIT
	// to RTS itself (at rdma_connect and rdma_accept), and INIT takes only
	// its access flags (a P_Key index and a port mean nothing there), so
	// its state guard follows those rules (StateGuard, ConnectedByCM).
	IWARP bool
}

// QP is a queue pair. It keeps its PD and CQs alive. Every state change goes
// through its StateGuard, which validates it against the transition table.
type QP struct {
	mu                                    sync.Mutex
	qp                                    *C.struct_ibv_qp
	pd                                    *PD
	cfg                                   QPConfig
	guard                                 *StateGuard
	posts                                 atomic.Uint64
	wrsPosted                             atomic.Uint64
	sendPosts, sendWRs, signaled, inlined atomic.Uint64
	recvPosts, recvWRs                    atomic.Uint64
	Num                                   uint32
	MaxInline                             int
}

// CreateQP creates a queue pair in RESET whose work requests take up to two
// scatter/gather entries (a payload and its tail: SendWR).
func (p *PD) CreateQP(cfg QPConfig) (*QP, error) { return p.createQP(cfg, 2) }

// The Go and C forms of a send work request share one layout (post
// passes a []SendWR to C as gosendwr).
var (
	_ [unsafe.Sizeof(SendWR{}) - C.sizeof_gosendwr]struct{}
	_ [C.sizeof_gosendwr - unsafe.Sizeof(SendWR{})]struct{}
	_ [unsafe.Offsetof(SendWR{}.TailAddr) - C.offsetof_gosendwr_tail_addr]struct{}
	_ [C.offsetof_gosendwr_tail_addr - unsafe.Offsetof(SendWR{}.TailAddr)]struct{}
)

// createQP creates a queue pair of cfg in RESET whose work requests take up
// to sge scatter/gather entries.
func (p *PD) createQP(cfg QPConfig, sge int) (*QP, error) {
	var maxInline C.uint32_t
	qp, err := C.create_qp(p.pd, cfg.SendCQ.cq, cfg.RecvCQ.cq, C.int(cfg.Type),
		C.uint32_t(cfg.SendWR), C.uint32_t(cfg.RecvWR), C.uint32_t(sge), C.uint32_t(cfg.InlineData), &maxInline)
	if qp == nil {
		return nil, errnoErr(fmt.Sprintf("ibv_create_qp %s send_wr=%d recv_wr=%d inline=%d", cfg.Type, cfg.SendWR, cfg.RecvWR, cfg.InlineData), err, 0)
	}
	q := &QP{qp: qp, pd: p, cfg: cfg, Num: uint32(qp.qp_num), MaxInline: int(maxInline)}
	q.guard = newGuard(q.Num, cfg.Type, cfg.IWARP)
	return q, nil
}

// Type is the QP's transport type.
func (q *QP) Type() QPType { return q.cfg.Type }

// State is the state the library last moved the QP to.
func (q *QP) State() QPState { return q.guard.State() }

// MarkError records that the QP entered ERR on its own (a fatal async event or
// an error completion), so later transitions are validated from ERR.
func (q *QP) MarkError() { q.guard.Force(StateErr) }

// Modify validates (attr, mask) against the transition table and the port's
// limits, then applies it with ibv_modify_qp.
func (q *QP) Modify(attr *QPAttr, mask AttrMask, lim PortLimits) error {
	return q.guard.Modify(attr, mask, lim, func(a *QPAttr, m AttrMask) error {
		var ca C.struct_ibv_qp_attr
		toC(a, &ca)
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.qp == nil {
			return ErrClosed
		}
		var ret C.int
		if fastCalls && m&AttrAV == 0 { // not with an address vector: fastcall.go
			a := C.modify_args{qp: q.qp, attr: &ca, mask: C.int(m)}
			asmcgocall(modifyFastFn, unsafe.Pointer(&a))
			ret = a.ret
		} else {
			ret = C.ibv_modify_qp(q.qp, &ca, C.int(m))
		}
		if ret != 0 {
			return errnoErr("ibv_modify_qp", nil, ret)
		}
		return nil
	})
}

// Query asks the device for the QP's current state (not the library's record).
func (q *QP) Query() (QPState, error) {
	var a C.struct_ibv_qp_attr
	var ia C.struct_ibv_qp_init_attr
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.qp == nil {
		return 0, ErrClosed
	}
	if ret := C.ibv_query_qp(q.qp, &a, C.IBV_QP_STATE, &ia); ret != 0 {
		return 0, errnoErr(fmt.Sprintf("ibv_query_qp QP 0x%x", q.Num), nil, ret)
	}
	return QPState(a.qp_state), nil
}

// ConnectedByCM records that the CM moved the QP to RTS itself (an iWARP
// QP at ESTABLISHED: QPConfig.IWARP). The device cannot be asked: siw's
// ibv_query_qp reports no state.
func (q *QP) ConnectedByCM() { q.guard.Force(StateRTS) }

// QPCap is a QP's capacities as ibv_query_qp reports them (struct ibv_qp_cap).
type QPCap struct {
	MaxSendWR, MaxRecvWR, MaxSendSGE, MaxRecvSGE, MaxInline int
}

// queryMask asks ibv_query_qp for every attribute QPAttr holds (and the
// capacities).
const queryMask = AttrState | AttrCurState | AttrAccessFlags | AttrPKeyIndex | AttrPort | AttrQKey | AttrAV |
	AttrPathMTU | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrRQPSN | AttrMaxQPRdAtomic | AttrMinRNRTimer |
	AttrSQPSN | AttrMaxDestRdAtomic | AttrCap | AttrDestQPN

// QueryAttr returns the attributes and capacities the device holds for the
// QP (ibv_query_qp), for diagnostics: what a modify actually left, which
// may differ from what was asked (a device may round or ignore a value).
// The PSNs are the device's current ones: the next to send and the next
// expected. An iWARP QP (QPConfig.IWARP) has none of InfiniBand's
// transport attributes (they read zero) and its state is the library's
// record. It fails with ErrClosed after Close.
func (q *QP) QueryAttr() (QPAttr, QPCap, error) {
	var a C.struct_ibv_qp_attr
	var ia C.struct_ibv_qp_init_attr
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.qp == nil {
		return QPAttr{}, QPCap{}, ErrClosed
	}
	if ret := C.ibv_query_qp(q.qp, &a, C.int(queryMask), &ia); ret != 0 {
		return QPAttr{}, QPCap{}, errnoErr(fmt.Sprintf("ibv_query_qp QP 0x%x", q.Num), nil, ret)
	}
	c := QPCap{MaxSendWR: int(a.cap.max_send_wr), MaxRecvWR: int(a.cap.max_recv_wr), MaxSendSGE: int(a.cap.max_send_sge),
		MaxRecvSGE: int(a.cap.max_recv_sge), MaxInline: int(a.cap.max_inline_data)}
	attr := QPAttrFromC(unsafe.Pointer(&a))
	if q.cfg.IWARP {
		// iWARP devices report no state (siw leaves it 0, RESET): the
		// library's record is the state (the CM's RTS, the library's ERR).
		attr.State, attr.CurState = q.guard.State(), q.guard.State()
	}
	return attr, c, nil
}

const postBatch = 64 // POST_BATCH in C

// MaxPostList is the most receives, and the most sends, one post call takes
// (PostBindSend refuses more; PostSend and PostRecv split them).
const MaxPostList = postBatch

// PostSend posts wrs in as few ibv_post_send calls as possible (64 per call).
func (q *QP) PostSend(wrs []SendWR) error {
	for len(wrs) > 0 {
		n := min(len(wrs), postBatch)
		q.posts.Add(1)
		q.sendPosts.Add(1)
		if ret := q.post(nil, nil, wrs[:n]); ret != 0 {
			return postError("ibv_post_send", q.Num, -ret)
		}
		q.countSends(wrs[:n])
		wrs = wrs[n:]
	}
	return nil
}

// PostRecv posts receive requests in batches of up to 64 per call.
func (q *QP) PostRecv(wrs []RecvWR) error {
	for len(wrs) > 0 {
		n := min(len(wrs), postBatch)
		q.posts.Add(1)
		q.recvPosts.Add(1)
		if ret := q.post(wrs[:n], nil, nil); ret != 0 {
			return postError("ibv_post_recv", q.Num, -ret)
		}
		q.wrsPosted.Add(uint64(n))
		q.recvWRs.Add(uint64(n))
		wrs = wrs[n:]
	}
	return nil
}

// PostRecvSend posts recvs and then sends in one call into C (each at
// most postBatch requests: the callers' batches are smaller); the
// receives are posted first. Counted as a receive and a send doorbell.
// recvsPosted reports whether the receives went in (only the sends may
// have failed).
func (q *QP) PostRecvSend(recvs []RecvWR, sends []SendWR) (recvsPosted bool, err error) {
	if len(recvs) == 0 || len(recvs) > postBatch || len(sends) == 0 || len(sends) > postBatch {
		if err := q.PostRecv(recvs); err != nil {
			return false, err
		}
		return true, q.PostSend(sends)
	}
	q.posts.Add(1)
	q.recvPosts.Add(1)
	q.sendPosts.Add(1)
	if ret := q.post(recvs, nil, sends); ret != 0 {
		if -ret&(1<<20) != 0 {
			q.wrsPosted.Add(uint64(len(recvs)))
			q.recvWRs.Add(uint64(len(recvs)))
			return true, postError("ibv_post_send", q.Num, (-ret)&^(1<<20))
		}
		return false, postError("ibv_post_recv", q.Num, -ret)
	}
	q.wrsPosted.Add(uint64(len(recvs)))
	q.recvWRs.Add(uint64(len(recvs)))
	q.countSends(sends)
	return true, nil
}

var postFastFn = unsafe.Pointer(C.post_fast_fn())

var modifyFastFn = unsafe.Pointer(C.modify_fast_fn())

// post posts receives, then an optional window bind and sends, in one call
// into C, each at most postBatch requests, and returns the C function's
// code (0, or negative: see post_send and post_recv_send).
func (q *QP) post(recvs []RecvWR, bind *C.gobindwr, sends []SendWR) C.int {
	var rin *C.gorecvwr
	var sin *C.gosendwr
	if len(recvs) > 0 {
		rin = (*C.gorecvwr)(unsafe.Pointer(&recvs[0]))
	}
	if len(sends) > 0 {
		sin = (*C.gosendwr)(unsafe.Pointer(&sends[0]))
	}
	if fastCalls {
		a := C.post_args{qp: q.qp, rin: rin, sin: sin, bind: bind, nr: C.int32_t(len(recvs)), ns: C.int32_t(len(sends))}
		asmcgocall(postFastFn, unsafe.Pointer(&a))
		return C.int(a.ret)
	}
	var cbind *C.gobindwr
	if bind != nil {
		// A copy for cgo, which makes its pointer arguments escape: the
		// caller's stays on its stack in the fast path.
		b := *bind
		cbind = &b
	}
	switch {
	case len(recvs) > 0 && (len(sends) > 0 || cbind != nil):
		return C.post_recv_send(q.qp, rin, C.int(len(recvs)), cbind, sin, C.int(len(sends)))
	case len(sends) > 0 || cbind != nil:
		return C.post_send(q.qp, cbind, sin, C.int(len(sends)))
	}
	return C.post_recv(q.qp, rin, C.int(len(recvs)))
}

// countSends counts posted send requests: how many, signaled, inline.
func (q *QP) countSends(wrs []SendWR) {
	q.wrsPosted.Add(uint64(len(wrs)))
	q.sendWRs.Add(uint64(len(wrs)))
	var sig, inl uint64
	for i := range wrs {
		if wrs[i].Flags&SendSignaled != 0 {
			sig++
		}
		if wrs[i].Flags&SendInline != 0 {
			inl++
		}
	}
	q.signaled.Add(sig)
	q.inlined.Add(inl)
}

// PostBindSend posts, in one call into C and one doorbell per queue, recvs
// on the receive queue, then on the send queue the bind followed by sends
// (at most 64 of each): a window bound and announced together, say. It is
// counted as one send doorbell of 1+len(sends) requests. recvsPosted reports
// whether the receives went in. Once the bind is posted, the window's key is
// bind.RKey.
func (q *QP) PostBindSend(recvs []RecvWR, bind *BindWR, sends []SendWR) (recvsPosted bool, err error) {
	if len(recvs) > postBatch || len(sends) > postBatch {
		return false, fmt.Errorf("ibv_post_send QP 0x%x: %d receives and %d sends in one post list, at most %d each", q.Num, len(recvs), len(sends), postBatch)
	}
	b := C.gobindwr{mw: bind.MW.mw, mr: bind.MR.mr, wr_id: C.uint64_t(bind.WRID), addr: C.uint64_t(bind.Addr),
		len: C.uint64_t(bind.Len), access: C.uint32_t(bind.Access), rkey: C.uint32_t(bind.RKey), flags: C.uint32_t(bind.Flags)}
	q.posts.Add(1)
	q.sendPosts.Add(1)
	if len(recvs) > 0 {
		q.recvPosts.Add(1)
	}
	if ret := q.post(recvs, &b, sends); ret != 0 {
		if len(recvs) > 0 && -ret&(1<<20) == 0 {
			return false, postError("ibv_post_recv", q.Num, -ret)
		}
		q.wrsPosted.Add(uint64(len(recvs)))
		q.recvWRs.Add(uint64(len(recvs)))
		return true, postError("ibv_post_send BIND_MW", q.Num, (-ret)&^(1<<20))
	}
	q.wrsPosted.Add(uint64(len(recvs)))
	q.recvWRs.Add(uint64(len(recvs)))
	q.countBind(bind.Flags)
	q.countSends(sends)
	return true, nil
}

// countBind counts a posted window bind as a send request.
func (q *QP) countBind(flags uint32) {
	q.wrsPosted.Add(1)
	q.sendWRs.Add(1)
	if flags&SendSignaled != 0 {
		q.signaled.Add(1)
	}
}

func postError(op string, qpn uint32, code C.int) error {
	return &errnoError{op: fmt.Sprintf("%s QP 0x%x (request %d of the batch)", op, qpn, int(code)/256), errno: syscall.Errno(code % 256)}
}

// PostStats reports how many post calls crossed into C and how many work
// requests they carried (work requests per call = batching achieved).
func (q *QP) PostStats() (calls, wrs uint64) { return q.posts.Load(), q.wrsPosted.Load() }

// PostCounts splits the QP's posts by queue: doorbells (post calls) and
// work requests on the send and receive queues, and how many sends asked
// for a completion (signaled) or carried their payload inline.
type PostCounts struct {
	SendPosts, SendWRs, Signaled, Inlined, RecvPosts, RecvWRs uint64
}

// PostCounts returns the QP's post counters.
func (q *QP) PostCounts() PostCounts {
	return PostCounts{SendPosts: q.sendPosts.Load(), SendWRs: q.sendWRs.Load(), Signaled: q.signaled.Load(),
		Inlined: q.inlined.Load(), RecvPosts: q.recvPosts.Load(), RecvWRs: q.recvWRs.Load()}
}

// Close destroys the QP. Idempotent.
func (q *QP) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.qp == nil {
		return nil
	}
	if ret := C.ibv_destroy_qp(q.qp); ret != 0 {
		return errnoErr("ibv_destroy_qp", nil, ret)
	}
	q.qp = nil
	return nil
}

// Ptr exposes the C pointer for internal/rdmacm (rdma_init_qp_attr needs none,
// but some calls want the QP). It is an unsafe.Pointer to struct ibv_qp.
func (q *QP) Ptr() unsafe.Pointer { return unsafe.Pointer(q.qp) }

// AH is an address handle for UD sends.
type AH struct {
	ah *C.struct_ibv_ah
	pd *PD
}

// CreateAH creates an address handle from attr.
func (p *PD) CreateAH(attr *AHAttr) (*AH, error) {
	var ca C.struct_ibv_ah_attr
	ahToC(attr, &ca)
	ah, err := C.ibv_create_ah(p.pd, &ca)
	if ah == nil {
		return nil, errnoErr("ibv_create_ah", err, 0)
	}
	return &AH{ah: ah, pd: p}, nil
}

// Close destroys the address handle. Idempotent.
func (a *AH) Close() error {
	if a.ah == nil {
		return nil
	}
	ret := C.ibv_destroy_ah(a.ah)
	a.ah = nil
	if ret != 0 {
		return errnoErr("ibv_destroy_ah", nil, ret)
	}
	return nil
}

// PostSendUD posts one signaled UD send to (ah, remote QPN, qkey).
func (q *QP) PostSendUD(ah *AH, rqpn, qkey uint32, wrid, addr uint64, length, lkey uint32) error {
	if ret := C.post_send_ud(q.qp, ah.ah, C.uint32_t(rqpn), C.uint32_t(qkey), C.uint64_t(wrid),
		C.uint64_t(addr), C.uint32_t(length), C.uint32_t(lkey)); ret != 0 {
		return errnoErr("ibv_post_send UD", nil, ret)
	}
	return nil
}

func ahToC(a *AHAttr, c *C.struct_ibv_ah_attr) {
	c.dlid = C.uint16_t(a.DLID)
	c.sl = C.uint8_t(a.SL)
	c.src_path_bits = C.uint8_t(a.SrcPathBits)
	c.static_rate = C.uint8_t(a.StaticRate)
	c.port_num = C.uint8_t(a.PortNum)
	if a.IsGlobal {
		c.is_global = 1
		C.memcpy(unsafe.Pointer(&c.grh.dgid), unsafe.Pointer(&a.DGID[0]), 16)
		c.grh.flow_label = C.uint32_t(a.FlowLabel)
		c.grh.sgid_index = C.uint8_t(a.SGIDIndex)
		c.grh.hop_limit = C.uint8_t(a.HopLimit)
		c.grh.traffic_class = C.uint8_t(a.TrafficClass)
	}
}

func ahFromC(c *C.struct_ibv_ah_attr) AHAttr {
	a := AHAttr{DLID: uint16(c.dlid), SL: uint8(c.sl), SrcPathBits: uint8(c.src_path_bits),
		StaticRate: uint8(c.static_rate), PortNum: uint8(c.port_num), IsGlobal: c.is_global != 0}
	if a.IsGlobal {
		C.memcpy(unsafe.Pointer(&a.DGID[0]), unsafe.Pointer(&c.grh.dgid), 16)
		a.FlowLabel = uint32(c.grh.flow_label)
		a.SGIDIndex = uint8(c.grh.sgid_index)
		a.HopLimit = uint8(c.grh.hop_limit)
		a.TrafficClass = uint8(c.grh.traffic_class)
	}
	return a
}

func toC(a *QPAttr, c *C.struct_ibv_qp_attr) {
	c.qp_state = C.enum_ibv_qp_state(a.State)
	c.cur_qp_state = C.enum_ibv_qp_state(a.CurState)
	c.path_mtu = C.enum_ibv_mtu(a.PathMTU)
	c.qkey = C.uint32_t(a.QKey)
	c.rq_psn = C.uint32_t(a.RQPSN)
	c.sq_psn = C.uint32_t(a.SQPSN)
	c.dest_qp_num = C.uint32_t(a.DestQPN)
	c.qp_access_flags = C.uint(a.AccessFlags)
	c.pkey_index = C.uint16_t(a.PKeyIndex)
	c.port_num = C.uint8_t(a.PortNum)
	c.max_rd_atomic = C.uint8_t(a.MaxRdAtomic)
	c.max_dest_rd_atomic = C.uint8_t(a.MaxDestRdAtomic)
	c.min_rnr_timer = C.uint8_t(a.MinRNRTimer)
	c.timeout = C.uint8_t(a.Timeout)
	c.retry_cnt = C.uint8_t(a.RetryCnt)
	c.rnr_retry = C.uint8_t(a.RNRRetry)
	ahToC(&a.AH, &c.ah_attr)
}

// QPAttrFromC converts a struct ibv_qp_attr (e.g. filled by rdma_init_qp_attr)
// into a QPAttr, so that transitions rdma_cm computes pass the same table.
func QPAttrFromC(p unsafe.Pointer) QPAttr {
	c := (*C.struct_ibv_qp_attr)(p)
	return QPAttr{
		State: QPState(c.qp_state), CurState: QPState(c.cur_qp_state), PathMTU: MTU(c.path_mtu),
		QKey: uint32(c.qkey), RQPSN: uint32(c.rq_psn), SQPSN: uint32(c.sq_psn), DestQPN: uint32(c.dest_qp_num),
		AccessFlags: AccessFlags(c.qp_access_flags), PKeyIndex: uint16(c.pkey_index), PortNum: uint8(c.port_num),
		MaxRdAtomic: uint8(c.max_rd_atomic), MaxDestRdAtomic: uint8(c.max_dest_rd_atomic),
		MinRNRTimer: uint8(c.min_rnr_timer), Timeout: uint8(c.timeout), RetryCnt: uint8(c.retry_cnt),
		RNRRetry: uint8(c.rnr_retry), AH: ahFromC(&c.ah_attr),
	}
}

// SizeofQPAttr is sizeof(struct ibv_qp_attr), for callers that allocate one in C.
const SizeofQPAttr = C.sizeof_struct_ibv_qp_attr

// Limits returns the validation limits for this QP's port.
func (q *QP) PD() *PD { return q.pd }

// Reset moves the QP to RESET from any state (ibv_modify_qp with only the
// state): the device discards both work queues without completions and
// forgets the connection (PSNs, destination QP, path), so the QP can be
// connected again. It then asks the device, and fails unless the QP really
// is in RESET. A QP that reached ERR is reusable only through here.
func (q *QP) Reset(lim PortLimits) error {
	if err := q.Modify(&QPAttr{State: StateReset}, AttrState, lim); err != nil {
		return err
	}
	s, err := q.Query()
	if err != nil {
		return err
	}
	if s != StateReset {
		q.guard.Force(s)
		return fmt.Errorf("QP 0x%x: asked for RESET, the device reports %s", q.Num, s)
	}
	return nil
}

// Handoff passes the QP, which must be in RESET, to a new owner: it returns
// a new *QP for the same device QP (same number, capacities and CQs) with
// a fresh state guard and zeroed post counters, and detaches q, which from
// then on behaves as closed (its counters stay readable). A pool of QPs
// uses it so that a connection that ended cannot reach the QP another
// connection now holds.
func (q *QP) Handoff() (*QP, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.qp == nil {
		return nil, ErrClosed
	}
	if s := q.guard.State(); s != StateReset {
		return nil, fmt.Errorf("QP 0x%x: handing off a QP in %s (only a QP in RESET can change owner)", q.Num, s)
	}
	n := &QP{qp: q.qp, pd: q.pd, cfg: q.cfg, Num: q.Num, MaxInline: q.MaxInline}
	n.guard = newGuard(n.Num, n.cfg.Type, n.cfg.IWARP)
	q.qp = nil
	return n, nil
}

// Config is the configuration the QP was created with.
func (q *QP) Config() QPConfig { return q.cfg }
