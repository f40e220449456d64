package main

// The service, written by hand so that neither protoc nor generated code is
// needed: a codec that carries raw bytes, and the grpc.ServiceDesc that
// protoc-gen-go-grpc would otherwise generate.
//
//	service Blob {
//	  rpc Echo(bytes) returns (bytes);                    // unary: the request back
//	  rpc Exchange(stream bytes) returns (stream bytes);  // bidi: each message back; trailer: digest
//	}

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"

	"github.com/verbline/rdma"
)

// rawCodec passes []byte messages through unchanged. It is registered under
// the content-subtype "raw" (content-type application/grpc+raw); the server
// picks it by that name, and clients ask for it with
// grpc.CallContentSubtype(codecName).
type rawCodec struct{}

const codecName = "raw"

func init() { encoding.RegisterCodec(rawCodec{}) }

func (rawCodec) Name() string { return codecName }

func (rawCodec) Marshal(v any) ([]byte, error) {
	switch m := v.(type) {
	case *[]byte:
		return *m, nil
	case []byte:
		return m, nil
	}
	return nil, fmt.Errorf("raw codec: cannot marshal %T: messages are []byte or *[]byte", v)
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("raw codec: cannot unmarshal into %T: want *[]byte", v)
	}
	// grpc reuses data's buffer once Unmarshal returns: keep a copy.
	*m = append((*m)[:0], data...)
	return nil
}

const (
	serviceName    = "verbline.example.Blob"
	echoMethod     = "/" + serviceName + "/Echo"
	exchangeMethod = "/" + serviceName + "/Exchange"
	// digestTrailer carries the hex SHA-256 of every byte Exchange received.
	digestTrailer = "x-sha256"
)

// blobService is what a server registers; serviceDesc checks it is implemented.
type blobService interface {
	Echo(ctx context.Context, req []byte) ([]byte, error)
	Exchange(stream grpc.ServerStream) error
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*blobService)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Echo",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			var req []byte
			if err := dec(&req); err != nil {
				return nil, err
			}
			if icpt == nil {
				return srv.(blobService).Echo(ctx, req)
			}
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: echoMethod}
			return icpt(ctx, req, info, func(ctx context.Context, req any) (any, error) {
				return srv.(blobService).Echo(ctx, req.([]byte))
			})
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Exchange",
		Handler:       func(srv any, s grpc.ServerStream) error { return srv.(blobService).Exchange(s) },
		ServerStreams: true,
		ClientStreams: true,
	}},
}

// exchangeDesc is what a client passes to NewStream for Exchange.
var exchangeDesc = &serviceDesc.Streams[0]

// blobServer implements blobService.
type blobServer struct{}

func (blobServer) Echo(_ context.Context, req []byte) ([]byte, error) { return req, nil }

// Exchange sends every message back as it arrives; when the client closes
// its side, the trailer carries the SHA-256 of everything received, so the
// client checks the bytes that reached the server, not only the echo.
func (blobServer) Exchange(s grpc.ServerStream) error {
	h := sha256.New()
	for {
		var m []byte
		if err := s.RecvMsg(&m); err == io.EOF {
			s.SetTrailer(metadata.Pairs(digestTrailer, hex.EncodeToString(h.Sum(nil))))
			return nil
		} else if err != nil {
			return err
		}
		h.Write(m)
		if err := s.SendMsg(&m); err != nil {
			return err
		}
	}
}

// newServer returns a grpc.Server with the Blob service registered; serve it
// with srv.Serve(ln) on an *rdma.Listener.
func newServer(opts ...grpc.ServerOption) *grpc.Server {
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&serviceDesc, blobServer{})
	return srv
}

// newClient returns a ClientConn to addr ("host:port") whose connections are
// RDMA connections made by d. The passthrough resolver hands addr to the
// dialer as it is; grpc's default (dns) would resolve it first.
func newClient(addr string, d *rdma.Dialer, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts = append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			return d.DialContext(ctx, "rdma", a)
		}),
		// RDMA is not encrypted; use TLS credentials here for a link that needs it.
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.CallContentSubtype(codecName)),
	}, opts...)
	return grpc.NewClient("passthrough:///"+addr, opts...)
}

// echo calls Blob.Echo.
func echo(ctx context.Context, cc *grpc.ClientConn, req []byte) ([]byte, error) {
	var resp []byte
	err := cc.Invoke(ctx, echoMethod, &req, &resp)
	return resp, err
}

// exchange sends msgs on one Blob.Exchange stream while it receives their
// echoes, and checks byte for byte that each came back, and that the
// server's digest of what it received matches what was sent.
func exchange(ctx context.Context, cc *grpc.ClientConn, msgs [][]byte) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // on an early return, ends the stream and the sender
	s, err := cc.NewStream(ctx, exchangeDesc, exchangeMethod)
	if err != nil {
		return fmt.Errorf("open Exchange stream: %w", err)
	}
	sent := make(chan error, 1)
	go func() {
		for i := range msgs {
			if err := s.SendMsg(&msgs[i]); err != nil {
				// The stream failed: RecvMsg reports why.
				sent <- fmt.Errorf("send message %d: %w", i, err)
				return
			}
		}
		sent <- s.CloseSend()
	}()
	h := sha256.New()
	for i, want := range msgs {
		var got []byte
		if err := s.RecvMsg(&got); err != nil {
			return fmt.Errorf("receive echo %d of %d: %w", i, len(msgs), err)
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("echo %d differs: %d bytes back, %d sent, first difference at %d", i, len(got), len(want), firstDiff(got, want))
		}
		h.Write(want)
	}
	var extra []byte
	if err := s.RecvMsg(&extra); err != io.EOF {
		return fmt.Errorf("after %d echoes: %w, want end of stream", len(msgs), err)
	}
	if err := <-sent; err != nil {
		return err
	}
	want := hex.EncodeToString(h.Sum(nil))
	if got := s.Trailer().Get(digestTrailer); len(got) != 1 || got[0] != want {
		return fmt.Errorf("server's digest of the stream %v, want [%s]", got, want)
	}
	return nil
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

var errNoAddr = errors.New("no address: give -addr with an IP of an RDMA netdev (rdma link show lists them), or set RDMA_TEST_ADDR (scripts/softroce run sets it)")
