package grpcrdma

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// TestUnreadBound: the bound the package documentation states for the
// defaults, and that it follows the limits.
func TestUnreadBound(t *testing.T) {
	l := defaultLimits()
	if got, want := l.unreadBound(), int64(16<<20); got != want {
		t.Fatalf("default bound %d, want the connection window %d", got, want)
	}
	l.maxRecvMsg, l.maxStreams = 1000, 10
	if got := l.unreadBound(); got != 10*1<<20 {
		t.Fatalf("bound %d with small messages and few streams, want 10 stream windows", got)
	}
	l.maxRecvMsg, l.maxStreams, l.connWindow = 4<<20, 100, 1<<20
	if got, want := l.unreadBound(), int64(512<<10+4<<20); got != want {
		t.Fatalf("bound %d with a small connection window, want half of it plus a message (%d)", got, want)
	}
	big := limits{streamWindow: 1 << 40, connWindow: 1 << 40, maxStreams: 1, maxBlock: 1024}.sane()
	if big.streamWindow != maxWindow || big.connWindow != maxWindow {
		t.Fatalf("sane() kept windows beyond 32 bits: %+v", big)
	}
	bad := limits{streamWindow: 10, connWindow: 10, maxStreams: 0, maxRecvMsg: -1, maxSendMsg: -1, maxBlock: 0}.sane()
	if bad != defaultLimits() {
		t.Fatalf("sane() kept unusable limits: %+v", bad)
	}
}

// TestCallOptions: the options honoured change the call, the refused fail
// it with Unimplemented, the others change nothing.
func TestCallOptions(t *testing.T) {
	cc := &ClientConn{opts: dialOptions{limits: defaultLimits()}}
	var hdr, trl metadata.MD
	var p peer.Peer
	var finished error = status.Error(codes.OK, "")
	ci, err := cc.newCallInfo([]grpc.CallOption{
		grpc.Header(&hdr), grpc.Trailer(&trl), grpc.Peer(&p),
		grpc.MaxCallRecvMsgSize(10), grpc.MaxCallSendMsgSize(20),
		grpc.CallContentSubtype("testjson"),
		grpc.OnFinish(func(err error) { finished = err }),
		grpc.WaitForReady(true), grpc.StaticMethod(), grpc.UseCompressor("identity"), grpc.CallAuthority("x"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if ci.maxRecv != 10 || ci.maxSend != 20 || ci.codec.Name() != "testjson" || ci.subtype() != "testjson" {
		t.Fatalf("callInfo %+v", ci)
	}
	ci.finish(metadata.Pairs("h", "1"), metadata.Pairs("t", "2"), &peer.Peer{}, nil)
	if hdr.Get("h")[0] != "1" || trl.Get("t")[0] != "2" || finished != nil {
		t.Fatalf("results: %v %v %v", hdr, trl, finished)
	}
	for name, o := range map[string]grpc.CallOption{
		"credentials": grpc.PerRPCCredentials(nil),
		"gzip":        grpc.UseCompressor("gzip"),
	} {
		if _, err := cc.newCallInfo([]grpc.CallOption{o}); status.Code(err) != codes.Unimplemented {
			t.Errorf("%s: %v, want Unimplemented", name, err)
		}
	}
	ci, err = cc.newCallInfo([]grpc.CallOption{grpc.ForceCodecV2(encoding.GetCodecV2("proto"))})
	if err != nil || ci.subtype() != "" {
		t.Fatalf("proto forced: %v, subtype %q", err, ci.subtype())
	}
}
