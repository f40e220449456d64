package grpcrdma

import (
	"context"
	"errors"
	"io"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/verbline/rdma/grpcrdma/internal/frame"
)

// errCallEnded is what a server stream's operations return after the call
// ended with an OK status.
var errCallEnded = status.Error(codes.Internal, "grpcrdma: the call has ended")

// serverStream is a call as its handler sees it: a grpc.ServerStream.
type serverStream struct {
	srv    *Server
	t      *transport
	s      *stream
	ctx    context.Context
	cancel context.CancelFunc
	method string
	codec  encoding.CodecV2

	sendMu sync.Mutex // serialises the stream's frames: the handler's and finish's

	mu         sync.Mutex // guards the fields below
	header     metadata.MD
	headerSent bool
	trailer    metadata.MD
	finished   bool
}

var errHeaderSent = status.Error(codes.Internal, "transport: the stream is done or WriteHeader was already called")

func (ss *serverStream) Context() context.Context { return ss.ctx }

func (ss *serverStream) SetHeader(md metadata.MD) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.headerSent || ss.finished {
		return errHeaderSent
	}
	ss.header = metadata.Join(ss.header, md)
	return nil
}

func (ss *serverStream) SendHeader(md metadata.MD) error {
	ss.sendMu.Lock()
	defer ss.sendMu.Unlock()
	ss.mu.Lock()
	if ss.headerSent || ss.finished {
		ss.mu.Unlock()
		return errHeaderSent
	}
	ss.headerSent = true
	h := metadata.Join(ss.header, md)
	ss.mu.Unlock()
	bp := getBlock()
	defer putBlock(bp)
	*bp = frame.AppendMD(*bp, frame.KindHeader, h)
	return ss.t.sendFrame(ss.ctx, frame.Header{Type: frame.TypeStream, Flags: frame.FlagHeaders, Stream: ss.s.id, Value: uint32(len(*bp))}, *bp, nil)
}

func (ss *serverStream) SetTrailer(md metadata.MD) {
	ss.mu.Lock()
	ss.trailer = metadata.Join(ss.trailer, md)
	ss.mu.Unlock()
}

// SendMsg sends m, with the headers if none were sent yet.
func (ss *serverStream) SendMsg(m any) error {
	e, err := encode(ss.codec, m)
	if err != nil {
		return err
	}
	if e.n > ss.t.local.maxSendMsg {
		e.free()
		return status.Errorf(codes.ResourceExhausted, "grpc: trying to send message larger than max (%d vs. %d)", e.n, ss.t.local.maxSendMsg)
	}
	if err := ss.t.acquire(ss.ctx, ss.s, errCallEnded, e.n); err != nil {
		e.free()
		return ss.sendErr(err)
	}
	ss.sendMu.Lock()
	defer ss.sendMu.Unlock()
	ss.mu.Lock()
	if ss.finished {
		ss.mu.Unlock()
		e.free()
		return ss.sendErr(errCallEnded)
	}
	flags := frame.FlagMessage
	var h metadata.MD
	if !ss.headerSent {
		ss.headerSent = true
		flags |= frame.FlagHeaders
		h = ss.header
	}
	ss.mu.Unlock()
	bp := getBlock()
	defer putBlock(bp)
	*bp = frame.AppendMD(*bp, frame.KindHeader, h)
	return ss.sendErr(ss.t.sendFrame(ss.ctx, frame.Header{Type: frame.TypeStream, Flags: flags, Stream: ss.s.id, Value: uint32(len(*bp))}, *bp, &e))
}

// sendErr prefers the stream's own end (the client cancelled, the
// connection closed) to the error an operation saw.
func (ss *serverStream) sendErr(err error) error {
	if err == nil {
		return nil
	}
	ss.s.mu.Lock()
	serr := ss.s.err
	ss.s.mu.Unlock()
	if serr != nil && serr != errCallEnded {
		return serr
	}
	return err
}

func (ss *serverStream) RecvMsg(m any) error {
	msg, err := ss.s.next(ss.ctx)
	if err != nil {
		return err
	}
	if msg.tooBig {
		ss.s.consumed(msg.size)
		return status.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", msg.size, ss.s.maxRecv)
	}
	n := len(msg.data)
	err = decode(ss.codec, msg.data, m)
	msg.release(ss.t)
	ss.s.consumed(n)
	return err
}

