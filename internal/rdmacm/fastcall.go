//go:build linux && cgo

package rdmacm

/*
#include <errno.h>
#include <string.h>
#include <rdma/rdma_cma.h>

#include "fastcall.h"

static void cm_fast(void *p) {
	cm_fast_args *a = p;
	int r = -1;
	errno = EINVAL;
	switch (a->op) {
	case CM_RESOLVE_ADDR: r = rdma_resolve_addr(a->id, a->src, a->dst, a->arg); break;
	case CM_RESOLVE_ROUTE: r = rdma_resolve_route(a->id, a->arg); break;
	case CM_CONNECT: r = rdma_connect(a->id, a->param); break;
	case CM_ACCEPT: r = rdma_accept(a->id, a->param); break;
	case CM_ESTABLISH: r = rdma_establish(a->id); break;
	// Never without a channel: librdmacm would make the id synchronous,
	// and every later call on it would wait for the network.
	case CM_MIGRATE: if (a->ch) r = rdma_migrate_id(a->id, a->ch); else errno = EBADF; break;
	case CM_CREATE_ID: if (a->ch) r = rdma_create_id(a->ch, a->idp, NULL, RDMA_PS_TCP); else errno = EBADF; break;
	case CM_INIT_QP_ATTR:
		a->attr->qp_state = a->arg;
		r = rdma_init_qp_attr(a->id, a->attr, a->mask);
		break;
	case CM_NOTIFY_ESTABLISHED: r = rdma_notify(a->id, IBV_EVENT_COMM_EST); break;
	}
	a->ret = r ? -errno : 0;
}

static void *cm_fast_fn(void) { return (void *)cm_fast; }
*/
import "C"

import (
	"unsafe"

	"github.com/verbline/rdma/internal/verbs"
)

// The connection set-up's rdma_cm calls (create and migrate an id, resolve
// the address and the route, connect, accept, establish, the QP attributes
// of each transition) and the read of each event go into C the way the
// data path's posts do (verbs/fastcall.go): on the system stack through
// the runtime's asmcgocall, without cgo's runtime transition.
//
// Why: each is one command written to the rdma_cm device that the kernel
// carries out before it returns (on InfiniBand and RoCE it queues MADs and
// resolutions and does not wait for the network), so the call is CPU
// work, long enough on a slow host (Soft-RoCE, emulation) to matter.
// Through cgo such a call puts its P in the system-call state, the
// runtime's monitor takes the P from any call it sees running past its
// 20 us tick and hands it to another thread (waking or creating one), and
// the caller's thread, back from C, finds its P gone and sleeps until one
// frees: each long call becomes a hand-off and two thread switches, with
// more runnable threads than CPUs to run them while a burst of dials and
// accepts set up. Keeping the P through the call avoids those hand-offs:
// such a burst makes fewer context switches and spends less CPU per
// connection (make setupbench measures set-up; docs/performance.md).
//
// What that gives up is what the data path's fast calls give up: nothing
// else runs on the P meanwhile and a stop-the-world waits for the call,
// here for as long as the kernel's CPU work takes. The calls that may
// wait on other work stay on cgo: rdma_destroy_id (it waits for its
// events' acknowledgements), the QP transition to RTR (the kernel resolves
// the peer's MAC in it: verbs/fastcall.go), ibv_query_port (rxe takes the
// RTNL lock in it), and rdma_listen, bind, reject and disconnect, which
// are not on a connection's set-up path. rdma_migrate_id waits for the
// acknowledgement of events already read from the id's old channel; the
// channel's reader acknowledges each event in the C call that read it,
// so that wait never needs a P. On iWARP rdma_connect makes a TCP
// connection and rdma_accept sends on it (siw): the caller marks those
// calls Blocking (ConnParam), and they go through cgo. VERBLINE_CGO=safe
// (verbs.FastCalls) turns the fast form off everywhere.

// asmcgocall runs fn(arg) on the system stack (see verbs/fastcall.go).
//
//go:linkname asmcgocall runtime.asmcgocall
//go:noescape
func asmcgocall(fn, arg unsafe.Pointer) int32

var cmFastFn = unsafe.Pointer(C.cm_fast_fn())

// callFast runs one set-up call in its fast form and returns its code
// (0, or a negative errno).
func callFast(a *C.cm_fast_args) C.int {
	asmcgocall(cmFastFn, unsafe.Pointer(a))
	return a.ret
}

// doFast is do for a call in its fast form: the id's C pointer goes into
// a under the id's lock, so Destroy cannot free it meanwhile.
func (i *ID) doFast(op string, a *C.cm_fast_args) error {
	return i.do(op, func(id *C.struct_rdma_cm_id) C.int {
		a.id = id
		return callFast(a)
	})
}

// fast reports whether set-up calls take the fast form (VERBLINE_CGO).
func fast() bool { return verbs.FastCalls() }
