package grpcrdma

// A peer that breaks the protocol: every case ends with a clear status for
// its call or with the connection closed (rdma.ErrProtocol on this side),
// never a panic or a hang, and the server goes on serving others.

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/grpcrdma/internal/frame"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/testpb"
)

// rawConn dials addr and exchanges SETTINGS as a client (or answers as a
// server when accepting), leaving the frames to the test.
func rawDial(t *testing.T, addr string) *rdma.Conn {
	t.Helper()
	d := rdma.Dialer{Fallback: &rdma.Fallback{RDMATimeout: rdmatest.Scale(2 * time.Second)}}
	nc, err := d.DialContext(ctxT(t, 10*time.Second), "rdma", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := nc.(*rdma.Conn)
	if _, err := handshake(ctxT(t, 10*time.Second), c, defaultLimits(), false); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c
}

func sendRaw(t *testing.T, c *rdma.Conn, b []byte) {
	t.Helper()
	m, err := c.Alloc(len(b))
	if err != nil {
		t.Fatal(err)
	}
	copy(m.Bytes(), b)
	if err := c.Send(ctxT(t, 5*time.Second), m); err != nil {
		t.Fatal(err)
	}
}

// recvRaw returns the next frame, or the error that ended the connection.
func recvRaw(t *testing.T, c *rdma.Conn) (frame.Frame, buffer.Buf, error) {
	t.Helper()
	m, err := c.Recv(ctxT(t, 10*time.Second))
	if err != nil {
		return frame.Frame{}, m, err
	}
	f, err := frame.Parse(m.Bytes(), frame.Limits{MaxBlock: 1 << 16})
	if err != nil {
		m.Release()
		t.Fatalf("the server sent a malformed frame: %v", err)
	}
	return f, m, nil
}

// wantClosed waits for the server to close the connection.
func wantClosed(t *testing.T, c *rdma.Conn, what string) {
	t.Helper()
	for {
		f, m, err := recvRaw(t, c)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%s: the server kept the connection open", what)
			}
			return
		}
		m.Release()
		_ = f
	}
}

func request(id uint32, method string, flags uint8, msg []byte) []byte {
	blk := frame.AppendString(nil, frame.KindPath, method)
	return mkFrame(frame.TypeStream, frame.FlagHeaders|flags, id, 0, blk, msg)
}

