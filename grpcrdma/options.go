package grpcrdma

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"

	"github.com/verbline/rdma"
)

// Defaults of the limits both sides announce and enforce.
const (
	// DefaultStreamWindow is the message bytes a side accepts unread per
	// stream before the sender waits (the stream window, W): several
	// messages of up to 256 KiB in flight on a stream; a window of about
	// one message makes the sender wait for each WINDOW frame.
	DefaultStreamWindow = 1 << 20
	// DefaultConnWindow is the message bytes a side accepts unread over
	// all the streams of one connection before every sender on it waits
	// (the connection window, C): the rdma.Config.MaxUnreadBytes default.
	DefaultConnWindow = 16 << 20
	// DefaultMaxConcurrentStreams is how many calls a server runs at once on
	// one connection; a client opening more waits for one to end.
	DefaultMaxConcurrentStreams = 100
	// DefaultMaxRecvMsgSize is the largest message a side accepts, as
	// grpc-go's default (4 MiB).
	DefaultMaxRecvMsgSize = 4 << 20
	// DefaultMaxHeaderBlock is the largest header block (metadata, status)
	// a side accepts in one frame.
	DefaultMaxHeaderBlock = 64 << 10

	defaultHandshakeTimeout = 10 * time.Second
	maxWindow               = 1 << 30
)

// limits are what one side accepts, announced in its SETTINGS.
type limits struct {
	streamWindow int
	connWindow   int
	maxStreams   int
	maxRecvMsg   int
	maxSendMsg   int
	maxBlock     int
}

// sane replaces values too small to make progress with the defaults.
func (l limits) sane() limits {
	d := defaultLimits()
	if l.streamWindow < 1024 {
		l.streamWindow = d.streamWindow
	}
	if l.connWindow < 1024 {
		l.connWindow = d.connWindow
	}
	// Windows travel as 32-bit counts; a gibibyte is more than any
	// connection should hold unread.
	l.streamWindow = min(l.streamWindow, maxWindow)
	l.connWindow = min(l.connWindow, maxWindow)
	if l.maxStreams < 1 {
		l.maxStreams = d.maxStreams
	}
	if l.maxRecvMsg < 0 {
		l.maxRecvMsg = d.maxRecvMsg
	}
	if l.maxSendMsg < 0 {
		l.maxSendMsg = d.maxSendMsg
	}
	if l.maxBlock < 1024 {
		l.maxBlock = d.maxBlock
	}
	return l
}

func defaultLimits() limits {
	return limits{
		streamWindow: DefaultStreamWindow,
		connWindow:   DefaultConnWindow,
		maxStreams:   DefaultMaxConcurrentStreams,
		maxRecvMsg:   DefaultMaxRecvMsgSize,
		maxSendMsg:   1<<31 - 1,
		maxBlock:     DefaultMaxHeaderBlock,
	}
}

// unreadBound is what a peer can make this side hold unread on one
// connection: per stream max(W, W/2 + largest message), times the streams,
// and at most max(C, C/2 + largest message) in all.
func (l limits) unreadBound() int64 {
	window := func(w int) int64 { return max(int64(w), int64(w/2)+int64(l.maxRecvMsg)) }
	return min(window(l.streamWindow)*int64(l.maxStreams), window(l.connWindow))
}

type serverOptions struct {
	limits
	unaryInts        []grpc.UnaryServerInterceptor
	streamInts       []grpc.StreamServerInterceptor
	codec            encoding.CodecV2 // nil: by the call's content-subtype
	handshakeTimeout time.Duration
}

// A ServerOption configures a Server.
type ServerOption func(*serverOptions)

// UnaryInterceptor adds unary server interceptors, run in the order given
// (the first is the outermost), after those added before, as
// grpc.ChainUnaryInterceptor chains them.
func UnaryInterceptor(i ...grpc.UnaryServerInterceptor) ServerOption {
	return func(o *serverOptions) { o.unaryInts = append(o.unaryInts, i...) }
}

// StreamInterceptor adds stream server interceptors, chained as
// UnaryInterceptor's.
func StreamInterceptor(i ...grpc.StreamServerInterceptor) ServerOption {
	return func(o *serverOptions) { o.streamInts = append(o.streamInts, i...) }
}

// MaxRecvMsgSize sets the largest request message the server accepts
// (default 4 MiB); a larger one ends its call with ResourceExhausted.
// Whatever this says, a message never exceeds the connection's
// rdma.Conn.MaxMessageSize (less a frame header).
func MaxRecvMsgSize(n int) ServerOption {
	return func(o *serverOptions) { o.maxRecvMsg = n }
}

// MaxSendMsgSize sets the largest response message the server sends
// (default: no limit beyond the connection's); a larger one ends its call
// with ResourceExhausted.
func MaxSendMsgSize(n int) ServerOption {
	return func(o *serverOptions) { o.maxSendMsg = n }
}

// MaxConcurrentStreams sets how many calls one connection runs at once
// (default 100). Clients wait for a free slot.
func MaxConcurrentStreams(n uint32) ServerOption {
	return func(o *serverOptions) { o.maxStreams = int(n) }
}

// StreamWindow sets the request bytes the server holds unread per call
// before the client waits (default 1 MiB; at least 1 KiB).
func StreamWindow(n int) ServerOption {
	return func(o *serverOptions) { o.streamWindow = n }
}

