//go:build linux && cgo

package verbs

/*
#include <errno.h>
#include <fcntl.h>
#include <time.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

// gowc is the flat completion record shared with Go (layout = verbs.WC).
typedef struct {
	uint64_t wr_id;
	uint32_t status, opcode, vendor_err, byte_len, imm, qp_num, src_qp, flags, slid;
} gowc;

static int copy_wcs(struct ibv_wc *wc, int n, gowc *out) {
	for (int i = 0; i < n; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].opcode = wc[i].opcode;
		out[i].vendor_err = wc[i].vendor_err;
		out[i].byte_len = wc[i].byte_len;
		out[i].imm = (wc[i].wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc[i].imm_data) : 0;
		out[i].qp_num = wc[i].qp_num;
		out[i].src_qp = wc[i].src_qp;
		out[i].flags = wc[i].wc_flags;
		out[i].slid = wc[i].slid;
	}
	return n;
}

#define POLL_BATCH 64

// poll_cq polls up to n completions in one call.
static int poll_cq(struct ibv_cq *cq, gowc *out, int n) {
	struct ibv_wc wc[POLL_BATCH];
	if (n > POLL_BATCH) n = POLL_BATCH;
	int got = ibv_poll_cq(cq, n, wc);
	if (got <= 0) return got;
	return copy_wcs(wc, got, out);
}

// poll_cq_spin keeps polling inside C until something completes or spin_ns
// passes, so a busy poller pays one cgo crossing per burst, not per empty poll.
static int poll_cq_spin(struct ibv_cq *cq, gowc *out, int n, int64_t spin_ns) {
	struct ibv_wc wc[POLL_BATCH];
	struct timespec start, now;
	if (n > POLL_BATCH) n = POLL_BATCH;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (unsigned iter = 0;; iter++) {
		int got = ibv_poll_cq(cq, n, wc);
		if (got != 0) return got < 0 ? got : copy_wcs(wc, got, out);
		if ((iter & 63) == 63) {
			clock_gettime(CLOCK_MONOTONIC, &now);
			int64_t el = (now.tv_sec - start.tv_sec) * 1000000000LL + (now.tv_nsec - start.tv_nsec);
			if (el >= spin_ns) return 0;
		}
	}
}

// poll_cq_tries polls up to tries times until something completes: a short
// spin bounded by a count, not a clock (a clock read costs more than a
// poll under emulation, and the caller bounds its wait in Go).
static int poll_cq_tries(struct ibv_cq *cq, gowc *out, int n, int tries) {
	struct ibv_wc wc[POLL_BATCH];
	if (n > POLL_BATCH) n = POLL_BATCH;
	for (int i = 0; i < tries; i++) {
		int got = ibv_poll_cq(cq, n, wc);
		if (got != 0) return got < 0 ? got : copy_wcs(wc, got, out);
	}
	return 0;
}

// The fast-call form of poll_cq / poll_cq_tries (fastcall.go): one
// argument block, called through the runtime's asmcgocall.
typedef struct {
	struct ibv_cq *cq;
	gowc *out;
	int32_t n, tries, ret;
} poll_args;

static void poll_fast(void *p) {
	poll_args *a = p;
	a->ret = a->tries > 1 ? poll_cq_tries(a->cq, a->out, a->n, a->tries) : poll_cq(a->cq, a->out, a->n);
}

static void *poll_fast_fn(void) { return (void *)poll_fast; }

static int set_nonblock(int fd) {
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0) return -errno;
	return fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

// get_cq_event returns 1 for one pending event, 0 if none (EAGAIN), -errno on
// error. The CQ is not returned: each channel serves one CQ here, and an
// out-parameter would cost the Go caller a heap allocation per event.
static int get_cq_event(struct ibv_comp_channel *ch) {
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(ch, &cq, &ctx) == 0) return 1;
	return errno == EAGAIN ? 0 : -errno;
}

// The fast-call forms of arming a CQ and of taking an event from its
// channel (fastcall.go). Both return at once: arming is a flag in the
// provider (on Soft-RoCE a system call that sets it), and the channel's fd
// is non-blocking.
typedef struct {
	struct ibv_cq *cq;
	int32_t ret;
} notify_args;

static void notify_fast(void *p) {
	notify_args *a = p;
	a->ret = ibv_req_notify_cq(a->cq, 0);
}

static void *notify_fast_fn(void) { return (void *)notify_fast; }

typedef struct {
	struct ibv_comp_channel *ch;
	int32_t ret;
} event_args;

static void event_fast(void *p) {
	event_args *a = p;
	a->ret = get_cq_event(a->ch);
}

static void *event_fast_fn(void) { return (void *)event_fast; }

// Acknowledging events takes the CQ's mutex, which only ibv_destroy_cq
// also takes (and releases while it waits for the acknowledgements).
typedef struct {
	struct ibv_cq *cq;
	uint32_t n;
} ack_args;

static void ack_fast(void *p) {
	ack_args *a = p;
	ibv_ack_cq_events(a->cq, a->n);
}

static void *ack_fast_fn(void) { return (void *)ack_fast; }
*/
import "C"

