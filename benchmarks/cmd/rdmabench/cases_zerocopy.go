//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/buffer"
)

// Cases of the zero-copy message view and of one-sided RDMA writes.
func init() {
	register(Case{Name: "msg-pingpong", Metric: Latency, Run: msgPingPong})
	register(Case{Name: "write-pingpong", Metric: Latency, Run: writePingPong})
	register(Case{Name: "msg-stream", Metric: Bandwidth, Run: msgStream})
	register(Case{Name: "write-stream", Metric: Bandwidth, Run: writeStream})
	register(Case{Name: "msg-msgrate", Metric: Rate, Run: msgRateZeroCopy})
}

func rdmaConn(s *Side) (*rdma.Conn, error) {
	c, ok := s.Conn.(*rdma.Conn)
	if !ok {
		return nil, errors.New("case needs an RDMA connection")
	}
	return c, nil
}

// msgPingPong: Send a registered buffer, receive the echo as a Buf from
// Messages(); the server sends the very buffer it received back (no copy).
func msgPingPong(s *Side) (*Sample, error) {
	c, err := rdmaConn(s)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	if s.Size > c.MaxMessageSize() {
		return nil, fmt.Errorf("%d B exceeds the message size limit %d", s.Size, c.MaxMessageSize())
	}
	if s.Server {
		for {
			phase(phaseRecv)
			b, err := c.Recv(ctx)
			if err != nil {
				return nil, nil // the client closed
			}
			phase(phaseSend)
			if err := c.Send(ctx, b); err != nil {
				return nil, err
			}
		}
	}
	rtts := make([]time.Duration, 0, s.Iters)
	for i := 0; i < s.Warmup+s.Iters; i++ {
		s.Slow.begin()
		start := time.Now()
		phase(phaseSend)
		b, err := c.Alloc(s.Size)
		if err != nil {
			return nil, err
		}
		if err := c.Send(ctx, b); err != nil {
			return nil, err
		}
		phase(phaseRecv)
		r, err := c.Recv(ctx)
		if err != nil {
			return nil, err
		}
		phase(phaseRelease)
		r.Release()
		phase(phaseOther)
		rtts = s.done(rtts, i, start)
	}
	return latencySample(rtts), nil
}

// exchange trades export descriptors over the message view.
func exchange(c *rdma.Conn, size int, access rdma.Access) (local buffer.Buf, exp *rdma.Export, remote rdma.RemoteBuf, err error) {
	ctx := context.Background()
	if local, err = c.Alloc(size); err != nil {
		return
	}
	if exp, err = c.Export(local, access); err != nil {
		return
	}
	d, err := c.Alloc(64)
	if err != nil {
		return
	}
	d.SetLen(len(exp.Remote().AppendTo(d.Bytes()[:0])))
	if err = c.Send(ctx, d); err != nil {
		return
	}
	m, err := c.Recv(ctx)
	if err != nil {
		return
	}
	remote, err = rdma.ParseRemoteBuf(m.Bytes())
	m.Release()
	return
}

// exportedPair gets the case's RDMA connection and trades exported buffers of
// Size bytes with the other side; done closes the export and frees the buffer.
func exportedPair(s *Side) (c *rdma.Conn, local buffer.Buf, remote rdma.RemoteBuf, done func(), err error) {
	if c, err = rdmaConn(s); err != nil {
		return
	}
	local, exp, remote, err := exchange(c, max(s.Size, 64), rdma.RemoteWrite)
	if err != nil {
		return
	}
	local.SetLen(s.Size)
	return c, local, remote, func() { exp.Close(); local.Release() }, nil
}

// writePingPong: each side exports a buffer; the client RDMA-writes Size
// bytes with an immediate into the server's, the server answers the same way
// when notified (as ib_write_lat, whose reader polls memory instead). Both
// wait with RecvNotification, which polls for the completion meanwhile.
// Each side writes with the blocking WriteRemoteImm, which waits for its
// write's end before waiting for the answer. RDMABENCH_WRITE_POST=1 posts
// it instead (PostWriteRemoteImm) and takes its end (RecvCompletion) after
// the answer came; it is not the default because it is no faster, the
// write's acknowledgement coming long before the answer (measured:
// docs/performance.md, "Alternatives measured").
func writePingPong(s *Side) (*Sample, error) {
	c, local, remote, done, err := exportedPair(s)
	if err != nil {
		return nil, err
	}
	defer done()
	ctx := context.Background()
	blocking := os.Getenv("RDMABENCH_WRITE_POST") != "1"
	posted := false // a write whose end is not taken yet
	write := func(imm uint32) error {
		if blocking {
			return c.WriteRemoteImm(ctx, local, remote, 0, imm)
		}
		if err := c.PostWriteRemoteImm(ctx, local, remote, 0, imm, uint64(imm)); err != nil {
			return err
		}
		posted = true
		return nil
	}
	// reap takes the last write's end, which came before the answer to it.
	reap := func() error {
		if !posted {
			return nil
		}
		posted = false
		oc, err := c.RecvCompletion(ctx)
		if err == nil {
			err = oc.Err
		}
		return err
	}
	// The phases (-stages): a blocking write's send phase includes the wait
	// for its own completion; taking a posted write's end (reap) counts as
	// release, with the notification's.
	if s.Server {
		for {
			phase(phaseRecv)
			n, err := c.RecvNotification(ctx)
			if err != nil {
				return nil, nil // the client closed
			}
			phase(phaseRelease)
			n.Release()
			if err := reap(); err != nil {
				return nil, err
			}
			phase(phaseSend)
			if err := write(n.Imm); err != nil {
				return nil, err
			}
		}
	}
	rtts := make([]time.Duration, 0, s.Iters)
	for i := 0; i < s.Warmup+s.Iters; i++ {
		s.Slow.begin()
		start := time.Now()
		phase(phaseSend)
		if err := write(uint32(i)); err != nil {
			return nil, err
		}
		phase(phaseRecv)
		n, err := c.RecvNotification(ctx)
		if err != nil {
			return nil, err
		}
		phase(phaseRelease)
		n.Release()
		if err := reap(); err != nil {
			return nil, err
		}
		phase(phaseOther)
		rtts = s.done(rtts, i, start)
	}
	return latencySample(rtts), nil
}

