package grpcrdma

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/grpcrdma/internal/frame"
)

// ErrServerStopped is returned by Serve after Stop or GracefulStop.
var ErrServerStopped = errors.New("grpcrdma: the server has been stopped")

// Server serves gRPC services over rdma.Conns' message view. It is a
// grpc.ServiceRegistrar: generated RegisterXServer functions take it.
type Server struct {
	opts      serverOptions
	unaryInt  grpc.UnaryServerInterceptor
	streamInt grpc.StreamServerInterceptor

	mu        sync.Mutex // guards the fields below
	services  map[string]*serviceInfo
	listeners map[*rdma.Listener]bool
	raw       map[*rdma.Conn]bool // accepted, not yet a transport
	conns     map[*transport]bool // serving
	draining  bool                // GracefulStop called
	stopped   bool                // Stop called
	serveWG   sync.WaitGroup      // Serve's connection goroutines
	handlers  sync.WaitGroup      // running handlers
	started   bool                // Serve was called: services are fixed

	work     chan func()   // a call for an idle worker (runHandler)
	quit     chan struct{} // closed by Stop and GracefulStop: idle workers end
	quitOnce sync.Once
}

type serviceInfo struct {
	impl    any
	methods map[string]*grpc.MethodDesc
	streams map[string]*grpc.StreamDesc
}

// NewServer returns a Server with no service registered.
func NewServer(opts ...ServerOption) *Server {
	o := serverOptions{limits: defaultLimits(), handshakeTimeout: defaultHandshakeTimeout}
	for _, f := range opts {
		f(&o)
	}
	o.limits = o.limits.sane()
	s := &Server{
		opts:      o,
		services:  map[string]*serviceInfo{},
		listeners: map[*rdma.Listener]bool{},
		raw:       map[*rdma.Conn]bool{},
		conns:     map[*transport]bool{},
		work:      make(chan func()),
		quit:      make(chan struct{}),
	}
	s.unaryInt = chainUnary(o.unaryInts)
	s.streamInt = chainStream(o.streamInts)
	return s
}

// RegisterService registers a service and its implementation, as
// grpc.Server's does. It panics if impl does not implement
// desc.HandlerType or the service is already registered, and must be
// called before Serve.
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	if impl != nil && desc.HandlerType != nil {
		ht := reflect.TypeOf(desc.HandlerType).Elem()
		if !reflect.TypeOf(impl).Implements(ht) {
			panic(fmt.Sprintf("grpcrdma: RegisterService: handler of type %v does not satisfy %v", reflect.TypeOf(impl), ht))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		panic("grpcrdma: RegisterService after Serve")
	}
	if _, ok := s.services[desc.ServiceName]; ok {
		panic(fmt.Sprintf("grpcrdma: RegisterService: service %s registered twice", desc.ServiceName))
	}
	si := &serviceInfo{impl: impl, methods: map[string]*grpc.MethodDesc{}, streams: map[string]*grpc.StreamDesc{}}
	for i := range desc.Methods {
		si.methods[desc.Methods[i].MethodName] = &desc.Methods[i]
	}
	for i := range desc.Streams {
		si.streams[desc.Streams[i].StreamName] = &desc.Streams[i]
	}
	s.services[desc.ServiceName] = si
}

// GetServiceInfo returns the registered services' method names, as
// grpc.Server's does.
func (s *Server) GetServiceInfo() map[string]grpc.ServiceInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]grpc.ServiceInfo{}
	for name, si := range s.services {
		var ms []grpc.MethodInfo
		for m := range si.methods {
			ms = append(ms, grpc.MethodInfo{Name: m})
		}
		for m, sd := range si.streams {
			ms = append(ms, grpc.MethodInfo{Name: m, IsClientStream: sd.ClientStreams, IsServerStream: sd.ServerStreams})
		}
		out[name] = grpc.ServiceInfo{Methods: ms}
	}
	return out
}