import (
	"fmt"
	"sync"
	"time"
	"unsafe"
)

// WC is one work completion, flattened. Imm is in host byte order.
type WC struct {
	WRID      uint64
	Status    WCStatus
	Opcode    WCOpcode
	VendorErr uint32
	ByteLen   uint32
	Imm       uint32
	QPNum     uint32
	SrcQP     uint32
	Flags     uint32
	SLID      uint32 // the sender's LID (UD on InfiniBand); 0 on RoCE
}

// HasImm reports whether the completion carried immediate data.
func (w *WC) HasImm() bool { return w.Flags&C.IBV_WC_WITH_IMM != 0 }

// WCStatus mirrors enum ibv_wc_status.
type WCStatus uint32

const (
	WCSuccess        WCStatus = C.IBV_WC_SUCCESS
	WCLocLenErr      WCStatus = C.IBV_WC_LOC_LEN_ERR
	WCLocProtErr     WCStatus = C.IBV_WC_LOC_PROT_ERR
	WCWRFlushErr     WCStatus = C.IBV_WC_WR_FLUSH_ERR
	WCRemAccessErr   WCStatus = C.IBV_WC_REM_ACCESS_ERR
	WCRemInvReqErr   WCStatus = C.IBV_WC_REM_INV_REQ_ERR
	WCRetryExcErr    WCStatus = C.IBV_WC_RETRY_EXC_ERR
	WCRNRRetryExcErr WCStatus = C.IBV_WC_RNR_RETRY_EXC_ERR
)

func (s WCStatus) String() string {
	return C.GoString(C.ibv_wc_status_str(C.enum_ibv_wc_status(s)))
}

// WCOpcode mirrors enum ibv_wc_opcode.
type WCOpcode uint32

const (
	WCSend            WCOpcode = C.IBV_WC_SEND
	WCRDMAWrite       WCOpcode = C.IBV_WC_RDMA_WRITE
	WCRDMARead        WCOpcode = C.IBV_WC_RDMA_READ
	WCRecv            WCOpcode = C.IBV_WC_RECV
	WCRecvRDMAWithImm WCOpcode = C.IBV_WC_RECV_RDMA_WITH_IMM
	WCBindMW          WCOpcode = C.IBV_WC_BIND_MW
	WCLocalInv        WCOpcode = C.IBV_WC_LOCAL_INV
)

// CompletionError is a failed work completion: its status (named as
// ibv_wc_status_str does), the provider's vendor code, the QP and the work
// request it belonged to. A failed completion's opcode is not valid (only
// wr_id, status, vendor_err and qp_num are), so the operation is named by
// the poster, from the work-request id (WC.ErrOp).
type CompletionError struct {
	Status    WCStatus
	VendorErr uint32
	WRID      uint64
	QPN       uint32
	Op        string // the operation of the work request ("RDMA write", "message send"); "" if unknown
}

func (e *CompletionError) Error() string {
	op := e.Op
	if op == "" {
		op = fmt.Sprintf("work request 0x%x", e.WRID)
	}
	return fmt.Sprintf("%s on QP 0x%x failed: %s (work completion status %d, vendor error 0x%x)",
		op, e.QPN, e.Status, uint32(e.Status), e.VendorErr)
}

