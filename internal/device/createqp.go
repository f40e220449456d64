//go:build linux && cgo

package device

import (
	"sync/atomic"

	"github.com/verbline/rdma/internal/verbs"
)

// InlineRequest is the inline room asked for at QP creation: payloads up to
// it are copied into the work request at post time, so small sends need no
// DMA read of their buffer (the device may grant more; a device that
// refuses gets a QP with less inline room, or none).
const InlineRequest = 256

// minInline is the smallest inline room worth a QP: below it the device's
// QPs get none.
const minInline = 32

// CreateQP creates a QP of qpc through create (a PD's CreateQP or
// CreateUDQP): the RC connections' and the PacketConns' QPs. A device with
// less inline room than qpc asks for refuses the QP (devices do not report
// their limit): it is asked again with half the room, down to minInline,
// then with none (Soft-iWARP allows 80 bytes: its QPs get 64). granted
// holds what the device last granted (the Device's InlineGranted), so only
// its first QP searches. It returns the configuration used.
func CreateQP(create func(verbs.QPConfig) (*verbs.QP, error), qpc verbs.QPConfig, granted *atomic.Int32) (*verbs.QP, verbs.QPConfig, error) {
	if g := int(granted.Load()); g > 0 && g < qpc.InlineData || g < 0 {
		qpc.InlineData = max(g, 0)
	}
	qp, err := create(qpc)
	for err != nil && qpc.InlineData > 0 {
		if qpc.InlineData /= 2; qpc.InlineData < minInline {
			qpc.InlineData = 0
		}
		qp, err = create(qpc)
	}
	if err == nil && qpc.InlineData < InlineRequest {
		granted.Store(int32(qpc.InlineData))
		if qpc.InlineData == 0 {
			granted.Store(-1) // none: -1, as 0 means not known yet
		}
	}
	return qp, qpc, err
}