// decodeRequest is a unary handler's dec: the one request message.
func (ss *serverStream) decodeRequest(m any) error {
	err := ss.RecvMsg(m)
	if errors.Is(err, io.EOF) {
		return status.Error(codes.Internal, "grpcrdma: the client sent no request message")
	}
	return err
}

// finish ends the call with st (and reply, a unary call's response): one
// frame with the headers if not sent yet, the reply and the status. Only
// the first finish counts; none is sent if the stream ended otherwise
// (the client cancelled, the connection closed).
func (ss *serverStream) finish(st *status.Status, reply any) {
	var e *encoded
	if reply != nil && st.Code() == codes.OK {
		enc, err := encode(ss.codec, reply)
		switch {
		case err != nil:
			st = status.Convert(err)
		case enc.n > ss.t.local.maxSendMsg:
			enc.free()
			st = status.Newf(codes.ResourceExhausted, "grpc: trying to send message larger than max (%d vs. %d)", enc.n, ss.t.local.maxSendMsg)
		default:
			if err := ss.t.acquire(ss.ctx, ss.s, errCallEnded, enc.n); err != nil {
				enc.free()
				st = status.Convert(ss.sendErr(err))
			} else {
				e = &enc
			}
		}
	}
	ss.sendMu.Lock()
	defer ss.sendMu.Unlock()
	ss.mu.Lock()
	if ss.finished {
		ss.mu.Unlock()
		if e != nil {
			e.free()
		}
		return
	}
	ss.finished = true
	flags := frame.FlagStatus
	var h metadata.MD
	if !ss.headerSent {
		ss.headerSent = true
		flags |= frame.FlagHeaders
		h = ss.header
	}
	trailer := ss.trailer
	ss.mu.Unlock()
	endErr := st.Err()
	if endErr == nil {
		endErr = errCallEnded
	}
	if !ss.s.end(endErr) {
		if e != nil {
			e.free()
		}
		return // cancelled by the client or the connection: nobody to tell
	}
	forgotten := ss.t.forget(ss.s)
	bp := getBlock()
	defer putBlock(bp)
	*bp = frame.AppendMD(*bp, frame.KindHeader, h)
	*bp = appendStatus(*bp, st, trailer)
	if len(*bp) > int(ss.t.peer.MaxBlock) {
		// Headers and trailers the client would refuse: it gets the
		// reason instead of them, and no reply.
		st = status.Newf(codes.Internal, "grpcrdma: the response's metadata (%d bytes) is above the %d bytes the client accepts", len(*bp), ss.t.peer.MaxBlock)
		*bp = appendStatus((*bp)[:0], st, nil)
		if e != nil {
			e.free()
			e = nil
		}
	}
	if e != nil {
		flags |= frame.FlagMessage
	}
	ss.t.sendFrame(ss.t.ctx, frame.Header{Type: frame.TypeStream, Flags: flags, Stream: ss.s.id, Value: uint32(len(*bp))}, *bp, e)
	if forgotten {
		ss.t.maybeIdle() // after the STATUS: a draining transport may close now
	}
}

// transportStream is the call as grpc.SetHeader, grpc.SendHeader,
// grpc.SetTrailer and grpc.Method find it in the handler's context.
type transportStream struct{ ss *serverStream }

func (ts transportStream) Method() string                  { return ts.ss.method }
func (ts transportStream) SetHeader(md metadata.MD) error  { return ts.ss.SetHeader(md) }
func (ts transportStream) SendHeader(md metadata.MD) error { return ts.ss.SendHeader(md) }
func (ts transportStream) SetTrailer(md metadata.MD) error {
	ts.ss.mu.Lock()
	defer ts.ss.mu.Unlock()
	if ts.ss.finished {
		return status.Error(codes.Internal, "grpcrdma: SetTrailer after the call ended")
	}
	ts.ss.trailer = metadata.Join(ts.ss.trailer, md)
	return nil
}
