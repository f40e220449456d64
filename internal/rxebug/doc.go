// Package rxebug reproduces, with plain verbs on one Soft-RoCE device and
// none of the library's protocol, the rxe (Linux 6.1) defect that can hang
// a large message's rendezvous on a lossy wire: a retransmission re-executes a
// memory-window bind that was already executed but not yet completed, the
// second bind fails, and the requester stops without moving the QP to the
// error state (see bindReadyLocked in the root package's post.go for the
// analysis and the library's workaround).
//
// The retry is forced without a wire: the responder has no receive posted,
// so it answers the SEND with an RNR NAK, and the requester retries the
// send queue when the RNR timer fires, rewinding to the oldest uncompleted
// work request exactly as a retransmission timeout or a NAK on a lossy
// wire does (req_retry in rxe_req.c). Only the tests' file holds code.
package rxebug
