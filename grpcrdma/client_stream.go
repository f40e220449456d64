package grpcrdma

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/verbline/rdma/grpcrdma/internal/frame"
)

// errStreamEnded: the server ended the call; SendMsg returns io.EOF and
// RecvMsg the status.
var errStreamEnded = errors.New("grpcrdma: the server ended the call")

// clientStream is a call as the caller sees it: a grpc.ClientStream.
type clientStream struct {
	cc     *ClientConn
	t      *transport
	s      *stream
	ci     *callInfo
	ctx    context.Context
	desc   *grpc.StreamDesc
	method string
	stop   func() bool // stops the context watch

	sendMu      sync.Mutex // serialises the call's frames; guards the two below
	headersSent bool
	endSent     bool

	finishOnce sync.Once
	retryable  bool // unary: an unserved end is retried, and not reported to the call options
}

// errNotOpened and errUnserved end calls no server saw: the first frame
// never left (the connection was closing or going away), or the server's
// GOAWAY excluded it.
var (
	errNotOpened = status.Error(codes.Unavailable, "grpcrdma: the connection closed or is going away")
	errUnserved  = status.Error(codes.Unavailable, "grpcrdma: the server is going away; the call was not served")
)

func isUnserved(err error) bool { return err == errNotOpened || err == errUnserved }

func (cc *ClientConn) newClientStream(ctx context.Context, desc *grpc.StreamDesc, method string, ci *callInfo, watch bool) (*clientStream, error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	for attempt := 0; ; attempt++ {
		t, err := cc.transport(ctx)
		if err != nil {
			return nil, err
		}
		select {
		case t.slots <- struct{}{}:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-t.done:
			continue
		}
		if !t.usable() {
			t.releaseSlot()
			if attempt < 3 {
				continue
			}
			return nil, status.Error(codes.Unavailable, "grpcrdma: no usable connection")
		}
		// The stream gets its id, and its place in t.streams, when its first
		// frame goes out (open): ids reach the server in increasing order.
		s := newStream(t, 0)
		s.maxRecv = ci.maxRecv
		s.slot = true
		cs := &clientStream{cc: cc, t: t, s: s, ci: ci, ctx: ctx, desc: desc, method: method}
		if watch && ctx.Done() != nil {
			cs.stop = context.AfterFunc(ctx, func() { cs.abort(status.FromContextError(ctx.Err()).Err()) })
		}
		return cs, nil
	}
}

// appendRequestHeaders appends the call's request headers.
func (cs *clientStream) appendRequestHeaders(b []byte) []byte {
	b = frame.AppendString(b, frame.KindPath, cs.method)
	if dl, ok := cs.ctx.Deadline(); ok {
		b = frame.AppendTimeout(b, time.Until(dl))
	}
	if st := cs.ci.subtype(); st != "" {
		b = frame.AppendString(b, frame.KindContentSubtype, st)
	}
	if md, ok := metadata.FromOutgoingContext(cs.ctx); ok {
		b = frame.AppendMD(b, frame.KindHeader, md)
	}
	return b
}

func (cs *clientStream) Context() context.Context { return cs.ctx }

// sendMsg sends m, with the headers if not sent yet and the end of the
// requests if end.
func (cs *clientStream) sendMsg(m any, end bool) error {
	if cs.peerEnded() {
		return errStreamEnded
	}
	e, err := encode(cs.ci.codec, m)
	if err != nil {
		cs.abort(err)
		return err
	}
	if e.n > cs.ci.maxSend {
		e.free()
		err := status.Errorf(codes.ResourceExhausted, "grpc: trying to send message larger than max (%d vs. %d)", e.n, cs.ci.maxSend)
		cs.abort(err)
		return err
	}
	if err := cs.t.acquire(cs.ctx, cs.s, errStreamEnded, e.n); err != nil {
		e.free()
		return cs.sendFailed(err)
	}
	cs.sendMu.Lock()
	defer cs.sendMu.Unlock()
	if cs.endSent {
		e.free()
		return status.Error(codes.Internal, "grpcrdma: SendMsg after CloseSend")
	}
	flags := frame.FlagMessage
	bp := getBlock()
	defer putBlock(bp)
	if !cs.headersSent {
		flags |= frame.FlagHeaders
		*bp = cs.appendRequestHeaders(*bp)
	}
	if end {
		flags |= frame.FlagEnd
	}
	if err := cs.frame(flags, *bp, &e); err != nil {
		return cs.sendFailedLocked(err)
	}
	cs.headersSent = true
	cs.endSent = end
	return nil
}

// frame sends one STREAM frame of the call; the first opens the stream.
// Called with sendMu held.
func (cs *clientStream) frame(flags uint8, block []byte, e *encoded) error {
	h := frame.Header{Type: frame.TypeStream, Flags: flags, Value: uint32(len(block))}
	if cs.headersSent {
		h.Stream = cs.s.id
		return cs.t.sendFrame(cs.ctx, h, block, e)
	}
	return cs.t.open(cs.ctx, cs.s, h, block, e)
}

func (cs *clientStream) peerEnded() bool {
	cs.s.mu.Lock()
	defer cs.s.mu.Unlock()
	return cs.s.peerEnd || cs.s.err != nil
}

// sendFailed turns a failed send into SendMsg's result: io.EOF semantics
// when the stream already ended (RecvMsg has the status), else the error,
// which ends the call.
func (cs *clientStream) sendFailed(err error) error {
	if err == errStreamEnded || cs.peerEnded() {
		return errStreamEnded
	}
	cs.abort(err)
	return err
}

