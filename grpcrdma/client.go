package grpcrdma

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/verbline/rdma"
)

// ClientConn calls gRPC services over one rdma.Conn at a time: it is a
// grpc.ClientConnInterface, so generated NewXClient functions take it. Calls
// are multiplexed on the connection; when it fails, its calls fail with
// codes.Unavailable and the next call dials a new one.
type ClientConn struct {
	target    string
	opts      dialOptions
	unaryInt  grpc.UnaryClientInterceptor
	streamInt grpc.StreamClientInterceptor

	mu      sync.Mutex // guards the fields below
	t       *transport
	old     map[*transport]bool // replaced while draining: closed by Close if still open
	dialing chan struct{}       // closed when the dial in progress ends
	dialErr error
	closed  bool
}

var _ grpc.ClientConnInterface = (*ClientConn)(nil)

var errConnClosing = status.Error(codes.Canceled, "grpc: the client connection is closing")

// Dial connects to a grpcrdma Server at address ("host:port", as
// rdma.Dial takes it) within ctx, and returns a ClientConn for calls to it.
func Dial(ctx context.Context, address string, opts ...DialOption) (*ClientConn, error) {
	o := dialOptions{limits: defaultLimits()}
	for _, f := range opts {
		f(&o)
	}
	o.limits = o.limits.sane()
	cc := &ClientConn{target: address, opts: o, unaryInt: chainUnaryClient(o.unaryInts), streamInt: chainStreamClient(o.streamInts)}
	if _, err := cc.transport(ctx); err != nil {
		return nil, err
	}
	return cc, nil
}

// Target returns the address given to Dial.
func (cc *ClientConn) Target() string { return cc.target }

// Close closes the connection; calls in flight fail with codes.Canceled
// or codes.Unavailable, later ones with codes.Canceled.
func (cc *ClientConn) Close() error {
	cc.mu.Lock()
	if cc.closed {
		cc.mu.Unlock()
		return nil
	}
	cc.closed = true
	t := cc.t
	cc.t = nil
	dialing := cc.dialing
	old := cc.old
	cc.old = nil
	cc.mu.Unlock()
	for o := range old {
		o.close(errors.New("grpcrdma: ClientConn closed"))
		<-o.readerDone
	}
	if dialing != nil {
		<-dialing
		cc.mu.Lock()
		t2 := cc.t
		cc.t = nil
		cc.mu.Unlock()
		if t2 != nil {
			t2.close(errors.New("grpcrdma: ClientConn closed"))
		}
	}
	if t != nil {
		t.close(errors.New("grpcrdma: ClientConn closed"))
		<-t.readerDone
	}
	return nil
}

