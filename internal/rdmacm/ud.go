//go:build linux && cgo

package rdmacm

/*
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <rdma/rdma_cma.h>

// goudevent is what Go needs of an event in the UDP port space: the UD
// parameters (how to reach the peer's QP) instead of the connection ones.
typedef struct {
	struct rdma_cm_id *id;
	int event;
	int status;
	int priv_len;
	uint32_t qp_num, qkey;
	struct ibv_ah_attr ah_attr;
} goudevent;

// ud_get_event takes one event without blocking, copies it out and acks it.
// Returns 1 on an event, 0 on EAGAIN, -errno on error.
static int ud_get_event(struct rdma_event_channel *ch, goudevent *out, uint8_t *priv, int cap) {
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev)) return errno == EAGAIN ? 0 : -errno;
	out->id = ev->id;
	out->event = ev->event;
	out->status = ev->status;
	out->priv_len = 0;
	out->qp_num = ev->param.ud.qp_num;
	out->qkey = ev->param.ud.qkey;
	memcpy(&out->ah_attr, &ev->param.ud.ah_attr, sizeof(out->ah_attr));
	if (ev->param.ud.private_data && ev->param.ud.private_data_len) {
		int n = ev->param.ud.private_data_len < cap ? ev->param.ud.private_data_len : cap;
		memcpy(priv, ev->param.ud.private_data, n);
		out->priv_len = n;
	}
	rdma_ack_cm_event(ev);
	return 1;
}

static struct rdma_event_channel *ud_create_channel(int *err) {
	struct rdma_event_channel *ch = rdma_create_event_channel();
	*err = ch ? 0 : errno;
	if (ch) {
		int fl = fcntl(ch->fd, F_GETFL);
		if (fl < 0 || fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
			*err = errno;
			rdma_destroy_event_channel(ch);
			return NULL;
		}
	}
	return ch;
}

static int ud_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id) {
	return rdma_create_id(ch, id, NULL, RDMA_PS_UDP) ? -errno : 0;
}
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/verbline/rdma/internal/verbs"
)

// UDEvent is one CM event of the UDP port space. Address resolution for
// unreliable datagrams (SIDR) ends in EventEstablished on the resolving id,
// carrying how to reach the peer's QP; the peer's listening id gets
// EventConnectRequest and answers with Accept (its QP number).
type UDEvent struct {
	Type        EventType
	Status      int    // negative errno, or a SIDR status for EventUnreachable
	ID          *ID    // the id the event is for (a new, unowned id for EventConnectRequest)
	PrivateData []byte // as the peer sent it (padded with zeros)
	// EventEstablished: the address vector to the peer's port, its QP
	// number and Q_Key.
	AH    verbs.AHAttr
	QPNum uint32
	QKey  uint32
}

// UDChannel is an event channel for ids in the UDP port space (RDMA_PS_UDP,
// unreliable datagrams). It is a Channel whose events carry the UD
// parameters: read them from UDEvents (a goroutine of its own delivers
// them), not with Next.
type UDChannel struct {
	*Channel
	udEvents chan UDEvent
	stopOnce sync.Once
	loopDone chan struct{}
}

// NewUDChannel creates an event channel for UD ids and starts delivering
// its events on UDEvents.
func NewUDChannel() (*UDChannel, error) {
	var e C.int
	ch := C.ud_create_channel(&e)
	if ch == nil {
		if e == C.ENODEV || e == C.ENOENT {
			return nil, ErrNoCM
		}
		return nil, fmt.Errorf("rdma_create_event_channel: %w", syscall.Errno(e))
	}
	dup, err := unix.FcntlInt(uintptr(ch.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		C.rdma_destroy_event_channel(ch)
		return nil, fmt.Errorf("dup rdma_cm channel fd: %w", err)
	}
	c, err := newChannel(ch, os.NewFile(uintptr(dup), "rdma_cm-ud"), false)
	if err != nil {
		return nil, err
	}
	u := &UDChannel{Channel: c, udEvents: make(chan UDEvent, 16), loopDone: make(chan struct{})}
	go u.udLoop(c.rch)
	return u, nil
}

// UDEvents delivers the channel's events; it is closed after Stop (or
// Close), once every event already taken from the kernel is delivered. Its
// reader must read it until it is closed: an EventConnectRequest carries a
// new id that only its reader can destroy.
func (u *UDChannel) UDEvents() <-chan UDEvent { return u.udEvents }

// Stop ends delivery: no event is taken from the kernel after it, UDEvents
// is closed once those already taken are read, and the ids stay usable
// (destroy them, then Close). Idempotent; it waits for the delivery
// goroutine, so UDEvents' reader must keep reading meanwhile.
func (u *UDChannel) Stop() {
	u.stopOnce.Do(func() { u.file.Close() }) // ends the loop's Read
	<-u.loopDone
}

// Close stops delivery (see Stop) and destroys the channel. Every id on it
// must be destroyed first.
func (u *UDChannel) Close() error {
	u.Stop()
	return u.Channel.Close()
}

func (u *UDChannel) udLoop(ch *C.struct_rdma_event_channel) {
	c := u.Channel
	defer close(u.loopDone)
	defer close(u.udEvents)
	var ev C.goudevent
	priv := make([]byte, 256)
	for {
		var got C.int
		err := c.rc.Read(func(uintptr) bool {
			got = C.ud_get_event(ch, &ev, (*C.uint8_t)(unsafe.Pointer(&priv[0])), C.int(len(priv)))
			return got != 0
		})
		if err != nil || got < 0 {
			return // the file was closed (Close) or the channel failed
		}
		out := UDEvent{Type: EventType(ev.event), Status: int(ev.status), QPNum: uint32(ev.qp_num), QKey: uint32(ev.qkey)}
		if out.Type == EventEstablished {
			out.AH = verbs.AHAttrFromC(unsafe.Pointer(&ev.ah_attr))
		}
		if ev.priv_len > 0 {
			out.PrivateData = append([]byte(nil), priv[:ev.priv_len]...)
		}
		cid := ev.id
		c.mu.Lock()
		out.ID = c.ids[cid]
		if out.ID == nil && out.Type == EventConnectRequest {
			out.ID = &ID{id: cid}
		}
		c.mu.Unlock()
		if out.ID == nil {
			continue // an id this channel no longer tracks (destroyed)
		}
		u.udEvents <- out // Stop waits for this: UDEvents' reader reads until it is closed
	}
}

// CreateUDID creates an id in the UDP port space (unreliable datagrams) on u.
func (u *UDChannel) CreateUDID() (*ID, error) {
	var id *C.struct_rdma_cm_id
	if ret := C.ud_create_id(u.ch, &id); ret != 0 {
		return nil, fmt.Errorf("rdma_create_id (UDP port space): %w", syscall.Errno(-ret))
	}
	i := &ID{id: id, ch: u.Channel}
	u.mu.Lock()
	u.ids[id] = i
	u.mu.Unlock()
	return i, nil
}