// Serve accepts connections on l and serves calls on each until Stop or
// GracefulStop, after which it returns nil (ErrServerStopped if called
// after them); any other Accept error ends it with that error. A listener
// with rdma.Fallback serves its TCP-backed connections the same way, over
// their message view. Serve closes l when it returns.
func (s *Server) Serve(l *rdma.Listener) error {
	s.mu.Lock()
	s.started = true
	if s.draining || s.stopped {
		s.mu.Unlock()
		l.Close()
		return ErrServerStopped
	}
	s.listeners[l] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
		l.Close()
	}()
	for {
		c, err := l.AcceptRDMA()
		if err != nil {
			s.mu.Lock()
			quit := s.draining || s.stopped
			s.mu.Unlock()
			if quit {
				return nil
			}
			return err
		}
		s.mu.Lock()
		if s.draining || s.stopped {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		s.raw[c] = true
		s.serveWG.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

// ServeConn serves calls on one connection the application accepted
// itself (from a listener it owns, or after a protocol of its own), as
// Serve does on each connection it accepts, and returns when the
// connection ends: nil, or why the grpcrdma handshake failed. ServeConn
// closes c. Stop and GracefulStop end it as they end Serve's connections.
func (s *Server) ServeConn(c *rdma.Conn) error {
	s.mu.Lock()
	s.started = true
	if s.draining || s.stopped {
		s.mu.Unlock()
		c.Close()
		return ErrServerStopped
	}
	s.raw[c] = true
	s.serveWG.Add(1)
	s.mu.Unlock()
	return s.serveConn(c)
}

func (s *Server) serveConn(c *rdma.Conn) error {
	defer s.serveWG.Done()
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.handshakeTimeout)
	ps, err := handshake(ctx, c, s.opts.limits, true)
	cancel()
	s.mu.Lock()
	delete(s.raw, c)
	if err != nil || s.stopped {
		s.mu.Unlock()
		c.Close()
		if err == nil {
			err = ErrServerStopped
		}
		return err
	}
	t := newTransport(c, s.opts.limits, ps, true)
	t.onStream = func(st *stream, blk frame.Block) { s.startStream(t, st, blk) }
	s.conns[t] = true
	drain := s.draining
	s.mu.Unlock()
	if drain {
		go t.drain()
	}
	t.readLoop()
	s.mu.Lock()
	delete(s.conns, t)
	s.mu.Unlock()
	return nil
}

// drain sends GOAWAY: the streams opened so far run to their end, later
// ones are refused; the transport closes when the last one ends.
func (t *transport) drain() {
	t.mu.Lock()
	if t.draining || t.err != nil {
		t.mu.Unlock()
		return
	}
	t.draining = true
	last := t.lastID
	t.mu.Unlock()
	t.sendControl(frame.Header{Type: frame.TypeGoAway, Value: last}, []byte("server shutting down"))
	t.maybeIdle()
}

// GracefulStop stops accepting connections and calls: calls in flight run
// to their end, new ones are refused with codes.Unavailable (a client
// retries them on a new connection); it returns when every call has ended
// and every connection is closed.
func (s *Server) GracefulStop() {
	for _, t := range s.stopAccepting(&s.draining) {
		t.drain()
	}
	s.serveWG.Wait()
	s.handlers.Wait()
	s.endWorkers()
}

// Stop closes the listeners and every connection at once: calls in flight
// fail on the client with codes.Unavailable and their handlers' contexts are
// cancelled. It does not wait for handlers to return.
func (s *Server) Stop() {
	for _, t := range s.stopAccepting(&s.stopped) {
		t.close(errors.New("grpcrdma: server stopped"))
	}
	s.serveWG.Wait()
	s.endWorkers()
}

// startStream sets up a new call; it runs on the transport's reader, so it
// starts the handler's goroutine and returns.
func (s *Server) startStream(t *transport, st *stream, blk frame.Block) {
	var ctx context.Context
	var cancel context.CancelFunc
	if blk.Timeout > 0 {
		ctx, cancel = context.WithTimeout(t.ctx, blk.Timeout)
	} else {
		ctx, cancel = context.WithCancel(t.ctx)
	}
	ss := &serverStream{srv: s, t: t, s: st, cancel: cancel, method: blk.Path}
	st.mu.Lock()
	st.onCancel = func(c codes.Code) {
		// A caller whose deadline passed cancels with DeadlineExceeded:
		// the handler's own deadline, no earlier than the caller's, ends
		// its context with the same error.
		if c != codes.DeadlineExceeded || blk.Timeout <= 0 {
			cancel()
		}
	}
	st.mu.Unlock()
	if blk.Timeout > 0 {
		// An expired deadline ends the call here and tells the client,
		// whatever the handler does next.
		dctx := ctx
		context.AfterFunc(dctx, func() {
			if dctx.Err() == context.DeadlineExceeded {
				ss.finish(status.New(codes.DeadlineExceeded, context.DeadlineExceeded.Error()), nil)
			}
		})
	}
	// A call without metadata carries a nil MD: metadata.FromIncomingContext
	// and ValueFromIncomingContext read it as empty (the former returns
	// its own copy), and it costs no map per call.
	ctx = metadata.NewIncomingContext(ctx, blk.Header)
	ctx = peer.NewContext(ctx, t.peerInfo)
	ctx = grpc.NewContextWithServerTransportStream(ctx, transportStream{ss})
	ss.ctx = ctx
	s.handlers.Add(1)
	s.runHandler(func() { s.runStream(ss, blk.ContentSubtype) })
}

// workerIdle is how long a handler worker waits for its next call.
const workerIdle = 2 * time.Second

// runHandler runs f (a call's handler) on an idle worker, or on a new one.
// A worker keeps the stack its calls grew for the next (a new goroutine's
// starts at 2 KiB and is copied each time it doubles: about a tenth of
// a small call's CPU on the server), as grpc-go's stream workers do; one
// idle for workerIdle ends, and Stop and GracefulStop end the idle ones.
func (s *Server) runHandler(f func()) {
	select {
	case s.work <- f:
	default:
		go s.worker(f)
	}
}

func (s *Server) worker(f func()) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		f()
		idle.Reset(workerIdle)
		select {
		case f = <-s.work:
		case <-idle.C:
			return
		case <-s.quit:
			return
		}
	}
}