func TestHostileClient(t *testing.T) {
	g0 := rdmatest.Goroutines()
	p := startServer(t, anyListen(t), MaxRecvMsgSize(100), StreamWindow(1024), ConnWindow(2048))
	defer func() { p.close(t); rdmatest.WaitGoroutines(t, g0) }()
	say, _ := proto.Marshal(&testpb.EchoRequest{Message: "hi"})
	stall, _ := proto.Marshal(&testpb.EchoRequest{Message: "stall"}) // Chat reads nothing more
	cases := []struct {
		name   string
		frames [][]byte
	}{
		{"unknown stream id", [][]byte{mkFrame(frame.TypeStream, frame.FlagMessage, 5, 0, nil, []byte("x"))}},
		{"headers twice", [][]byte{request(1, "/grpcrdma.test.Echo/Collect", 0, nil), request(1, "/grpcrdma.test.Echo/Collect", 0, nil)}},
		{"message after end", [][]byte{request(1, "/grpcrdma.test.Echo/Chat", frame.FlagMessage|frame.FlagEnd, stall), mkFrame(frame.TypeStream, frame.FlagMessage, 1, 0, nil, nil)}},
		{"status from a client", [][]byte{request(1, "/grpcrdma.test.Echo/Collect", frame.FlagStatus, nil)}},
		{"window for an unopened stream", [][]byte{mkFrame(frame.TypeWindow, 0, 3, 10, nil, nil)}},
		{"window beyond what was sent", [][]byte{request(1, "/grpcrdma.test.Echo/Collect", 0, nil), mkFrame(frame.TypeWindow, 0, 1, 10, nil, nil)}},
		{"beyond the window", [][]byte{request(1, "/grpcrdma.test.Echo/Chat", frame.FlagMessage, stall),
			mkFrame(frame.TypeStream, frame.FlagMessage, 1, 0, nil, make([]byte, 90)),
			mkFrame(frame.TypeStream, frame.FlagMessage, 1, 0, nil, make([]byte, 90)),
			mkFrame(frame.TypeStream, frame.FlagMessage, 1, 0, nil, make([]byte, 90)),
			mkFrame(frame.TypeStream, frame.FlagMessage, 1, 0, nil, make([]byte, 90)),
			mkFrame(frame.TypeStream, frame.FlagMessage, 1, 0, nil, make([]byte, 90)),
			mkFrame(frame.TypeStream, frame.FlagMessage, 1, 0, nil, make([]byte, 90)),
			mkFrame(frame.TypeStream, frame.FlagMessage, 1, 0, nil, make([]byte, 90)),
			mkFrame(frame.TypeStream, frame.FlagMessage, 1, 0, nil, make([]byte, 90)),
			mkFrame(frame.TypeStream, frame.FlagMessage, 1, 0, nil, make([]byte, 90)),
			mkFrame(frame.TypeStream, frame.FlagMessage, 1, 0, nil, make([]byte, 90)),
			mkFrame(frame.TypeStream, frame.FlagMessage, 1, 0, nil, make([]byte, 90)),
			mkFrame(frame.TypeStream, frame.FlagMessage, 1, 0, nil, make([]byte, 90)),
		}},
		{"beyond the connection window", [][]byte{ // each stream within its window, together beyond 2048
			request(1, "/grpcrdma.test.Echo/Chat", frame.FlagMessage, stall),
			mkFrame(frame.TypeStream, frame.FlagMessage, 1, 0, nil, make([]byte, 900)),
			request(3, "/grpcrdma.test.Echo/Chat", frame.FlagMessage, stall),
			mkFrame(frame.TypeStream, frame.FlagMessage, 3, 0, nil, make([]byte, 900)),
			request(5, "/grpcrdma.test.Echo/Chat", frame.FlagMessage, stall),
			mkFrame(frame.TypeStream, frame.FlagMessage, 5, 0, nil, make([]byte, 900)),
		}},
		{"connection window beyond what was sent", [][]byte{mkFrame(frame.TypeWindow, 0, 0, 10, nil, nil)}},
		{"SETTINGS again", [][]byte{mkFrame(frame.TypeSettings, 0, 0, 0, nil, frame.Settings{Major: 1, StreamWindow: 4096, MaxBlock: 4096}.Append(nil))}},
		{"malformed block", [][]byte{mkFrame(frame.TypeStream, frame.FlagHeaders, 1, 0, []byte{frame.KindHeader, 3, 1, 'A', 'b'}, nil)}},
		{"unknown frame type", [][]byte{mkFrame(9, 0, 1, 0, nil, nil)}},
		{"short frame", [][]byte{{2, 1}}},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			rc := rawDial(t, p.addr)
			defer rc.Close()
			for _, f := range c.frames {
				sendRaw(t, rc, f)
			}
			wantClosed(t, rc, c.name)
		})
	}
	t.Run("message_above_the_limit", func(t *testing.T) {
		// The call ends with RESOURCE_EXHAUSTED; the connection serves on.
		rc := rawDial(t, p.addr)
		defer rc.Close()
		big, _ := proto.Marshal(&testpb.EchoRequest{Payload: make([]byte, 200)})
		sendRaw(t, rc, request(1, "/grpcrdma.test.Echo/Say", frame.FlagMessage|frame.FlagEnd, big))
		sendRaw(t, rc, request(2, "/grpcrdma.test.Echo/Say", frame.FlagMessage|frame.FlagEnd, say))
		got := map[uint32]codes.Code{}
		for len(got) < 2 {
			f, m, err := recvRaw(t, rc)
			if err != nil {
				t.Fatalf("connection ended: %v (statuses so far %v)", err, got)
			}
			if f.Flags&frame.FlagStatus != 0 {
				blk, err := frame.ParseBlock(f.Block)
				if err != nil {
					t.Fatal(err)
				}
				got[f.Stream] = codes.Code(blk.Code)
			}
			m.Release()
		}
		if got[1] != codes.ResourceExhausted || got[2] != codes.OK {
			t.Fatalf("statuses %v, want stream 1 ResourceExhausted, 2 OK", got)
		}
	})
	// The server serves on.
	cc, err := Dial(ctxT(t, 10*time.Second), p.addr, fallbackDial())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := testpb.NewEchoClient(cc).Say(ctxT(t, 5*time.Second), &testpb.EchoRequest{}); err != nil {
		t.Fatal(err)
	}
}

