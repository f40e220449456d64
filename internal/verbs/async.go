//go:build linux && cgo

package verbs

/*
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <infiniband/verbs.h>

typedef struct {
	int type;
	uint32_t qpn;
	uintptr_t cq;
	uint8_t port;
} goasync;

// get_async takes one async event without blocking (the fd is O_NONBLOCK),
// copies what identifies its object and acknowledges it at once (destroying
// a QP or CQ waits for its events' acks). 1: an event; 0: none; <0: -errno.
static int get_async(struct ibv_context *ctx, goasync *out) {
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev)) return errno == EAGAIN ? 0 : -errno;
	out->type = ev.event_type;
	out->qpn = 0; out->cq = 0; out->port = 0;
	switch (ev.event_type) {
	case IBV_EVENT_QP_FATAL: case IBV_EVENT_QP_REQ_ERR: case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST: case IBV_EVENT_SQ_DRAINED: case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR: case IBV_EVENT_QP_LAST_WQE_REACHED:
		out->qpn = ev.element.qp->qp_num;
		break;
	case IBV_EVENT_CQ_ERR:
		out->cq = (uintptr_t)ev.element.cq;
		break;
	case IBV_EVENT_PORT_ACTIVE: case IBV_EVENT_PORT_ERR: case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE: case IBV_EVENT_SM_CHANGE: case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		out->port = ev.element.port_num;
		break;
	default:
		break;
	}
	ibv_ack_async_event(&ev);
	return 1;
}

static int async_nonblock(struct ibv_context *ctx) {
	int fl = fcntl(ctx->async_fd, F_GETFL);
	if (fl < 0 || fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK) < 0) return -errno;
	return 0;
}

static int async_fd(struct ibv_context *ctx) { return ctx->async_fd; }
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// AsyncEventType mirrors enum ibv_event_type.
type AsyncEventType int

const (
	EventCQErr            AsyncEventType = C.IBV_EVENT_CQ_ERR
	EventQPFatal          AsyncEventType = C.IBV_EVENT_QP_FATAL
	EventQPReqErr         AsyncEventType = C.IBV_EVENT_QP_REQ_ERR
	EventQPAccessErr      AsyncEventType = C.IBV_EVENT_QP_ACCESS_ERR
	EventCommEst          AsyncEventType = C.IBV_EVENT_COMM_EST
	EventSQDrained        AsyncEventType = C.IBV_EVENT_SQ_DRAINED
	EventPathMig          AsyncEventType = C.IBV_EVENT_PATH_MIG
	EventPathMigErr       AsyncEventType = C.IBV_EVENT_PATH_MIG_ERR
	EventDeviceFatal      AsyncEventType = C.IBV_EVENT_DEVICE_FATAL
	EventPortActive       AsyncEventType = C.IBV_EVENT_PORT_ACTIVE
	EventPortErr          AsyncEventType = C.IBV_EVENT_PORT_ERR
	EventLIDChange        AsyncEventType = C.IBV_EVENT_LID_CHANGE
	EventPKeyChange       AsyncEventType = C.IBV_EVENT_PKEY_CHANGE
	EventSMChange         AsyncEventType = C.IBV_EVENT_SM_CHANGE
	EventSRQErr           AsyncEventType = C.IBV_EVENT_SRQ_ERR
	EventSRQLimitReached  AsyncEventType = C.IBV_EVENT_SRQ_LIMIT_REACHED
	EventQPLastWQEReached AsyncEventType = C.IBV_EVENT_QP_LAST_WQE_REACHED
	EventClientReregister AsyncEventType = C.IBV_EVENT_CLIENT_REREGISTER
	EventGIDChange        AsyncEventType = C.IBV_EVENT_GID_CHANGE
)

// String is libibverbs' name for the event (ibv_event_type_str).
func (t AsyncEventType) String() string {
	return C.GoString(C.ibv_event_type_str(C.enum_ibv_event_type(t)))
}

// AsyncEvent is one asynchronous event of a device, with what identifies
// the object it concerns.
type AsyncEvent struct {
	Type AsyncEventType
	QPN  uint32  // QP events: the QP's number
	CQ   uintptr // CQ events: the CQ's key (CQ.Key)
	Port uint8   // port events: the port number
}

func (e AsyncEvent) String() string {
	switch {
	case e.QPN != 0:
		return fmt.Sprintf("%v on QP %d", e.Type, e.QPN)
	case e.CQ != 0:
		return fmt.Sprintf("%v on CQ %#x", e.Type, e.CQ)
	case e.Port != 0:
		return fmt.Sprintf("%v on port %d", e.Type, e.Port)
	}
	return e.Type.String()
}

// AsyncReader delivers a device's asynchronous events (ibv_get_async_event)
// read through the Go netpoller, as the CM events and completion events
// are: a parked goroutine, no thread of its own. One per device context:
// events are consumed.
type AsyncReader struct {
	file   *os.File
	events chan AsyncEvent
	done   chan struct{}
	once   sync.Once
	err    error // why delivery stopped other than by Close (set before events is closed)
}

// OpenAsyncEvents starts reading c's asynchronous events.
func (c *Context) OpenAsyncEvents() (*AsyncReader, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil {
		return nil, fmt.Errorf("async events: device context closed")
	}
	if ret := C.async_nonblock(c.ctx); ret != 0 {
		return nil, errnoErr("async event fd non-blocking", nil, ret)
	}
	dup, err := unix.FcntlInt(uintptr(C.async_fd(c.ctx)), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup async event fd: %w", err)
	}
	r := &AsyncReader{file: os.NewFile(uintptr(dup), "ibv_async"), events: make(chan AsyncEvent, 16), done: make(chan struct{})}
	go r.loop(c.ctx)
	return r, nil
}

// Events delivers the events; it is closed by Close, or when reading
// failed (Err says why).
func (r *AsyncReader) Events() <-chan AsyncEvent { return r.events }

// Err is why Events was closed other than by Close. Valid once Events is
// closed.
func (r *AsyncReader) Err() error { return r.err }

func (r *AsyncReader) loop(ctx *C.struct_ibv_context) {
	defer close(r.events)
	rc, err := r.file.SyscallConn()
	if err != nil {
		r.err = fmt.Errorf("async event fd: %w", err)
		return
	}
	var ev C.goasync
	for {
		var got C.int
		err := rc.Read(func(uintptr) bool {
			got = C.get_async(ctx, &ev)
			return got != 0
		})
		select {
		case <-r.done:
			return
		default:
		}
		if err != nil {
			r.err = fmt.Errorf("async event fd: %w", err)
			return
		}
		if got < 0 {
			r.err = fmt.Errorf("ibv_get_async_event: %w", syscall.Errno(-got))
			return
		}
		out := AsyncEvent{Type: AsyncEventType(ev._type), QPN: uint32(ev.qpn), CQ: uintptr(ev.cq), Port: uint8(ev.port)}
		select {
		case r.events <- out:
		case <-r.done:
			return
		}
	}
}

// Close stops the reader and waits for its goroutine. Idempotent.
func (r *AsyncReader) Close() error {
	r.once.Do(func() {
		close(r.done)
		r.file.Close() // wakes the loop's Read
		for range r.events {
		}
	})
	return nil
}