// Err returns nil for a successful completion, else a *CompletionError
// that does not name the operation (see ErrOp).
func (w *WC) Err() error { return w.ErrOp("") }

// ErrOp returns nil for a successful completion, else a *CompletionError
// naming op as the operation the work request carried.
func (w *WC) ErrOp(op string) error {
	if w.Status == WCSuccess {
		return nil
	}
	return &CompletionError{Status: w.Status, VendorErr: w.VendorErr, WRID: w.WRID, QPN: w.QPNum, Op: op}
}

// CompChannel is a completion event channel; its fd is non-blocking so it can
// be waited on through Go's netpoller (see Fd).
type CompChannel struct {
	mu  sync.Mutex
	ch  *C.struct_ibv_comp_channel
	ctx *Context
}

// CreateCompChannel creates a completion channel with a non-blocking fd.
func (c *Context) CreateCompChannel() (*CompChannel, error) {
	ch, err := C.ibv_create_comp_channel(c.ctx)
	if ch == nil {
		return nil, errnoErr("ibv_create_comp_channel", err, 0)
	}
	if ret := C.set_nonblock(ch.fd); ret != 0 {
		C.ibv_destroy_comp_channel(ch)
		return nil, errnoErr("set completion channel non-blocking", nil, ret)
	}
	return &CompChannel{ch: ch, ctx: c}, nil
}

// Fd is the channel's file descriptor (readable when an armed CQ has a completion).
func (ch *CompChannel) Fd() int { return int(ch.ch.fd) }

// GetEvent consumes one pending CQ event without blocking. It returns ok=false
// when none is pending. Each event must be acknowledged with CQ.AckEvents.
func (ch *CompChannel) GetEvent() (ok bool, err error) {
	var ret C.int
	if fastCalls {
		a := C.event_args{ch: ch.ch}
		asmcgocall(eventFastFn, unsafe.Pointer(&a))
		ret = C.int(a.ret)
	} else {
		ret = C.get_cq_event(ch.ch)
	}
	if ret < 0 {
		return false, errnoErr("ibv_get_cq_event", nil, ret)
	}
	return ret == 1, nil
}

var eventFastFn = unsafe.Pointer(C.event_fast_fn())

// Close destroys the channel. Idempotent; all CQs using it must be closed first.
func (ch *CompChannel) Close() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.ch == nil {
		return nil
	}
	if ret := C.ibv_destroy_comp_channel(ch.ch); ret != 0 {
		return errnoErr("ibv_destroy_comp_channel", nil, ret)
	}
	ch.ch = nil
	return nil
}

// CQ is a completion queue. It keeps its Context and channel alive.
type CQ struct {
	mu    sync.Mutex
	cq    *C.struct_ibv_cq
	ch    *CompChannel
	unack uint32 // events received but not yet acknowledged
	Size  int
	key   uintptr
}

// CreateCQ creates a CQ with at least cqe entries, reporting to ch (may be nil).
func (c *Context) CreateCQ(cqe int, ch *CompChannel) (*CQ, error) {
	var cch *C.struct_ibv_comp_channel
	if ch != nil {
		cch = ch.ch
	}
	cq, err := C.ibv_create_cq(c.ctx, C.int(cqe), nil, cch, 0)
	if cq == nil {
		return nil, errnoErr(fmt.Sprintf("ibv_create_cq %d entries", cqe), err, 0)
	}
	q := &CQ{cq: cq, ch: ch, Size: int(cq.cqe)}
	q.key = uintptr(unsafe.Pointer(cq))
	return q, nil
}

// Key identifies the CQ in async events (AsyncEvent.CQ); it stays valid
// after Close.
func (q *CQ) Key() uintptr { return q.key }

// Poll fills wcs with up to len(wcs) completions (at most 64 per call) and returns how many.
func (q *CQ) Poll(wcs []WC) (int, error) {
	if len(wcs) == 0 {
		return 0, nil
	}
	n := q.poll(wcs, 1)
	if n < 0 {
		return 0, errnoErr("ibv_poll_cq", nil, C.int(n))
	}
	return n, nil
}