func (cs *clientStream) sendFailedLocked(err error) error {
	if cs.peerEnded() {
		return errStreamEnded
	}
	if cs.headersSent && !cs.s.ended() {
		cs.t.sendControl(frame.Header{Type: frame.TypeCancel, Stream: cs.s.id, Value: uint32(status.Code(err))}, nil)
	}
	if cs.s.fail(err) {
		go cs.finish(err) // abort's work without its lock
	}
	return err
}

func (cs *clientStream) SendMsg(m any) error {
	err := cs.sendMsg(m, false)
	if err == errStreamEnded {
		return io.EOF
	}
	return err
}

func (cs *clientStream) CloseSend() error {
	cs.sendMu.Lock()
	defer cs.sendMu.Unlock()
	if cs.endSent || cs.peerEnded() {
		return nil
	}
	flags := frame.FlagEnd
	bp := getBlock()
	defer putBlock(bp)
	if !cs.headersSent {
		flags |= frame.FlagHeaders
		*bp = cs.appendRequestHeaders(*bp)
	}
	if err := cs.frame(flags, *bp, nil); err != nil {
		cs.sendFailedLocked(err)
		return nil // as grpc-go: the error shows in RecvMsg
	}
	cs.headersSent, cs.endSent = true, true
	return nil
}

// flushHeaders sends the request headers if nothing was sent yet, so the
// server knows of the call before the caller waits for its answer.
func (cs *clientStream) flushHeaders() {
	cs.sendMu.Lock()
	defer cs.sendMu.Unlock()
	if cs.headersSent || cs.peerEnded() {
		return
	}
	bp := getBlock()
	defer putBlock(bp)
	*bp = cs.appendRequestHeaders(*bp)
	if err := cs.frame(frame.FlagHeaders, *bp, nil); err != nil {
		cs.sendFailedLocked(err)
		return
	}
	cs.headersSent = true
}

func (cs *clientStream) Header() (metadata.MD, error) {
	cs.flushHeaders()
	md, err := cs.s.waitHeader(cs.ctx)
	if err != nil {
		cs.abort(err)
		return nil, err
	}
	return md, nil
}

func (cs *clientStream) Trailer() metadata.MD {
	cs.s.mu.Lock()
	defer cs.s.mu.Unlock()
	return cs.s.trailer
}

func (cs *clientStream) RecvMsg(m any) error {
	cs.flushHeaders()
	if err := cs.recv(m); err != nil {
		return err
	}
	if cs.desc.ServerStreams {
		return nil
	}
	// One response: the call ends with the status that follows it.
	msg, err := cs.s.next(cs.ctx)
	if err == nil {
		msg.release(cs.t)
		cs.t.returned(msg.size)
		err = status.Error(codes.Internal, "grpcrdma: more than one response message for a call that has one")
		cs.abort(err)
		return err
	}
	return cs.end(err, false)
}

// recv receives one message into m, or the call's end.
func (cs *clientStream) recv(m any) error {
	msg, err := cs.s.next(cs.ctx)
	if err != nil {
		return cs.end(err, true)
	}
	if msg.tooBig {
		cs.s.consumed(msg.size)
		err := status.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", msg.size, cs.s.maxRecv)
		cs.abort(err)
		return err
	}
	n := len(msg.data)
	err = decode(cs.ci.codec, msg.data, m)
	msg.release(cs.t)
	cs.s.consumed(n)
	if err != nil {
		cs.abort(err)
	}
	return err
}

// end turns next's error into RecvMsg's: at io.EOF, the server's status
// (io.EOF itself for OK if noMsgOK, else an error: a call with one
// response must have it).
func (cs *clientStream) end(err error, first bool) error {
	if err != io.EOF {
		cs.abort(err)
		return err
	}
	cs.s.mu.Lock()
	st := cs.s.st
	cs.s.mu.Unlock()
	if st == nil {
		st = status.New(codes.Internal, "grpcrdma: the call ended without a status")
	}
	err = st.Err()
	if err == nil && first {
		if !cs.desc.ServerStreams {
			err = status.Error(codes.Internal, "grpcrdma: the server sent no response message")
		} else {
			err = io.EOF
		}
	}
	cs.finish(st.Err())
	cs.s.drop()
	return err
}

// abort ends the call here with err: the server is told (CANCEL) if it
// knows of the call, and blocked operations return err.
func (cs *clientStream) abort(err error) {
	// CANCEL goes out before the stream lets go of its slot, so the
	// server never counts more streams than it allows.
	cs.sendMu.Lock()
	sent := cs.headersSent
	cs.sendMu.Unlock()
	if sent && !cs.s.ended() {
		cs.t.sendControl(frame.Header{Type: frame.TypeCancel, Stream: cs.s.id, Value: uint32(status.Code(err))}, nil)
	}
	cs.s.fail(err)
	cs.finish(err)
}

// finish hands the call's results to its call options, once.
func (cs *clientStream) finish(err error) {
	if cs.retryable && isUnserved(err) {
		return // the call goes on in another attempt
	}
	cs.finishOnce.Do(func() {
		if cs.stop != nil {
			cs.stop()
		}
		cs.s.mu.Lock()
		h, tr := cs.s.header, cs.s.trailer
		cs.s.mu.Unlock()
		cs.ci.finish(h, tr, cs.t.peerInfo, err)
	})
}
