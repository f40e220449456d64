package grpcrdma

import (
	"context"
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/grpcrdma/internal/flow"
	"github.com/verbline/rdma/grpcrdma/internal/frame"
)

// fuzzTransport is a transport without a connection, for driving its
// receive path (handle) with frames from a test: what it would send goes
// nowhere, so nothing here may make it send (no refusals: a huge stream
// limit; no reader consumes; a connection window no input fills halfway,
// so no connection WINDOW either).
func fuzzTransport(server bool, window int) (*transport, *[]*stream) {
	lim := defaultLimits()
	lim.streamWindow = window
	lim.maxRecvMsg = 1 << 12
	lim.maxStreams = 1 << 30
	lim.connWindow = maxWindow
	ctx, cancel := context.WithCancel(context.Background())
	t := &transport{
		server: server, local: lim,
		peer:     frame.Settings{StreamWindow: uint32(window), ConnWindow: maxWindow, MaxStreams: 8, MaxBlock: 1 << 12},
		connSend: flow.NewSend(maxWindow), connRecv: flow.NewRecv(maxWindow),
		ctx: ctx, cancel: cancel,
		streams: map[uint32]*stream{}, done: make(chan struct{}), readerDone: make(chan struct{}),
	}
	var all []*stream
	t.onIdle = func(*transport) {}
	if server {
		t.onStream = func(s *stream, _ frame.Block) { all = append(all, s) }
	} else {
		// Three calls opened by this client.
		t.slots = make(chan struct{}, 8)
		for id := uint32(1); id <= 3; id++ {
			t.slots <- struct{}{}
			s := newStream(t, id)
			s.slot = true
			t.streams[id] = s
			t.lastID = id
			all = append(all, s)
		}
	}
	return t, &all
}

var (
	fuzzPoolOnce sync.Once
	fuzzPoolP    *buffer.Pool
	fuzzPoolErr  error
)

// fuzzPool is one pool of plain memory for every input: making one per
// input (mapping its arenas) would cost more than the input's run.
func fuzzPool(t *testing.T) *buffer.Pool {
	fuzzPoolOnce.Do(func() { fuzzPoolP, fuzzPoolErr = buffer.NewPool(nil, buffer.Options{}) })
	if fuzzPoolErr != nil {
		t.Fatal(fuzzPoolErr)
	}
	return fuzzPoolP
}

// fuzzFrames encodes frames as the fuzz input's records: a 2-byte length,
// then the frame.
func fuzzFrames(first byte, frames ...[]byte) []byte {
	b := []byte{first}
	for _, f := range frames {
		b = binary.BigEndian.AppendUint16(b, uint16(len(f)))
		b = append(b, f...)
	}
	return b
}

func mkFrame(ty frame.Type, flags uint8, id, value uint32, block, msg []byte) []byte {
	b := make([]byte, frame.HeaderLen)
	if ty == frame.TypeStream {
		value = uint32(len(block))
	}
	frame.Header{Type: ty, Flags: flags, Stream: id, Value: value}.Put(b)
	return append(append(b, block...), msg...)
}

// FuzzTransportFrames drives a transport's receive path, client or server
// (the first byte's low bit), with a sequence of peer frames: decoding,
// stream bookkeeping, ordering, flow-control checks, CANCEL, WINDOW and
// GOAWAY. It must never panic; a violation is an error, after which the
// connection would close; and once every call is ended, no received buffer
// may be left held, and (if no violation ended the input) every message
// byte must be back in the connection window.
func FuzzTransportFrames(f *testing.F) {
	hdr := frame.AppendString(nil, frame.KindPath, "/s/m")
	hdr = frame.AppendMD(hdr, frame.KindHeader, metadata.Pairs("k", "v"))
	st := frame.AppendCode(nil, 0)
	f.Add(fuzzFrames(0,
		mkFrame(frame.TypeStream, frame.FlagHeaders|frame.FlagMessage|frame.FlagEnd, 1, 0, hdr, []byte("req")),
		mkFrame(frame.TypeStream, frame.FlagHeaders, 2, 0, hdr, nil),
		mkFrame(frame.TypeStream, frame.FlagMessage, 2, 0, nil, make([]byte, 3000)),
		mkFrame(frame.TypeWindow, 0, 2, 100, nil, nil),
		mkFrame(frame.TypeCancel, 0, 2, 1, nil, nil),
		mkFrame(frame.TypeStream, frame.FlagMessage, 2, 0, nil, []byte("late"))))
	f.Add(fuzzFrames(1,
		mkFrame(frame.TypeStream, frame.FlagHeaders|frame.FlagMessage, 1, 0, frame.AppendMD(nil, frame.KindHeader, metadata.Pairs("a", "b")), []byte("r")),
		mkFrame(frame.TypeStream, frame.FlagMessage, 1, 0, nil, make([]byte, 5000)),
		mkFrame(frame.TypeStream, frame.FlagStatus|frame.FlagMessage, 1, 0, st, []byte("last")),
		mkFrame(frame.TypeStream, frame.FlagStatus, 2, 0, st, nil),
		mkFrame(frame.TypeGoAway, 0, 0, 2, nil, []byte("bye")),
		mkFrame(frame.TypeStream, frame.FlagHeaders, 9, 0, nil, nil)))
	f.Fuzz(fuzzTransportOne)
}

func fuzzTransportOne(tt *testing.T, in []byte) {
	if len(in) == 0 {
		return
	}
	pool := fuzzPool(tt)
	t, all := fuzzTransport(in[0]&1 == 0, 4096)
	defer t.cancel()
	in = in[1:]
	violated := false
	for len(in) >= 2 {
		n := int(binary.BigEndian.Uint16(in))
		in = in[2:]
		if n > len(in) {
			n = len(in)
		}
		b, err := pool.Get(n)
		if err != nil {
			tt.Fatal(err)
		}
		copy(b.Bytes(), in[:n])
		in = in[n:]
		if err := t.handle(b); err != nil {
			if err.Error() == "" {
				tt.Fatal("an error without a message")
			}
			violated = true
			break // the connection would close here
		}
	}
	for _, s := range *all {
		s.fail(errCallEnded)
		s.drop()
	}
	if h := t.held.Load(); h != 0 {
		tt.Fatalf("%d buffers held after every call ended", h)
	}
	t.recvMu.Lock()
	unread := t.connRecv.Unread()
	t.recvMu.Unlock()
	if !violated && unread != 0 {
		tt.Fatalf("%d message bytes still counted in the connection window after every call ended", unread)
	}
	deadline := time.Now().Add(time.Second)
	for pool.Stats().InUseBytes != 0 {
		if time.Now().After(deadline) {
			tt.Fatalf("%d bytes of buffers not released", pool.Stats().InUseBytes)
		}
		time.Sleep(time.Millisecond)
	}
}
