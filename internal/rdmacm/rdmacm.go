//go:build linux && cgo

// Package rdmacm is a thin cgo layer over librdmacm: an event channel whose fd
// is non-blocking and waited on through Go's netpoller (a parked goroutine, not
// a blocked thread), communication ids, address/route resolution, listen,
// connect/accept/reject with private data, and disconnect.
//
// The library creates its own QPs (not rdma_create_qp), so rdma_cm never moves
// a QP by itself: InitQPAttr hands back the attributes rdma_cm computed and the
// caller applies them through verbs' validated state table.
package rdmacm

/*
#cgo LDFLAGS: -lrdmacm -libverbs
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>
#include "fastcall.h"

typedef struct {
	struct rdma_cm_id *id;
	struct rdma_cm_id *listen_id;
	int event;
	int status;
	int priv_len;
	uint8_t responder_resources, initiator_depth;
	uint32_t qp_num;
} goevent;

// get_event takes one event without blocking (the fd is O_NONBLOCK), copies
// what Go needs (including private data, which lives in the event), and acks it.
// Returns 1 on an event, 0 on EAGAIN, -errno on error.
static int get_event(struct rdma_event_channel *ch, goevent *out, uint8_t *priv, int cap) {
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev)) return errno == EAGAIN ? 0 : -errno;
	out->id = ev->id;
	out->listen_id = ev->listen_id;
	out->event = ev->event;
	out->status = ev->status;
	out->priv_len = 0;
	out->responder_resources = ev->param.conn.responder_resources;
	out->initiator_depth = ev->param.conn.initiator_depth;
	out->qp_num = ev->param.conn.qp_num;
	if (ev->param.conn.private_data && ev->param.conn.private_data_len) {
		int n = ev->param.conn.private_data_len < cap ? ev->param.conn.private_data_len : cap;
		memcpy(priv, ev->param.conn.private_data, n);
		out->priv_len = n;
	}
	rdma_ack_cm_event(ev);
	return 1;
}

// get_event's fast form (fastcall.go).
typedef struct {
	struct rdma_event_channel *ch;
	goevent *out;
	uint8_t *priv;
	int cap, ret;
} get_event_args;

static void get_event_fast(void *p) {
	get_event_args *a = p;
	a->ret = get_event(a->ch, a->out, a->priv, a->cap);
}

static void *get_event_fast_fn(void) { return (void *)get_event_fast; }

static int set_nonblock(int fd) {
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0) return -errno;
	return fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

static struct rdma_event_channel *create_channel(int *err) {
	struct rdma_event_channel *ch = rdma_create_event_channel();
	*err = ch ? 0 : errno;
	return ch;
}

static int create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id) {
	return rdma_create_id(ch, id, NULL, RDMA_PS_TCP) ? -errno : 0;
}

static int conn_param_call(int accept, struct rdma_cm_id *id, const void *priv, int len,
		uint8_t resp, uint8_t init, uint8_t retry, uint8_t rnr, uint32_t qpn) {
	struct rdma_conn_param p;
	memset(&p, 0, sizeof(p));
	p.private_data = priv;
	p.private_data_len = len;
	p.responder_resources = resp;
	p.initiator_depth = init;
	p.retry_count = retry;
	p.rnr_retry_count = rnr;
	p.qp_num = qpn;
	int ret = accept ? rdma_accept(id, &p) : rdma_connect(id, &p);
	return ret ? -errno : 0;
}

// Each call and its errno in one C function: Go may move a goroutine to
// another thread between two cgo calls, and errno is per thread (a separate
// call to read errno could read another thread's, 0 included, and turn a
// failed bind into a success).
static int rdma_migrate_id_e(struct rdma_cm_id *id, struct rdma_event_channel *ch) { return rdma_migrate_id(id, ch) ? -errno : 0; }
static int rdma_bind_addr_e(struct rdma_cm_id *id, struct sockaddr *sa) { return rdma_bind_addr(id, sa) ? -errno : 0; }
static int rdma_listen_e(struct rdma_cm_id *id, int backlog) { return rdma_listen(id, backlog) ? -errno : 0; }
static int rdma_resolve_addr_e(struct rdma_cm_id *id, struct sockaddr *src, struct sockaddr *dst, int ms) { return rdma_resolve_addr(id, src, dst, ms) ? -errno : 0; }
static int rdma_resolve_route_e(struct rdma_cm_id *id, int ms) { return rdma_resolve_route(id, ms) ? -errno : 0; }
static int rdma_establish_e(struct rdma_cm_id *id) { return rdma_establish(id) ? -errno : 0; }
static int rdma_notify_comm_est_e(struct rdma_cm_id *id) { return rdma_notify(id, IBV_EVENT_COMM_EST) ? -errno : 0; }
static int rdma_reject_e(struct rdma_cm_id *id, const void *priv, uint8_t len) { return rdma_reject(id, priv, len) ? -errno : 0; }
static int rdma_disconnect_e(struct rdma_cm_id *id) { return rdma_disconnect(id) ? -errno : 0; }
static int rdma_destroy_id_e(struct rdma_cm_id *id) { return rdma_destroy_id(id) ? -errno : 0; }
static void *id_verbs(struct rdma_cm_id *id) { return id->verbs; }
static uint8_t id_port(struct rdma_cm_id *id) { return id->port_num; }
static struct sockaddr *local_addr(struct rdma_cm_id *id) { return rdma_get_local_addr(id); }
static struct sockaddr *peer_addr(struct rdma_cm_id *id) { return rdma_get_peer_addr(id); }
static int init_qp_attr(struct rdma_cm_id *id, void *attr, int state, int *mask) {
	((struct ibv_qp_attr *)attr)->qp_state = state;
	return rdma_init_qp_attr(id, attr, mask) ? -errno : 0;
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	cerrors "github.com/cockroachdb/errors"
	"go.uber.org/atomic"
	"golang.org/x/sys/unix"

	"github.com/verbline/rdma/internal/verbs"
)

// ErrNoCM is returned when the rdma_cm device is missing.
var ErrNoCM = errors.New("rdma_cm unavailable: /dev/infiniband/rdma_cm is missing " +
	"(no RDMA device, or rdma_ucm not loaded: modprobe rdma_ucm)")

// EventType mirrors enum rdma_cm_event_type.
type EventType int

const (
	EventAddrResolved    EventType = C.RDMA_CM_EVENT_ADDR_RESOLVED
	EventAddrError       EventType = C.RDMA_CM_EVENT_ADDR_ERROR
	EventRouteResolved   EventType = C.RDMA_CM_EVENT_ROUTE_RESOLVED
	EventRouteError      EventType = C.RDMA_CM_EVENT_ROUTE_ERROR
	EventConnectRequest  EventType = C.RDMA_CM_EVENT_CONNECT_REQUEST
	EventConnectResponse EventType = C.RDMA_CM_EVENT_CONNECT_RESPONSE
	EventConnectError    EventType = C.RDMA_CM_EVENT_CONNECT_ERROR
	EventUnreachable     EventType = C.RDMA_CM_EVENT_UNREACHABLE
	EventRejected        EventType = C.RDMA_CM_EVENT_REJECTED
	EventEstablished     EventType = C.RDMA_CM_EVENT_ESTABLISHED
	EventDisconnected    EventType = C.RDMA_CM_EVENT_DISCONNECTED
	EventDeviceRemoval   EventType = C.RDMA_CM_EVENT_DEVICE_REMOVAL
	EventAddrChange      EventType = C.RDMA_CM_EVENT_ADDR_CHANGE
	EventTimewaitExit    EventType = C.RDMA_CM_EVENT_TIMEWAIT_EXIT
)

func (t EventType) String() string {
	return C.GoString(C.rdma_event_str(C.enum_rdma_cm_event_type(t)))
}

// Event is one CM event, copied out of librdmacm and already acknowledged.
type Event struct {
	Type        EventType
	Status      int    // negative errno, or a CM reject reason for EventRejected
	ID          *ID    // the id the event is for (a new, unowned id for EventConnectRequest)
	PrivateData []byte // as sent by the peer; IB/RoCE pad it with zeros to the maximum
	// From the peer's connection parameters (EventConnectRequest / EventConnectResponse).
	ResponderResources, InitiatorDepth uint8
	QPNum                              uint32
	// Read is when Next read the event from the kernel (the set-up
	// measurements time its delivery from there).
	Read time.Time
}

// Channel is an rdma_cm event channel. Its events are read by the goroutine
// that waits for them (Next), through the netpoller: no goroutine of the
// channel's own reads and hands them on, so an event wakes one goroutine, not
// two, and a connection's channel costs no goroutine of its own.
type Channel struct {
	rch  *C.struct_rdma_event_channel // what Next reads: valid until Close has taken readMu
	file *os.File                     // a dup of the channel fd, registered with the netpoller
	rc   syscall.RawConn

	mu  sync.Mutex
	ch  *C.struct_rdma_event_channel // nil once closed (mu)
	ids map[*C.struct_rdma_cm_id]*ID // (mu)

	// readMu admits one Next at a time; Close takes it to know no reader
	// is left in the C channel before it keeps or destroys it.
	readMu sync.Mutex
	buf    *eventBuf // (readMu)
	closed atomic.Bool
	err    atomic.Error // why reading failed; Next returns it from then on
	// reusable: Close may keep the C channel for the next NewChannel
	// (idle.go); cleared once an id on it listens (a listener's channel
	// may hold connect requests for ids it never saw).
	reusable atomic.Bool
}

// eventBuf is what C fills for one event: kept apart from Channel so the
// memory passed to C holds no Go pointers.
type eventBuf struct {
	ev   C.goevent
	priv [256]byte
}

// ErrChannelClosed is returned by Next after Close, and by a Next that
// Close interrupted.
var ErrChannelClosed = fmt.Errorf("rdma_cm event channel: %w", net.ErrClosed)

// NewChannel creates an event channel. It reuses a channel an earlier Close
// kept (idle.go) when there is one.
func NewChannel() (*Channel, error) {
	if ic, ok := takeIdle(); ok {
		return newChannel(ic.ch, ic.file, true)
	}
	var e C.int
	ch := C.create_channel(&e)
	if ch == nil {
		if e == C.ENODEV || e == C.ENOENT {
			return nil, ErrNoCM
		}
		return nil, fmt.Errorf("rdma_create_event_channel: %w", syscall.Errno(e))
	}
	if ret := C.set_nonblock(ch.fd); ret != 0 {
		C.rdma_destroy_event_channel(ch)
		return nil, fmt.Errorf("rdma_cm channel non-blocking: %w", syscall.Errno(-ret))
	}
	dup, err := unix.FcntlInt(uintptr(ch.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		C.rdma_destroy_event_channel(ch)
		return nil, fmt.Errorf("dup rdma_cm channel fd: %w", err)
	}
	return newChannel(ch, os.NewFile(uintptr(dup), "rdma_cm"), true)
}

func newChannel(ch *C.struct_rdma_event_channel, file *os.File, reusable bool) (*Channel, error) {
	rc, err := file.SyscallConn()
	if err != nil {
		file.Close()
		C.rdma_destroy_event_channel(ch)
		return nil, fmt.Errorf("rdma_cm event channel: %w", err)
	}
	c := &Channel{rch: ch, ch: ch, file: file, rc: rc, ids: make(map[*C.struct_rdma_cm_id]*ID), buf: new(eventBuf)}
	c.reusable.Store(reusable)
	return c, nil
}

var getEventFastFn = unsafe.Pointer(C.get_event_fast_fn())

// aLongTimeAgo is a read deadline that has passed: setting it wakes a
// blocked Next (as package net interrupts a blocked Read).
var aLongTimeAgo = time.Unix(1, 0)

// Next waits for the channel's next event, reading it itself, until ctx
// is done (ctx's error), Close is called (ErrChannelClosed) or reading
// fails (that error, from then on). Events for ids the channel no longer
// tracks (destroyed or migrated) are dropped. One caller at a time: a
// second waits for the first.
func (c *Channel) Next(ctx context.Context) (Event, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	for {
		if c.closed.Load() {
			return Event{}, ErrChannelClosed
		}
		if err := c.err.Load(); err != nil {
			return Event{}, err
		}
		if err := ctx.Err(); err != nil {
			return Event{}, err
		}
		dl, _ := ctx.Deadline()
		if err := c.file.SetReadDeadline(dl); err != nil {
			if c.closed.Load() {
				return Event{}, ErrChannelClosed
			}
			return Event{}, c.failed(fmt.Errorf("rdma_cm event channel: %w", err))
		}
		var stop func() bool
		if ctx.Done() != nil {
			stop = context.AfterFunc(ctx, c.interrupt)
		}
		// Close stores closed before it sets its own deadline: a deadline
		// of ours set after that one replaced it, but then this sees closed.
		if c.closed.Load() {
			if stop != nil {
				stop()
			}
			return Event{}, ErrChannelClosed
		}
		got, err := c.read()
		if stop != nil {
			stop()
		}
		switch {
		case got > 0:
			if ev, ok := c.event(); ok {
				return ev, nil
			}
		case got < 0:
			return Event{}, c.failed(fmt.Errorf("rdma_get_cm_event: %w", syscall.Errno(-got)))
		case c.closed.Load():
			return Event{}, ErrChannelClosed
		case errors.Is(err, os.ErrDeadlineExceeded):
			// ctx's deadline (its own timer may not have fired yet), its
			// cancellation, or an interrupt left by an earlier wait: the
			// checks above tell which.
			if !dl.IsZero() && !time.Now().Before(dl) {
				return Event{}, context.DeadlineExceeded
			}
		default:
			return Event{}, c.failed(fmt.Errorf("rdma_cm event channel: %w", err))
		}
	}
}

// interrupt wakes a blocked Next.
func (c *Channel) interrupt() { c.file.SetReadDeadline(aLongTimeAgo) }

// failed records err as the channel's terminal error and returns it.
func (c *Channel) failed(err error) error {
	c.err.CompareAndSwap(nil, err)
	return c.err.Load()
}

// read takes one event into c.buf when the kernel has one, waiting in the
// netpoller until then: got is 1 on an event, -errno when
// rdma_get_cm_event failed, 0 with err when the wait ended (deadline,
// closed file).
func (c *Channel) read() (got C.int, err error) {
	b := c.buf
	err = c.rc.Read(func(uintptr) bool {
		if fast() {
			a := C.get_event_args{ch: c.rch, out: &b.ev, priv: (*C.uint8_t)(unsafe.Pointer(&b.priv[0])), cap: C.int(len(b.priv))}
			asmcgocall(getEventFastFn, unsafe.Pointer(&a))
			got = a.ret
		} else {
			got = C.get_event(c.rch, &b.ev, (*C.uint8_t)(unsafe.Pointer(&b.priv[0])), C.int(len(b.priv)))
		}
		return got != 0
	})
	if got != 0 {
		err = nil
	}
	return got, err
}

// event converts the event in c.buf; ok is false for an id the channel
// no longer tracks.
func (c *Channel) event() (out Event, ok bool) {
	ev := &c.buf.ev
	out = Event{
		Read: time.Now(),
		Type: EventType(ev.event), Status: int(ev.status),
		ResponderResources: uint8(ev.responder_resources), InitiatorDepth: uint8(ev.initiator_depth),
		QPNum: uint32(ev.qp_num),
	}
	if ev.priv_len > 0 {
		out.PrivateData = append([]byte(nil), c.buf.priv[:ev.priv_len]...)
	}
	c.mu.Lock()
	out.ID = c.ids[ev.id]
	if out.ID == nil && out.Type == EventConnectRequest {
		out.ID = &ID{id: ev.id}
	}
	c.mu.Unlock()
	return out, out.ID != nil
}

// Close ends the channel: a blocked Next returns ErrChannelClosed, and
// Close waits for it to leave, then destroys the channel, or keeps it for
// the next NewChannel when no id is left on it and reading it never failed
// (idle.go). Every id on it must be destroyed or migrated first.
// Idempotent.
func (c *Channel) Close() error {
	c.mu.Lock()
	if c.ch == nil {
		c.mu.Unlock()
		return nil
	}
	ch := c.ch
	c.ch = nil
	keep := c.reusable.Load() && len(c.ids) == 0
	c.mu.Unlock()
	c.closed.Store(true)
	if keep {
		// Wakes a reader but keeps the fd and its netpoller registration.
		keep = c.file.SetReadDeadline(aLongTimeAgo) == nil
	}
	if !keep {
		c.file.Close() // wakes a reader
	}
	c.readMu.Lock() // no reader is left in the C channel
	failed := c.err.Load() != nil
	c.readMu.Unlock()
	if keep && !failed && keepIdle(ch, c.file) {
		return nil
	}
	if keep {
		c.file.Close()
	}
	C.rdma_destroy_event_channel(ch)
	return nil
}

// ID is an rdma_cm communication identifier.
type ID struct {
	mu sync.Mutex
	id *C.struct_rdma_cm_id
	ch *Channel
}

// errDestroyed is returned by methods of an ID after Destroy.
var errDestroyed = errors.New("rdma_cm id already destroyed")

// do runs f with the id's C pointer while holding i.mu, so Destroy cannot
// free it underneath (the connection's event loop and Close race otherwise).
func (i *ID) do(op string, f func(*C.struct_rdma_cm_id) C.int) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.id == nil {
		// The library used an id after destroying it: where it did is
		// what to fix, so the error carries the stack (%+v prints it).
		return cerrors.WithStack(fmt.Errorf("%s: %w", op, errDestroyed))
	}
	if ret := f(i.id); ret != 0 {
		return fmt.Errorf("%s: %w", op, syscall.Errno(-ret))
	}
	return nil
}

// CreateID creates an id in the TCP port space on c.
func (c *Channel) CreateID() (*ID, error) {
	c.mu.Lock()
	ch := c.ch
	c.mu.Unlock()
	if ch == nil {
		// Closed: with no channel librdmacm would make a synchronous id.
		return nil, fmt.Errorf("rdma_create_id: %w", net.ErrClosed)
	}
	var id *C.struct_rdma_cm_id
	var ret C.int
	if fast() {
		a := C.cm_fast_args{op: C.CM_CREATE_ID, ch: ch, idp: &id}
		ret = callFast(&a)
	} else {
		ret = C.create_id(ch, &id)
	}
	if ret != 0 {
		return nil, fmt.Errorf("rdma_create_id: %w", syscall.Errno(-ret))
	}
	i := &ID{id: id, ch: c}
	c.mu.Lock()
	c.ids[id] = i
	c.mu.Unlock()
	return i, nil
}

// Migrate moves the id (e.g. one from EventConnectRequest) to channel c.
func (i *ID) Migrate(c *Channel) error {
	old := i.ch
	c.mu.Lock()
	ch := c.ch
	if ch != nil {
		c.ids[i.id] = i
	}
	c.mu.Unlock()
	if ch == nil {
		return fmt.Errorf("rdma_migrate_id: %w", net.ErrClosed)
	}
	var err error
	if fast() {
		a := C.cm_fast_args{op: C.CM_MIGRATE, ch: ch}
		err = i.doFast("rdma_migrate_id", &a)
	} else {
		err = i.do("rdma_migrate_id", func(id *C.struct_rdma_cm_id) C.int {
			return C.rdma_migrate_id_e(id, ch)
		})
	}
	if err != nil {
		c.mu.Lock()
		delete(c.ids, i.id)
		c.mu.Unlock()
		return err
	}
	if old != nil {
		old.mu.Lock()
		delete(old.ids, i.id)
		old.mu.Unlock()
	}
	i.ch = c
	return nil
}

func toSockaddr(ap netip.AddrPort) (unsafe.Pointer, func()) {
	if ap.Addr().Is4() || ap.Addr().Is4In6() {
		sa := (*C.struct_sockaddr_in)(C.calloc(1, C.sizeof_struct_sockaddr_in))
		sa.sin_family = C.AF_INET
		sa.sin_port = C.in_port_t(htons(ap.Port()))
		a := ap.Addr().Unmap().As4()
		C.memcpy(unsafe.Pointer(&sa.sin_addr), unsafe.Pointer(&a[0]), 4)
		return unsafe.Pointer(sa), func() { C.free(unsafe.Pointer(sa)) }
	}
	sa := (*C.struct_sockaddr_in6)(C.calloc(1, C.sizeof_struct_sockaddr_in6))
	sa.sin6_family = C.AF_INET6
	sa.sin6_port = C.in_port_t(htons(ap.Port()))
	a := ap.Addr().As16()
	C.memcpy(unsafe.Pointer(&sa.sin6_addr), unsafe.Pointer(&a[0]), 16)
	return unsafe.Pointer(sa), func() { C.free(unsafe.Pointer(sa)) }
}

func fromSockaddr(p *C.struct_sockaddr) netip.AddrPort {
	if p == nil {
		return netip.AddrPort{}
	}
	switch p.sa_family {
	case C.AF_INET:
		sa := (*C.struct_sockaddr_in)(unsafe.Pointer(p))
		var a [4]byte
		C.memcpy(unsafe.Pointer(&a[0]), unsafe.Pointer(&sa.sin_addr), 4)
		return netip.AddrPortFrom(netip.AddrFrom4(a), htons(uint16(sa.sin_port)))
	case C.AF_INET6:
		sa := (*C.struct_sockaddr_in6)(unsafe.Pointer(p))
		var a [16]byte
		C.memcpy(unsafe.Pointer(&a[0]), unsafe.Pointer(&sa.sin6_addr), 16)
		return netip.AddrPortFrom(netip.AddrFrom16(a), htons(uint16(sa.sin6_port)))
	}
	return netip.AddrPort{}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// BindAddr binds the id to a local address (port 0 picks a free port on listen).
func (i *ID) BindAddr(ap netip.AddrPort) error {
	sa, free := toSockaddr(ap)
	defer free()
	if ret := C.rdma_bind_addr_e(i.id, (*C.struct_sockaddr)(sa)); ret != 0 {
		return fmt.Errorf("rdma_bind_addr %s: %w", ap, syscall.Errno(-ret))
	}
	return nil
}

// Listen starts listening; connection requests arrive as EventConnectRequest.
func (i *ID) Listen(backlog int) error {
	if i.ch != nil {
		i.ch.reusable.Store(false)
	}
	if ret := C.rdma_listen_e(i.id, C.int(backlog)); ret != 0 {
		return fmt.Errorf("rdma_listen: %w", syscall.Errno(-ret))
	}
	return nil
}

// ResolveAddr starts resolving dst (from src if valid); EventAddrResolved follows.
func (i *ID) ResolveAddr(src, dst netip.AddrPort, timeoutMS int) error {
	dsa, freeDst := toSockaddr(dst)
	defer freeDst()
	var ssa unsafe.Pointer
	if src.IsValid() {
		var freeSrc func()
		ssa, freeSrc = toSockaddr(src)
		defer freeSrc()
	}
	if fast() {
		a := C.cm_fast_args{op: C.CM_RESOLVE_ADDR, src: (*C.struct_sockaddr)(ssa), dst: (*C.struct_sockaddr)(dsa), arg: C.int(timeoutMS)}
		return i.doFast("rdma_resolve_addr "+dst.String(), &a)
	}
	return i.do("rdma_resolve_addr "+dst.String(), func(id *C.struct_rdma_cm_id) C.int {
		return C.rdma_resolve_addr_e(id, (*C.struct_sockaddr)(ssa), (*C.struct_sockaddr)(dsa), C.int(timeoutMS))
	})
}

// ResolveRoute starts route resolution; EventRouteResolved follows.
func (i *ID) ResolveRoute(timeoutMS int) error {
	if fast() {
		a := C.cm_fast_args{op: C.CM_RESOLVE_ROUTE, arg: C.int(timeoutMS)}
		return i.doFast("rdma_resolve_route", &a)
	}
	return i.do("rdma_resolve_route", func(id *C.struct_rdma_cm_id) C.int {
		return C.rdma_resolve_route_e(id, C.int(timeoutMS))
	})
}

// ConnParam are the connection parameters sent with connect or accept.
type ConnParam struct {
	PrivateData        []byte
	ResponderResources uint8
	InitiatorDepth     uint8
	RetryCount         uint8
	RNRRetryCount      uint8
	QPNum              uint32
	// Blocking: the call may wait on the network (on iWARP, rdma_connect
	// makes the TCP connection and rdma_accept sends the MPA reply): it
	// goes through cgo, never the fast form (fastcall.go).
	Blocking bool
}

func (i *ID) connParam(accept bool, p ConnParam) error {
	var priv unsafe.Pointer
	if len(p.PrivateData) > 0 {
		priv = C.CBytes(p.PrivateData)
		defer C.free(priv)
	}
	a := C.int(0)
	if accept {
		a = 1
	}
	op := "rdma_connect"
	if accept {
		op = "rdma_accept"
	}
	if fast() && !p.Blocking {
		cp := C.struct_rdma_conn_param{
			private_data: priv, private_data_len: C.uint8_t(len(p.PrivateData)),
			responder_resources: C.uint8_t(p.ResponderResources), initiator_depth: C.uint8_t(p.InitiatorDepth),
			retry_count: C.uint8_t(p.RetryCount), rnr_retry_count: C.uint8_t(p.RNRRetryCount), qp_num: C.uint32_t(p.QPNum),
		}
		fa := C.cm_fast_args{op: C.CM_CONNECT, param: &cp}
		if accept {
			fa.op = C.CM_ACCEPT
		}
		return i.doFast(op, &fa)
	}
	return i.do(op, func(id *C.struct_rdma_cm_id) C.int {
		return C.conn_param_call(a, id, priv, C.int(len(p.PrivateData)), C.uint8_t(p.ResponderResources),
			C.uint8_t(p.InitiatorDepth), C.uint8_t(p.RetryCount), C.uint8_t(p.RNRRetryCount), C.uint32_t(p.QPNum))
	})
}

// Connect sends the connection request (EventConnectResponse, EventRejected, ... follow).
func (i *ID) Connect(p ConnParam) error { return i.connParam(false, p) }

// Accept accepts a connection request (EventEstablished follows).
func (i *ID) Accept(p ConnParam) error { return i.connParam(true, p) }

// Establish completes an active connection whose QP the caller moved to RTS.
func (i *ID) Establish() error {
	if fast() {
		a := C.cm_fast_args{op: C.CM_ESTABLISH}
		return i.doFast("rdma_establish", &a)
	}
	return i.do("rdma_establish", func(id *C.struct_rdma_cm_id) C.int { return C.rdma_establish_e(id) })
}

// NotifyEstablished tells the CM that the passive side's QP has received
// from the dialer (rdma_notify with IBV_EVENT_COMM_EST): the dialer is
// established although its RTU has not arrived. The RTU is one
// unacknowledged CM datagram; if it is lost the CM resends the REP only
// after its response timeout (seconds). The CM then raises
// EventEstablished at once; an RTU arriving later is ignored.
func (i *ID) NotifyEstablished() error {
	if fast() {
		a := C.cm_fast_args{op: C.CM_NOTIFY_ESTABLISHED}
		return i.doFast("rdma_notify", &a)
	}
	return i.do("rdma_notify", func(id *C.struct_rdma_cm_id) C.int { return C.rdma_notify_comm_est_e(id) })
}

// Reject refuses a connection request, carrying privateData to the peer.
func (i *ID) Reject(privateData []byte) error {
	var priv unsafe.Pointer
	if len(privateData) > 0 {
		priv = C.CBytes(privateData)
		defer C.free(priv)
	}
	return i.do("rdma_reject", func(id *C.struct_rdma_cm_id) C.int {
		return C.rdma_reject_e(id, priv, C.uint8_t(len(privateData)))
	})
}

// Disconnect tears the connection down (the peer gets EventDisconnected).
func (i *ID) Disconnect() error {
	return i.do("rdma_disconnect", func(id *C.struct_rdma_cm_id) C.int { return C.rdma_disconnect_e(id) })
}

// Verbs is the device context the id is bound to (nil before address resolution).
func (i *ID) Verbs() unsafe.Pointer { return C.id_verbs(i.id) }

// PortNum is the device port the id is bound to.
func (i *ID) PortNum() uint8 { return uint8(C.id_port(i.id)) }

// LocalAddr and PeerAddr report the id's addresses (zero once the id is
// destroyed).
func (i *ID) LocalAddr() netip.AddrPort {
	if i.id == nil {
		return netip.AddrPort{}
	}
	return fromSockaddr(C.local_addr(i.id))
}

func (i *ID) PeerAddr() netip.AddrPort {
	if i.id == nil {
		return netip.AddrPort{}
	}
	return fromSockaddr(C.peer_addr(i.id))
}

// InitQPAttr asks rdma_cm for the attributes that move a QP to state.
func (i *ID) InitQPAttr(state verbs.QPState) (verbs.QPAttr, verbs.AttrMask, error) {
	buf := C.calloc(1, C.size_t(verbs.SizeofQPAttr))
	defer C.free(buf)
	var mask C.int
	var err error
	if fast() {
		a := C.cm_fast_args{op: C.CM_INIT_QP_ATTR, attr: (*C.struct_ibv_qp_attr)(buf), mask: &mask, arg: C.int(state)}
		err = i.doFast("rdma_init_qp_attr "+state.String(), &a)
	} else {
		err = i.do("rdma_init_qp_attr "+state.String(), func(id *C.struct_rdma_cm_id) C.int {
			return C.init_qp_attr(id, buf, C.int(state), &mask)
		})
	}
	if err != nil {
		return verbs.QPAttr{}, 0, err
	}
	return verbs.QPAttrFromC(buf), verbs.AttrMask(mask), nil
}

// Destroy destroys the id. Idempotent. Its events must all be acknowledged,
// which the channel does as it reads them.
func (i *ID) Destroy() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.id == nil {
		return nil
	}
	if i.ch != nil {
		i.ch.mu.Lock()
		delete(i.ch.ids, i.id)
		i.ch.mu.Unlock()
	}
	ret := C.rdma_destroy_id_e(i.id)
	i.id = nil
	if ret != 0 {
		return fmt.Errorf("rdma_destroy_id: %w", syscall.Errno(-ret))
	}
	return nil
}

// Adopt registers an id that arrived with EventConnectRequest on channel c, so
// that its later events (until it is migrated) are delivered.
func (c *Channel) Adopt(i *ID) {
	c.mu.Lock()
	c.ids[i.id] = i
	c.mu.Unlock()
	i.ch = c
}

// Context is the verbs device context the id is bound to (owned by rdma_cm).
func (i *ID) Context() (*verbs.Context, error) {
	p := i.Verbs()
	if p == nil {
		return nil, errors.New("rdma_cm id has no device yet (resolve or bind first)")
	}
	return verbs.WrapContext(p), nil
}
