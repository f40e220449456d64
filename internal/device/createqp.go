//go:build linux && cgo

package device

import "github.com/verbline/rdma/internal/verbs"

// InlineRequest is the inline room asked for at QP creation: payloads up to
// it are copied into the work request at post time, so small sends need no
// DMA read of their buffer (the device may grant more; a device that
// refuses gets a QP without inline room).
const InlineRequest = 256

// CreateQP creates a QP of qpc through create (a PD's CreateQP or
// CreateUDQP): the RC connections' and the PacketConns' QPs. A device with
// less inline room than qpc asks for (or none) refuses the QP: it is then
// created without inline room, and every payload is posted by reference.
// It returns the configuration used.
func CreateQP(create func(verbs.QPConfig) (*verbs.QP, error), qpc verbs.QPConfig) (*verbs.QP, verbs.QPConfig, error) {
	qp, err := create(qpc)
	if err != nil && qpc.InlineData > 0 {
		qpc.InlineData = 0
		qp, err = create(qpc)
	}
	return qp, qpc, err
}