// TestHostileServer: a server that answers on a stream never opened makes
// the client close the connection; the call fails with INTERNAL naming the
// protocol violation, and the next call dials a new connection.
func TestHostileServer(t *testing.T) {
	g0 := rdmatest.Goroutines()
	ln := anyListen(t)
	defer ln.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		for i := 0; ; i++ {
			c, err := ln.AcceptRDMA()
			if err != nil {
				return
			}
			if _, err := handshake(context.Background(), c, defaultLimits(), true); err != nil {
				c.Close()
				continue
			}
			m, err := c.Recv(context.Background())
			if err != nil {
				c.Close()
				continue
			}
			m.Release()
			reply := mkFrame(frame.TypeStream, frame.FlagStatus, 77, 0, frame.AppendCode(nil, 0), nil)
			if i > 0 { // the second connection answers properly
				rb, _ := proto.Marshal(&testpb.EchoReply{Message: "ok"})
				reply = mkFrame(frame.TypeStream, frame.FlagHeaders|frame.FlagMessage|frame.FlagStatus, 1, 0, frame.AppendCode(nil, 0), rb)
			}
			b, _ := c.Alloc(len(reply))
			copy(b.Bytes(), reply)
			c.Send(context.Background(), b)
			go func() {
				for {
					m, err := c.Recv(context.Background())
					if err != nil {
						c.Close()
						return
					}
					m.Release()
				}
			}()
		}
	}()
	cc, err := Dial(ctxT(t, 10*time.Second), ln.Addr().String(), fallbackDial())
	if err != nil {
		t.Fatal(err)
	}
	client := testpb.NewEchoClient(cc)
	_, err = client.Say(ctxT(t, 10*time.Second), &testpb.EchoRequest{})
	st := wantCode(t, "a reply on an unopened stream", err, codes.Internal)
	if !strings.Contains(st.Message(), rdma.ErrProtocol.Error()) {
		t.Errorf("message %q does not name the protocol violation", st.Message())
	}
	r, err := client.Say(ctxT(t, 10*time.Second), &testpb.EchoRequest{})
	if err != nil || r.Message != "ok" {
		t.Fatalf("the call after the violation: %v, %v", r, err)
	}
	cc.Close()
	ln.Close()
	<-served
	rdmatest.WaitGoroutines(t, g0)
	_ = io.EOF
}

// TestGoAwayRetry: a unary call the server's GOAWAY says it did not serve
// goes again on a new connection, and the call options see one call.
func TestGoAwayRetry(t *testing.T) {
	g0 := rdmatest.Goroutines()
	ln := anyListen(t)
	served := make(chan struct{})
	go func() {
		defer close(served)
		for i := 0; ; i++ {
			c, err := ln.AcceptRDMA()
			if err != nil {
				return
			}
			if _, err := handshake(context.Background(), c, defaultLimits(), true); err != nil {
				c.Close()
				continue
			}
			m, err := c.Recv(context.Background())
			if err != nil {
				c.Close()
				continue
			}
			m.Release()
			reply := mkFrame(frame.TypeGoAway, 0, 0, 0, nil, []byte("draining"))
			if i > 0 {
				rb, _ := proto.Marshal(&testpb.EchoReply{Message: "second"})
				reply = mkFrame(frame.TypeStream, frame.FlagHeaders|frame.FlagMessage|frame.FlagStatus, 1, 0, frame.AppendCode(nil, 0), rb)
			}
			b, _ := c.Alloc(len(reply))
			copy(b.Bytes(), reply)
			c.Send(context.Background(), b)
			go func() {
				defer c.Close()
				for {
					m, err := c.Recv(context.Background())
					if err != nil {
						return
					}
					m.Release()
				}
			}()
		}
	}()
	cc, err := Dial(ctxT(t, 10*time.Second), ln.Addr().String(), fallbackDial())
	if err != nil {
		t.Fatal(err)
	}
	finished := 0
	r, err := testpb.NewEchoClient(cc).Say(ctxT(t, 10*time.Second), &testpb.EchoRequest{}, grpc.OnFinish(func(error) { finished++ }))
	if err != nil || r.Message != "second" || finished != 1 {
		t.Fatalf("a call refused by GOAWAY: %v, %v; OnFinish ran %d times", r, err, finished)
	}
	cc.Close()
	ln.Close()
	<-served
	rdmatest.WaitGoroutines(t, g0)
}