// msgStream: the client Sends Iters messages of Size bytes (split into
// messages of at most MaxMessageSize when larger), zero-copy; the server
// receives and releases them, measuring bytes (bandwidth) or messages (rate)
// per second. The clock starts when a 1-byte start message arrives, sent
// just before the data: starting it at the first data message would leave
// out the part of the transfer that overlaps it, which for messages above a
// receive buffer (up to 8 RDMA READs in flight at once) is a large share of
// a run and would inflate the figure.
func msgStream(s *Side) (*Sample, error) { return msgFlow(s, false) }

// msgRateZeroCopy is msgStream counted in 10^6 messages per second.
func msgRateZeroCopy(s *Side) (*Sample, error) { return msgFlow(s, true) }

func msgFlow(s *Side, rate bool) (*Sample, error) {
	c, err := rdmaConn(s)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	chunk := min(s.Size, c.MaxMessageSize())
	perMsg := (s.Size + chunk - 1) / chunk
	total := s.Iters * perMsg
	if s.Server {
		var bytes, msgs int64
		b, err := c.Recv(ctx) // the start message
		if err != nil {
			return nil, err
		}
		b.Release()
		start := time.Now()
		for i := 0; i < total; i++ {
			b, err := c.Recv(ctx)
			if err != nil {
				return nil, err
			}
			bytes += int64(b.Len())
			msgs++
			b.Release()
		}
		el := time.Since(start)
		if rate {
			return &Sample{Value: float64(msgs) / el.Seconds() / 1e6}, nil
		}
		return &Sample{Value: float64(bytes) / el.Seconds() / 1e6}, nil
	}
	b, err := c.Alloc(1)
	if err != nil {
		return nil, err
	}
	if err := c.Send(ctx, b); err != nil {
		return nil, err
	}
	for i := 0; i < s.Iters; i++ {
		for left := s.Size; left > 0; left -= chunk {
			b, err := c.Alloc(min(left, chunk))
			if err != nil {
				return nil, err
			}
			if err := c.Send(ctx, b); err != nil {
				return nil, err
			}
		}
	}
	_, err = c.Recv(ctx) // wait for the server to finish (it closes)
	_ = err
	return nil, nil
}

// writeStream: the client keeps up to 16 RDMA writes of Size bytes in flight
// into the server's exported buffer (PostWriteRemote, their ends taken with
// RecvCompletion, which polls for them: RDMABENCH_WRITE_CHAN=1 takes them
// from Completions() instead); bandwidth is bytes over the time until the
// last completes.
func writeStream(s *Side) (*Sample, error) {
	c, local, remote, done, err := exportedPair(s)
	if err != nil {
		return nil, err
	}
	defer done()
	if s.Server {
		_, err := c.Recv(context.Background()) // the client closes when done
		_ = err
		return nil, nil
	}
	const depth = 16
	next := func() error {
		oc, err := c.RecvCompletion(context.Background())
		if err != nil {
			return err
		}
		return oc.Err
	}
	if os.Getenv("RDMABENCH_WRITE_CHAN") == "1" {
		next = func() error { return (<-c.Completions()).Err }
	}
	start := time.Now()
	if err := postWindowed(s.Iters, depth, func(i int) error { return c.PostWriteRemote(local, remote, 0, uint64(i)) }, next); err != nil {
		return nil, err
	}
	el := time.Since(start)
	return &Sample{Value: float64(s.Size) * float64(s.Iters) / el.Seconds() / 1e6}, nil
}

// postWindowed posts iters operations (post(i) for each i) keeping at most
// depth outstanding: past depth it takes one end (next) before posting
// again, and at the end it takes the ends still outstanding.
func postWindowed(iters, depth int, post func(i int) error, next func() error) error {
	inflight := 0
	for i := 0; i < iters; i++ {
		if inflight == depth {
			if err := next(); err != nil {
				return err
			}
			inflight--
		}
		if err := post(i); err != nil {
			return err
		}
		inflight++
	}
	for ; inflight > 0; inflight-- {
		if err := next(); err != nil {
			return err
		}
	}
	return nil
}