// PollSpin is Poll that keeps polling inside one cgo call for up to spin.
func (q *CQ) PollSpin(wcs []WC, spin time.Duration) (int, error) {
	if len(wcs) == 0 {
		return 0, nil
	}
	n := C.poll_cq_spin(q.cq, (*C.gowc)(unsafe.Pointer(&wcs[0])), C.int(len(wcs)), C.int64_t(spin))
	if n < 0 {
		return 0, errnoErr("ibv_poll_cq", nil, n)
	}
	return int(n), nil
}

// PollTries is Poll that polls up to tries times inside one cgo call until
// something completes.
func (q *CQ) PollTries(wcs []WC, tries int) (int, error) {
	if len(wcs) == 0 {
		return 0, nil
	}
	n := q.poll(wcs, tries)
	if n < 0 {
		return 0, errnoErr("ibv_poll_cq", nil, C.int(n))
	}
	return n, nil
}

var pollFastFn = unsafe.Pointer(C.poll_fast_fn())

// poll polls up to tries times inside C until something completes, and
// returns what ibv_poll_cq returned (a count, or negative on error). len(wcs)
// must be at least 1.
func (q *CQ) poll(wcs []WC, tries int) int {
	if fastCalls {
		a := C.poll_args{cq: q.cq, out: (*C.gowc)(unsafe.Pointer(&wcs[0])), n: C.int32_t(len(wcs)), tries: C.int32_t(tries)}
		asmcgocall(pollFastFn, unsafe.Pointer(&a))
		return int(a.ret)
	}
	if tries > 1 {
		return int(C.poll_cq_tries(q.cq, (*C.gowc)(unsafe.Pointer(&wcs[0])), C.int(len(wcs)), C.int(tries)))
	}
	return int(C.poll_cq(q.cq, (*C.gowc)(unsafe.Pointer(&wcs[0])), C.int(len(wcs))))
}

// ReqNotify arms the CQ: the next completion raises an event on its channel.
func (q *CQ) ReqNotify() error {
	var ret C.int
	if fastCalls {
		a := C.notify_args{cq: q.cq}
		asmcgocall(notifyFastFn, unsafe.Pointer(&a))
		ret = C.int(a.ret)
	} else {
		ret = C.ibv_req_notify_cq(q.cq, 0)
	}
	if ret != 0 {
		return errnoErr("ibv_req_notify_cq", nil, ret)
	}
	return nil
}

var notifyFastFn = unsafe.Pointer(C.notify_fast_fn())

// GotEvent records one event received from the channel for this CQ; events
// are acknowledged in batches (ibv_ack_cq_events takes a mutex). The
// acknowledgement is a fast call: it runs on the poller's wake-up path, and
// a cgo call there (in system-call state) wakes the runtime's monitor
// thread from its deep sleep into 20 us rounds that preempt the
// application on its core.
func (q *CQ) GotEvent() {
	q.unack++
	if q.unack >= 64 {
		if fastCalls {
			a := C.ack_args{cq: q.cq, n: C.uint32_t(q.unack)}
			asmcgocall(ackFastFn, unsafe.Pointer(&a))
		} else {
			C.ibv_ack_cq_events(q.cq, C.uint(q.unack))
		}
		q.unack = 0
	}
}

var ackFastFn = unsafe.Pointer(C.ack_fast_fn())

// Close acknowledges outstanding events and destroys the CQ. Idempotent.
func (q *CQ) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.cq == nil {
		return nil
	}
	if q.unack > 0 {
		C.ibv_ack_cq_events(q.cq, C.uint(q.unack))
		q.unack = 0
	}
	if ret := C.ibv_destroy_cq(q.cq); ret != 0 {
		return errnoErr("ibv_destroy_cq", nil, ret)
	}
	q.cq = nil
	return nil
}

// Resize grows (or shrinks) the CQ to at least cqe entries.
func (q *CQ) Resize(cqe int) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.cq == nil {
		return ErrClosed
	}
	if ret := C.ibv_resize_cq(q.cq, C.int(cqe)); ret != 0 {
		return errnoErr(fmt.Sprintf("ibv_resize_cq %d entries", cqe), nil, ret)
	}
	q.Size = int(q.cq.cqe)
	return nil
}