// ConnWindow sets the request bytes the server holds unread over all the
// calls of one connection before its clients wait (default 16 MiB; at
// least 1 KiB). Keep it above max(StreamWindow, StreamWindow/2 +
// MaxRecvMsgSize), so that one call nobody reads cannot hold it all.
func ConnWindow(n int) ServerOption {
	return func(o *serverOptions) { o.connWindow = n }
}

// ForceServerCodec makes the server use codec for every call, whatever
// content-subtype the client announces, as grpc.ForceServerCodecV2 does.
// Without it the codec is the one grpc's encoding registry has for the
// call's content-subtype ("proto" when absent).
func ForceServerCodec(codec encoding.CodecV2) ServerOption {
	return func(o *serverOptions) { o.codec = codec }
}

// MaxHeaderBlock sets the largest header block (a frame's metadata, path
// and status) the server accepts (default 64 KiB, at least 1 KiB), as
// grpc.MaxHeaderListSize does; a client sending more fails its call with
// ResourceExhausted before sending it.
func MaxHeaderBlock(n int) ServerOption {
	return func(o *serverOptions) { o.maxBlock = n }
}

// HandshakeTimeout bounds how long an accepted connection may take to send
// its SETTINGS frame (default 10 s).
func HandshakeTimeout(d time.Duration) ServerOption {
	return func(o *serverOptions) { o.handshakeTimeout = d }
}

type dialOptions struct {
	limits
	config     rdma.Config
	fallback   *rdma.Fallback
	dialer     func(ctx context.Context, address string) (*rdma.Conn, error)
	unaryInts  []grpc.UnaryClientInterceptor
	streamInts []grpc.StreamClientInterceptor
	codec      encoding.CodecV2
	callOpts   []grpc.CallOption
}

// A DialOption configures a ClientConn.
type DialOption func(*dialOptions)

// WithConfig sets the rdma.Config of the ClientConn's connections.
func WithConfig(c rdma.Config) DialOption {
	return func(o *dialOptions) { o.config = c }
}

// WithDialer makes the ClientConn get its connections from dial instead of
// dialling them itself (WithConfig and WithFallback then do nothing): for a
// connection set up by the application, or a dialer of its own. dial gets
// Dial's context and address; a ClientConn that loses its connection calls
// it again for the next call.
func WithDialer(dial func(ctx context.Context, address string) (*rdma.Conn, error)) DialOption {
	return func(o *dialOptions) { o.dialer = dial }
}

// WithFallback lets the ClientConn's dials fall back to TCP
// (rdma.Dialer.Fallback); the message view, and so grpcrdma, works over it.
func WithFallback(f rdma.Fallback) DialOption {
	return func(o *dialOptions) { o.fallback = &f }
}

// WithUnaryInterceptor adds unary client interceptors, chained as grpc-go
// chains them (the first is the outermost). grpcrdma has no
// *grpc.ClientConn to give them: their cc argument is nil, and an
// interceptor that uses it cannot be used here. The invoker they get calls
// through this ClientConn.
func WithUnaryInterceptor(i ...grpc.UnaryClientInterceptor) DialOption {
	return func(o *dialOptions) { o.unaryInts = append(o.unaryInts, i...) }
}

// WithStreamInterceptor adds stream client interceptors, chained as
// WithUnaryInterceptor's, with a nil cc too.
func WithStreamInterceptor(i ...grpc.StreamClientInterceptor) DialOption {
	return func(o *dialOptions) { o.streamInts = append(o.streamInts, i...) }
}

// WithMaxRecvMsgSize sets the largest response message the client accepts
// (default 4 MiB); grpc.MaxCallRecvMsgSize overrides it per call.
func WithMaxRecvMsgSize(n int) DialOption {
	return func(o *dialOptions) { o.maxRecvMsg = n }
}

// WithMaxSendMsgSize sets the largest request message the client sends
// (default: the connection's limit); grpc.MaxCallSendMsgSize overrides it
// per call.
func WithMaxSendMsgSize(n int) DialOption {
	return func(o *dialOptions) { o.maxSendMsg = n }
}

// WithStreamWindow sets the response bytes the client holds unread per call
// before the server waits (default 1 MiB; at least 1 KiB).
func WithStreamWindow(n int) DialOption {
	return func(o *dialOptions) { o.streamWindow = n }
}

// WithConnWindow sets the response bytes the client holds unread over all
// the calls of its connection before the server waits (default 16 MiB; at
// least 1 KiB), as ConnWindow does for a server.
func WithConnWindow(n int) DialOption {
	return func(o *dialOptions) { o.connWindow = n }
}

// WithMaxHeaderBlock sets the largest header block (a response's headers,
// or its status and trailers) the client accepts (default 64 KiB, at least
// 1 KiB); a server with more to send fails the call with Internal instead.
func WithMaxHeaderBlock(n int) DialOption {
	return func(o *dialOptions) { o.maxBlock = n }
}

// WithCodec sets the codec of every call (as grpc.ForceCodecV2 per call);
// its Name is sent as the content-subtype, so the server must know it.
func WithCodec(c encoding.CodecV2) DialOption {
	return func(o *dialOptions) { o.codec = c }
}

// WithDefaultCallOptions sets call options applied before each call's own.
func WithDefaultCallOptions(opts ...grpc.CallOption) DialOption {
	return func(o *dialOptions) { o.callOpts = append(o.callOpts, opts...) }
}
