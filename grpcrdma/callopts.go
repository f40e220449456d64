package grpcrdma

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// callInfo is what a call's options ask for. grpc.CallOption's methods are
// unexported, so options are recognised by their exported struct types:
//
//	honoured: HeaderCallOption, TrailerCallOption, PeerCallOption,
//	  MaxRecvMsgSizeCallOption, MaxSendMsgSizeCallOption,
//	  ForceCodecCallOption, ForceCodecV2CallOption, ContentSubtypeCallOption,
//	  OnFinishCallOption
//	refused (the call fails with codes.Unimplemented before anything is
//	  sent, since ignoring them would drop what the caller relies on):
//	  PerRPCCredsCallOption (no credentials travel), CompressorCallOption
//	  naming a compressor other than "identity" (no compression)
//	ignored: FailFastCallOption and WaitForReady (a call makes one
//	  connection attempt when none is up), AuthorityOverrideCallOption,
//	  MaxRetryRPCBufferSizeCallOption (no retries), StaticMethodCallOption,
//	  CustomCodecCallOption (deprecated), and every other option.
type callInfo struct {
	headers  []*metadata.MD
	trailers []*metadata.MD
	peers    []*peer.Peer
	onFinish []func(error)
	maxRecv  int
	maxSend  int
	codec    encoding.CodecV2
}

func (cc *ClientConn) newCallInfo(opts []grpc.CallOption) (*callInfo, error) {
	ci := &callInfo{maxRecv: cc.opts.maxRecvMsg, maxSend: cc.opts.maxSendMsg, codec: cc.opts.codec}
	if err := ci.apply(cc.opts.callOpts); err != nil {
		return nil, err
	}
	if err := ci.apply(opts); err != nil {
		return nil, err
	}
	if ci.codec == nil {
		ci.codec = protoCodec
	}
	return ci, nil
}

func (ci *callInfo) apply(opts []grpc.CallOption) error {
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.HeaderCallOption:
			ci.headers = append(ci.headers, o.HeaderAddr)
		case grpc.TrailerCallOption:
			ci.trailers = append(ci.trailers, o.TrailerAddr)
		case grpc.PeerCallOption:
			ci.peers = append(ci.peers, o.PeerAddr)
		case grpc.OnFinishCallOption:
			ci.onFinish = append(ci.onFinish, o.OnFinish)
		case grpc.MaxRecvMsgSizeCallOption:
			ci.maxRecv = o.MaxRecvMsgSize
		case grpc.MaxSendMsgSizeCallOption:
			ci.maxSend = o.MaxSendMsgSize
		case grpc.ForceCodecV2CallOption:
			ci.codec = o.CodecV2
		case grpc.ForceCodecCallOption:
			ci.codec = codecV1{o.Codec}
		case grpc.ContentSubtypeCallOption:
			c := codecFor(o.ContentSubtype)
			if c == nil {
				return status.Errorf(codes.Internal, "no codec registered for content-subtype %s", o.ContentSubtype)
			}
			ci.codec = c
		case grpc.PerRPCCredsCallOption:
			return status.Error(codes.Unimplemented, "grpcrdma: per-RPC credentials are not supported")
		case grpc.CompressorCallOption:
			if o.CompressorType != "" && o.CompressorType != "identity" {
				return status.Errorf(codes.Unimplemented, "grpcrdma: compression (%s) is not supported", o.CompressorType)
			}
		}
	}
	return nil
}

// subtype is the content-subtype sent for the call's codec ("" for proto).
func (ci *callInfo) subtype() string {
	if ci.codec == protoCodec || ci.codec.Name() == "proto" {
		return ""
	}
	return ci.codec.Name()
}

// finish hands the call's results to the options that asked for them.
func (ci *callInfo) finish(header, trailer metadata.MD, p *peer.Peer, err error) {
	for _, h := range ci.headers {
		*h = header
	}
	for _, t := range ci.trailers {
		*t = trailer
	}
	for _, pp := range ci.peers {
		if p != nil {
			*pp = *p
		}
	}
	for _, f := range ci.onFinish {
		f(err)
	}
}
