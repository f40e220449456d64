//go:build linux && cgo

package verbs

/*
#include <string.h>
#include <infiniband/verbs.h>

// goudsend / goudrecv are the flat UD work requests shared with Go (layouts
// = verbs.UDSendWR / UDRecvWR): two scatter/gather entries each, the first
// for the datagram header (and, on receive, the GRH before it), the second
// for the payload, so a payload buffer holds the payload alone.
typedef struct {
	uint64_t wr_id;
	struct ibv_ah *ah;
	uint64_t hdr_addr, addr;
	uint32_t hdr_len, len, hdr_lkey, lkey;
	uint32_t flags, rqpn, qkey, pad;
} goudsend;
typedef struct {
	uint64_t wr_id, hdr_addr, addr;
	uint32_t hdr_len, len, hdr_lkey, lkey;
} goudrecv;

#define UD_BATCH 32

// ud_post_send chains n UD sends and posts them with one ibv_post_send.
// Returns 0, or -(errno + 256*bad) where bad is the index of the first
// request not posted.
static int ud_post_send(struct ibv_qp *qp, goudsend *in, int n) {
	struct ibv_send_wr wr[UD_BATCH], *badwr = NULL;
	struct ibv_sge sge[UD_BATCH][2];
	if (n > UD_BATCH) n = UD_BATCH;
	memset(wr, 0, sizeof(wr[0]) * n);
	for (int i = 0; i < n; i++) {
		int k = 0;
		if (in[i].hdr_len) {
			sge[i][k].addr = in[i].hdr_addr;
			sge[i][k].length = in[i].hdr_len;
			sge[i][k].lkey = in[i].hdr_lkey;
			k++;
		}
		if (in[i].len) {
			sge[i][k].addr = in[i].addr;
			sge[i][k].length = in[i].len;
			sge[i][k].lkey = in[i].lkey;
			k++;
		}
		wr[i].wr_id = in[i].wr_id;
		wr[i].sg_list = sge[i];
		wr[i].num_sge = k;
		wr[i].opcode = IBV_WR_SEND;
		wr[i].send_flags = in[i].flags;
		wr[i].wr.ud.ah = in[i].ah;
		wr[i].wr.ud.remote_qpn = in[i].rqpn;
		wr[i].wr.ud.remote_qkey = in[i].qkey;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	int ret = ibv_post_send(qp, wr, &badwr);
	if (ret == 0) return 0;
	int bad = badwr ? (int)(badwr - wr) : 0;
	return -((ret > 0 ? ret : -ret) + 256 * bad);
}

static int ud_post_recv(struct ibv_qp *qp, goudrecv *in, int n) {
	struct ibv_recv_wr wr[UD_BATCH], *badwr = NULL;
	struct ibv_sge sge[UD_BATCH][2];
	if (n > UD_BATCH) n = UD_BATCH;
	for (int i = 0; i < n; i++) {
		sge[i][0].addr = in[i].hdr_addr;
		sge[i][0].length = in[i].hdr_len;
		sge[i][0].lkey = in[i].hdr_lkey;
		sge[i][1].addr = in[i].addr;
		sge[i][1].length = in[i].len;
		sge[i][1].lkey = in[i].lkey;
		wr[i].wr_id = in[i].wr_id;
		wr[i].sg_list = sge[i];
		wr[i].num_sge = in[i].len ? 2 : 1;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	int ret = ibv_post_recv(qp, wr, &badwr);
	if (ret == 0) return 0;
	int bad = badwr ? (int)(badwr - wr) : 0;
	return -((ret > 0 ? ret : -ret) + 256 * bad);
}

// The fast-call form of ud_post_send / ud_post_recv (fastcall.go).
typedef struct {
	struct ibv_qp *qp;
	goudsend *sin;
	goudrecv *rin;
	int32_t n, ret;
} ud_post_args;

static void ud_post_fast(void *p) {
	ud_post_args *a = p;
	a->ret = a->sin ? ud_post_send(a->qp, a->sin, a->n) : ud_post_recv(a->qp, a->rin, a->n);
}

static void *ud_post_fast_fn(void) { return (void *)ud_post_fast; }
*/
import "C"

import "unsafe"

// UDSendWR is one UD send: up to two scatter/gather entries (the datagram
// header, then the payload; a zero length leaves one out) to the QP
// RemoteQPN reached through AH, under QKey.
type UDSendWR struct {
	WRID            uint64
	ah              *C.struct_ibv_ah
	HdrAddr, Addr   uint64
	HdrLen, Len     uint32
	HdrLKey, LKey   uint32
	Flags           uint32 // SendSignaled, SendInline
	RemoteQPN, QKey uint32
	_               uint32
}