// stopAccepting sets flag (draining or stopped), closes the listeners and
// the connections still in their handshake, and returns the transports
// serving, for Stop and GracefulStop to end their way.
func (s *Server) stopAccepting(flag *bool) []*transport {
	s.mu.Lock()
	defer s.mu.Unlock()
	*flag = true
	for l := range s.listeners {
		l.Close()
	}
	for c := range s.raw {
		c.Close()
	}
	ts := make([]*transport, 0, len(s.conns))
	for t := range s.conns {
		ts = append(ts, t)
	}
	return ts
}

func (s *Server) endWorkers() { s.quitOnce.Do(func() { close(s.quit) }) }

func (s *Server) runStream(ss *serverStream, subtype string) {
	defer s.handlers.Done()
	defer ss.cancel()
	svc, method, ok := splitMethod(ss.method)
	s.mu.Lock()
	si := s.services[svc]
	s.mu.Unlock()
	if !ok || si == nil {
		ss.finish(status.Newf(codes.Unimplemented, "unknown service %v", svc), nil)
		return
	}
	ss.codec = s.opts.codec
	if ss.codec == nil {
		if ss.codec = codecFor(subtype); ss.codec == nil {
			ss.finish(status.Newf(codes.Internal, "grpc: no codec registered for content-subtype %s", subtype), nil)
			return
		}
	}
	if md := si.methods[method]; md != nil {
		reply, err := md.Handler(si.impl, ss.ctx, ss.decodeRequest, s.unaryInt)
		if err != nil {
			ss.finish(statusOf(err), nil)
			return
		}
		ss.finish(okStatus, reply)
		return
	}
	if sd := si.streams[method]; sd != nil {
		var err error
		if s.streamInt != nil {
			info := &grpc.StreamServerInfo{FullMethod: ss.method, IsClientStream: sd.ClientStreams, IsServerStream: sd.ServerStreams}
			err = s.streamInt(si.impl, ss, info, sd.Handler)
		} else {
			err = sd.Handler(si.impl, ss)
		}
		ss.finish(statusOf(err), nil)
		return
	}
	ss.finish(status.Newf(codes.Unimplemented, "unknown method %v for service %v", method, svc), nil)
}

// splitMethod splits "/service/method".
func splitMethod(path string) (svc, method string, ok bool) {
	if !strings.HasPrefix(path, "/") {
		return path, "", false
	}
	path = path[1:]
	i := strings.LastIndex(path, "/")
	if i < 0 {
		return path, "", false
	}
	return path[:i], path[i+1:], true
}

// statusOf converts a handler's error as grpc-go does: a status error
// keeps its status, a context error becomes Canceled or DeadlineExceeded,
// anything else Unknown.
func statusOf(err error) *status.Status {
	if err == nil {
		return okStatus
	}
	if st, ok := status.FromError(err); ok {
		return st
	}
	return status.FromContextError(err)
}

func chainUnary(ints []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	switch len(ints) {
	case 0:
		return nil
	case 1:
		return ints[0]
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return ints[0](ctx, req, info, unaryNext(ints, 0, info, h))
	}
}

func unaryNext(ints []grpc.UnaryServerInterceptor, i int, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) grpc.UnaryHandler {
	if i == len(ints)-1 {
		return h
	}
	return func(ctx context.Context, req any) (any, error) {
		return ints[i+1](ctx, req, info, unaryNext(ints, i+1, info, h))
	}
}

func chainStream(ints []grpc.StreamServerInterceptor) grpc.StreamServerInterceptor {
	switch len(ints) {
	case 0:
		return nil
	case 1:
		return ints[0]
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return ints[0](srv, ss, info, streamNext(ints, 0, info, h))
	}
}

func streamNext(ints []grpc.StreamServerInterceptor, i int, info *grpc.StreamServerInfo, h grpc.StreamHandler) grpc.StreamHandler {
	if i == len(ints)-1 {
		return h
	}
	return func(srv any, ss grpc.ServerStream) error {
		return ints[i+1](srv, ss, info, streamNext(ints, i+1, info, h))
	}
}
