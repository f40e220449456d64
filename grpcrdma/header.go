package grpcrdma

import (
	"sync"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/verbline/rdma/grpcrdma/internal/frame"
)

// blockPool holds scratch space for header blocks, which are built first
// and then copied into the frame (the message is marshalled in place).
var blockPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func getBlock() *[]byte { p := blockPool.Get().(*[]byte); *p = (*p)[:0]; return p }

func putBlock(p *[]byte) {
	if cap(*p) <= 64<<10 {
		blockPool.Put(p)
	}
}

// appendStatus appends the status entries and the trailers.
func appendStatus(b []byte, st *status.Status, trailer metadata.MD) []byte {
	b = frame.AppendMD(b, frame.KindTrailer, trailer)
	b = frame.AppendCode(b, uint32(st.Code()))
	if m := st.Message(); m != "" {
		b = frame.AppendString(b, frame.KindStatusMessage, m)
	}
	// Only an error carries details (status.WithDetails refuses OK), and
	// Proto clones: an OK call skips it.
	if st.Code() != codes.OK {
		if p := st.Proto(); len(p.GetDetails()) > 0 {
			if d, err := proto.Marshal(p); err == nil {
				b = frame.AppendEntry(b, frame.KindStatusDetails, d)
			}
		}
	}
	return b
}

// okStatus is shared by every call that ends well (a Status is immutable).
var okStatus = status.New(codes.OK, "")

// statusFromBlock returns the status a STATUS frame's block carries.
func statusFromBlock(blk frame.Block) *status.Status {
	if blk.HasCode && blk.Code == 0 && blk.Message == "" && len(blk.Details) == 0 {
		return okStatus
	}
	if !blk.HasCode {
		return status.New(codes.Internal, "grpcrdma: the server's status frame has no status code")
	}
	if len(blk.Details) > 0 {
		p := new(spb.Status)
		if err := proto.Unmarshal(blk.Details, p); err == nil && uint32(p.GetCode()) == blk.Code {
			return status.FromProto(p)
		}
		return status.New(codes.Internal, "grpcrdma: the server's status details do not match its status code")
	}
	return status.New(codes.Code(blk.Code), blk.Message)
}