// transport returns a usable transport, dialling one if there is none.
// Concurrent callers share one dial.
func (cc *ClientConn) transport(ctx context.Context) (*transport, error) {
	for {
		cc.mu.Lock()
		if cc.closed {
			cc.mu.Unlock()
			return nil, errConnClosing
		}
		if cc.t != nil && cc.t.usable() {
			t := cc.t
			cc.mu.Unlock()
			return t, nil
		}
		if ch := cc.dialing; ch != nil {
			cc.mu.Unlock()
			select {
			case <-ch:
				cc.mu.Lock()
				err := cc.dialErr
				cc.mu.Unlock()
				if err != nil {
					return nil, err
				}
				continue
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
		ch := make(chan struct{})
		cc.dialing = ch
		cc.mu.Unlock()
		t, err := cc.dial(ctx)
		cc.mu.Lock()
		cc.dialing = nil
		cc.dialErr = err
		if err == nil {
			if cc.closed {
				cc.mu.Unlock()
				close(ch)
				t.close(errors.New("grpcrdma: ClientConn closed"))
				return nil, errConnClosing
			}
			if cc.t != nil {
				// A draining or failed transport: Close ends it if its
				// last calls have not by then.
				if cc.old == nil {
					cc.old = map[*transport]bool{}
				}
				for o := range cc.old {
					select {
					case <-o.done:
						delete(cc.old, o)
					default:
					}
				}
				cc.old[cc.t] = true
			}
			cc.t = t
		}
		cc.mu.Unlock()
		close(ch)
		if err != nil {
			return nil, err
		}
		return t, nil
	}
}

func (cc *ClientConn) dial(ctx context.Context) (*transport, error) {
	dial := cc.opts.dialer
	if dial == nil {
		dial = func(ctx context.Context, addr string) (*rdma.Conn, error) {
			d := rdma.Dialer{Config: cc.opts.config, Fallback: cc.opts.fallback}
			nc, err := d.DialContext(ctx, "rdma", addr)
			if err != nil {
				return nil, err
			}
			return nc.(*rdma.Conn), nil
		}
	}
	c, err := dial(ctx, cc.target)
	if err == nil && c == nil {
		err = errors.New("the dialer returned no connection")
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, status.Errorf(codes.Unavailable, "grpcrdma: dial %s: %v", cc.target, err)
	}
	ps, err := handshake(ctx, c, cc.opts.limits, false)
	if err != nil {
		c.Close()
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, status.Errorf(codes.Unavailable, "grpcrdma: %s: %v", cc.target, err)
	}
	t := newTransport(c, cc.opts.limits, ps, false)
	t.start()
	return t, nil
}

// Invoke performs a unary call: one frame carries the request's headers,
// message and end, one the response's headers, message and status.
func (cc *ClientConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if cc.unaryInt != nil {
		return cc.unaryInt(ctx, method, args, reply, nil, cc.invoke, opts...)
	}
	return cc.invoke(ctx, method, args, reply, nil, opts...)
}

func (cc *ClientConn) invoke(ctx context.Context, method string, args, reply any, _ *grpc.ClientConn, opts ...grpc.CallOption) error {
	ci, err := cc.newCallInfo(opts)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		cs, err := cc.newClientStream(ctx, unaryDesc, method, ci, false)
		if err != nil {
			ci.finish(nil, nil, nil, err)
			return err
		}
		// A call no server saw (its connection was going away before its
		// first frame left, or the server's GOAWAY said it was not served)
		// goes again on a new connection, as grpc-go's transparent retry.
		cs.retryable = attempt < 2
		err = cs.invoke(args, reply)
		if cs.retryable && isUnserved(err) && ctx.Err() == nil {
			continue
		}
		return err
	}
}

func (cs *clientStream) invoke(args, reply any) error {
	if err := cs.sendMsg(args, true); err != nil {
		if err == errStreamEnded {
			err = cs.RecvMsg(reply) // the server's status says why
			if err == nil {
				err = status.Error(codes.Internal, "grpcrdma: the server answered before the request was sent")
			}
			return err
		}
		cs.abort(err)
		return err
	}
	return cs.RecvMsg(reply)
}

var unaryDesc = &grpc.StreamDesc{}

// NewStream starts a streaming call.
func (cc *ClientConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if cc.streamInt != nil {
		return cc.streamInt(ctx, desc, nil, method, cc.newStream, opts...)
	}
	return cc.newStream(ctx, desc, nil, method, opts...)
}

func (cc *ClientConn) newStream(ctx context.Context, desc *grpc.StreamDesc, _ *grpc.ClientConn, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	ci, err := cc.newCallInfo(opts)
	if err != nil {
		return nil, err
	}
	cs, err := cc.newClientStream(ctx, desc, method, ci, true)
	if err != nil {
		ci.finish(nil, nil, nil, err)
		return nil, err
	}
	return cs, nil
}

func chainUnaryClient(ints []grpc.UnaryClientInterceptor) grpc.UnaryClientInterceptor {
	switch len(ints) {
	case 0:
		return nil
	case 1:
		return ints[0]
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return ints[0](ctx, method, req, reply, cc, unaryInvoker(ints, 0, inv), opts...)
	}
}

func unaryInvoker(ints []grpc.UnaryClientInterceptor, i int, final grpc.UnaryInvoker) grpc.UnaryInvoker {
	if i == len(ints)-1 {
		return final
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		return ints[i+1](ctx, method, req, reply, cc, unaryInvoker(ints, i+1, final), opts...)
	}
}

func chainStreamClient(ints []grpc.StreamClientInterceptor) grpc.StreamClientInterceptor {
	switch len(ints) {
	case 0:
		return nil
	case 1:
		return ints[0]
	}
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, s grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return ints[0](ctx, desc, cc, method, streamer(ints, 0, s), opts...)
	}
}

func streamer(ints []grpc.StreamClientInterceptor, i int, final grpc.Streamer) grpc.Streamer {
	if i == len(ints)-1 {
		return final
	}
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return ints[i+1](ctx, desc, cc, method, streamer(ints, i+1, final), opts...)
	}
}
