//go:build linux && cgo

package rdma

import (
	"fmt"
	"testing"

	"github.com/verbline/rdma/internal/verbs"
)

// CheckLeaksAtEnd is checkLeaksAtEnd for the external test package
// (example_rdma_test.go runs the examples under the same leak checks as
// the package's own tests).
func CheckLeaksAtEnd(t testing.TB) { checkLeaksAtEnd(t) }

// OnIWARPDevice reports whether the test device is an iWARP device, for
// the external test package.
func OnIWARPDevice(t *testing.T) bool { return testDeviceCaps(t).Transport == verbs.TransportIWARP }

// debugState describes the connection's credit and queue accounting, for a
// test that found a connection stalled.
func (c *Conn) debugState() string {
	e := &c.engine
	e.mu.Lock()
	defer e.mu.Unlock()
	s, w, q := &e.stream, &e.win, &e.sendq
	return fmt.Sprintf("features %#x trailers %v | stream: credits %d pending %d uncredited %d rqLen %d eof %v sendSeq %d sendDone %d sendFree %d | "+
		"window: size %d rvReserve %d peerCredits %d starved %v | sendq: inFlight %d reserved %d unsig %d | recvPosted %d recvReady %d deferred %v | closed %v qpDown %v released %v | stats %+v",
		e.features, e.trailers, s.credits, s.pending, s.uncredited, s.rqLen, s.eof, s.sendSeq, s.sendDone, len(s.sendFree),
		w.size, w.rvReserve, w.peerCredits, w.peerStarved, q.inFlight, q.reserved, q.unsig,
		e.recvPosted, len(e.recvReady), e.recvDeferred.Load(), e.closed, e.qpDown, e.released, e.stats())
}