// SetAH sets the address handle the send goes through.
func (w *UDSendWR) SetAH(ah *AH) { w.ah = ah.ah }

// UDRecvWR is one UD receive: the first entry takes the 40-byte GRH and the
// datagram header, the second the payload.
type UDRecvWR struct {
	WRID          uint64
	HdrAddr, Addr uint64
	HdrLen, Len   uint32
	HdrLKey, LKey uint32
}

// The Go and C layouts must agree: the arrays have a negative length (a
// compile error) if a size differs.
var (
	_ [unsafe.Sizeof(UDSendWR{}) - C.sizeof_goudsend]byte
	_ [C.sizeof_goudsend - unsafe.Sizeof(UDSendWR{})]byte
	_ [unsafe.Sizeof(UDRecvWR{}) - C.sizeof_goudrecv]byte
	_ [C.sizeof_goudrecv - unsafe.Sizeof(UDRecvWR{})]byte
)

const udBatch = 32 // UD_BATCH in C

// CreateUDQP creates an unreliable datagram QP in RESET whose work requests
// take two scatter/gather entries (PostSendUDs, PostRecvUDs). cfg.Type is
// ignored.
func (p *PD) CreateUDQP(cfg QPConfig) (*QP, error) {
	cfg.Type = QPTypeUD
	return p.createQP(cfg, 2)
}

// PostSendUDs posts UD sends, up to 32 per ibv_post_send.
func (q *QP) PostSendUDs(wrs []UDSendWR) error {
	for len(wrs) > 0 {
		n := min(len(wrs), udBatch)
		q.posts.Add(1)
		q.sendPosts.Add(1)
		if ret := q.udPost(&wrs[0], nil, n); ret != 0 {
			return postError("ibv_post_send UD", q.Num, -ret)
		}
		q.wrsPosted.Add(uint64(n))
		q.sendWRs.Add(uint64(n))
		var sig, inl uint64
		for i := range wrs[:n] {
			if wrs[i].Flags&SendSignaled != 0 {
				sig++
			}
			if wrs[i].Flags&SendInline != 0 {
				inl++
			}
		}
		q.signaled.Add(sig)
		q.inlined.Add(inl)
		wrs = wrs[n:]
	}
	return nil
}

// PostRecvUDs posts UD receives, up to 32 per ibv_post_recv.
func (q *QP) PostRecvUDs(wrs []UDRecvWR) error {
	for len(wrs) > 0 {
		n := min(len(wrs), udBatch)
		q.posts.Add(1)
		q.recvPosts.Add(1)
		if ret := q.udPost(nil, &wrs[0], n); ret != 0 {
			return postError("ibv_post_recv UD", q.Num, -ret)
		}
		q.wrsPosted.Add(uint64(n))
		q.recvWRs.Add(uint64(n))
		wrs = wrs[n:]
	}
	return nil
}

var udPostFastFn = unsafe.Pointer(C.ud_post_fast_fn())

// udPost posts n UD sends (from s) or receives (from r) in one call into C
// and returns its code (0, or negative: see ud_post_send).
func (q *QP) udPost(s *UDSendWR, r *UDRecvWR, n int) C.int {
	sin, rin := (*C.goudsend)(unsafe.Pointer(s)), (*C.goudrecv)(unsafe.Pointer(r))
	if fastCalls {
		a := C.ud_post_args{qp: q.qp, sin: sin, rin: rin, n: C.int32_t(n)}
		asmcgocall(udPostFastFn, unsafe.Pointer(&a))
		return C.int(a.ret)
	}
	if s != nil {
		return C.ud_post_send(q.qp, sin, C.int(n))
	}
	return C.ud_post_recv(q.qp, rin, C.int(n))
}

// AHAttrFromC converts a struct ibv_ah_attr (e.g. the one an rdma_cm UD
// event carries) into an AHAttr. p must point to a struct ibv_ah_attr.
func AHAttrFromC(p unsafe.Pointer) AHAttr { return ahFromC((*C.struct_ibv_ah_attr)(p)) }

// SizeofAHAttr is sizeof(struct ibv_ah_attr), for callers that hold one in C.
const SizeofAHAttr = C.sizeof_struct_ibv_ah_attr

// HasGRH reports whether a receive completion's buffer starts with a valid
// 40-byte global route header (always on RoCE; on IB for routed traffic).
func (w *WC) HasGRH() bool { return w.Flags&C.IBV_WC_GRH != 0 }
