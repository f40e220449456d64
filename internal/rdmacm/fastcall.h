// The argument block of the connection set-up's rdma_cm calls in their
// fast form (fastcall.go), shared by the package's cgo preambles.
#ifndef VERBLINE_RDMACM_FASTCALL_H
#define VERBLINE_RDMACM_FASTCALL_H

#include <rdma/rdma_cma.h>

// One argument block, one C function (cm_fast in fastcall.go), called
// through the runtime's asmcgocall; errno is read in the same call.
enum {
	CM_RESOLVE_ADDR = 1,
	CM_RESOLVE_ROUTE,
	CM_CONNECT,
	CM_ACCEPT,
	CM_ESTABLISH,
	CM_MIGRATE,
	CM_CREATE_ID,
	CM_INIT_QP_ATTR,
	CM_NOTIFY_ESTABLISHED,
};

typedef struct {
	int op;
	struct rdma_cm_id *id;
	struct rdma_cm_id **idp;
	struct rdma_event_channel *ch;
	struct sockaddr *src, *dst;
	struct rdma_conn_param *param;
	struct ibv_qp_attr *attr;
	int *mask;
	int arg;
	int ret;
} cm_fast_args;

#endif
