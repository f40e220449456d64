package grpcrdma

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers "proto", the default codec
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// protoCodec is grpc's registered proto codec as it was at init: messages
// through it take the fast path (sized, then marshalled straight into the
// registered send buffer; unmarshalled from the received buffer). A codec
// registered later under "proto" replaces it in the registry and takes the
// general path.
var protoCodec = encoding.GetCodecV2("proto")

// codecFor returns the registry's codec for a content-subtype ("" means
// "proto"), or nil.
func codecFor(subtype string) encoding.CodecV2 {
	if subtype == "" {
		subtype = "proto"
	}
	return encoding.GetCodecV2(subtype)
}

// encoded is a message ready to be copied or marshalled into a frame.
type encoded struct {
	n   int
	pm  proto.Message   // fast path: marshal into the frame
	bs  mem.BufferSlice // general path: the codec's output, copied
	has bool
}

// encode sizes (fast path) or marshals (general path) v.
func encode(c encoding.CodecV2, v any) (encoded, error) {
	if c == protoCodec {
		if pm, ok := v.(proto.Message); ok {
			return encoded{n: proto.MarshalOptions{}.Size(pm), pm: pm, has: true}, nil
		}
	}
	bs, err := c.Marshal(v)
	if err != nil {
		return encoded{}, status.Errorf(codes.Internal, "grpc: error while marshaling: %v", err)
	}
	return encoded{n: bs.Len(), bs: bs, has: true}, nil
}

// writeTo fills dst (exactly e.n bytes) and frees what e held.
func (e *encoded) writeTo(dst []byte) error {
	if e.pm != nil {
		out, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(dst[:0], e.pm)
		if err != nil {
			return status.Errorf(codes.Internal, "grpc: error while marshaling: %v", err)
		}
		if len(out) != len(dst) || (len(out) > 0 && &out[0] != &dst[0]) {
			// The message changed between Size and MarshalAppend.
			return status.Errorf(codes.Internal, "grpc: message changed while being marshalled (%d bytes, sized %d)", len(out), len(dst))
		}
		return nil
	}
	e.bs.CopyTo(dst)
	e.free()
	return nil
}

func (e *encoded) free() {
	if e.bs != nil {
		e.bs.Free()
		e.bs = nil
	}
}

// decode unmarshals data into v. data is not kept: the caller releases the
// buffer under it right after.
func decode(c encoding.CodecV2, data []byte, v any) error {
	var err error
	if pm, ok := v.(proto.Message); ok && c == protoCodec {
		err = proto.Unmarshal(data, pm) // copies bytes fields: nothing aliases data
	} else {
		err = c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, v)
	}
	if err != nil {
		return status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err)
	}
	return nil
}

// codecV1 adapts a grpc encoding.Codec (ForceCodecCallOption) to CodecV2.
type codecV1 struct{ c encoding.Codec }

func (c codecV1) Marshal(v any) (mem.BufferSlice, error) {
	b, err := c.c.Marshal(v)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (c codecV1) Unmarshal(data mem.BufferSlice, v any) error {
	return c.c.Unmarshal(data.Materialize(), v)
}

func (c codecV1) Name() string { return c.c.Name() }
