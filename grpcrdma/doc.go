// Package grpcrdma serves and calls gRPC services over RDMA, without HTTP/2:
// the services protoc-gen-go-grpc generates run unchanged over the message
// view of rdma.Conn (Alloc, Send, Recv), each gRPC message one RDMA message
// marshalled straight into registered memory.
//
//	srv := grpcrdma.NewServer()
//	pb.RegisterEchoServer(srv, impl) // any generated RegisterXServer
//	ln, _ := rdma.Listen("rdma", "192.168.1.10:7500")
//	go srv.Serve(ln)
//
//	cc, _ := grpcrdma.Dial(ctx, "192.168.1.10:7500")
//	reply, err := pb.NewEchoClient(cc).Say(ctx, req) // any generated NewXClient
//
// Server is a grpc.ServiceRegistrar and ClientConn a
// grpc.ClientConnInterface. Calls keep gRPC's semantics: unary and the three
// kinds of streaming, metadata both ways (grpc.SetHeader, SendHeader,
// SetTrailer on the server; grpc.Header and grpc.Trailer on the client),
// deadlines (the handler's context has the caller's), cancellation, status
// codes with their details, codes.Unimplemented for an unknown method,
// peer.FromContext and grpc.Method in handlers.
//
// # Connections and calls
//
// A ClientConn holds one rdma.Conn and multiplexes its calls on it; when
// the connection fails, the calls on it fail with codes.Unavailable and the
// next call dials again. A unary call no server saw (its connection was
// going away before the call's first frame left, or the server's GOAWAY
// says it did not serve it) goes again on a new connection, up to twice,
// as grpc-go's transparent retry does; a Server's GracefulStop relies on
// it. A Listener made with rdma.Fallback serves TCP-backed
// connections the same way, through their message view (with a copy each
// way), and a ClientConn dials with a fallback given WithFallback. A
// connection the application set up itself is served with ServeConn, and
// a ClientConn takes its connections from the application's dialer given
// WithDialer.
//
// # Configuration
//
// A ClientConn's connections take their rdma.Config from WithConfig (and
// WithFallback); a Server's are the ones its listener accepts, configured by
// the rdma.ListenConfig that made it. grpcrdma's own limits (stream window,
// concurrent calls, message and header block sizes) are options of
// NewServer and Dial.
//
// # What a peer can make this side hold
//
// Each call has a stream window W (default 1 MiB, StreamWindow and
// WithStreamWindow): its sender may have at most W message bytes unread by
// the receiving application, or, for a message larger than that, one
// message beyond W/2. The connection has a window C over all its calls
// (default 16 MiB, ConnWindow and WithConnWindow) under the same rule. So
// a connection holds at most max(C, C/2 + the largest message accepted) of
// unread messages (16 MiB with every default), besides what the rdma.Conn
// itself bounds. When calls nobody reads hold C, the connection's other
// calls wait for them to be read: keep C well above W/2 + the largest
// message, so that no single such call holds it all. A peer that sends
// beyond a window, or frames that break the protocol, loses the connection
// (an error wrapping rdma.ErrProtocol).
//
// Received messages are decoded from the receive buffer the NIC wrote
// into, released right after: at most two such buffers per connection wait
// for their reader, and past that a message waiting for its reader is
// copied, so a call nobody reads never holds back the others.
//
// # Interceptors and call options
//
// Server interceptors are grpc's types, chained as grpc-go chains them.
// Client interceptors are grpc's types too, but grpcrdma has no
// *grpc.ClientConn: their cc argument is nil. The call options honoured,
// refused and ignored are listed at callInfo in callopts.go: grpc.Header,
// grpc.Trailer, grpc.Peer, grpc.MaxCallRecvMsgSize, grpc.MaxCallSendMsgSize,
// grpc.ForceCodec, grpc.ForceCodecV2, grpc.CallContentSubtype and
// grpc.OnFinish are honoured; grpc.PerRPCCredentials and compression are
// refused with codes.Unimplemented; the rest are ignored.
//
// The wire format is docs/grpcrdma-protocol.md.
package grpcrdma
