//go:build linux

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/verbline/rdma"
)

// The RDMA atomics, side by side with ib_atomic_lat and ib_atomic_bw: the
// server exports a buffer with RemoteAtomic and sends its descriptor; the
// client works on its first word, the server waits until the client closes.
func init() {
	register(Case{Name: "cas-lat", Metric: AtomicLatency, Run: atomicLatency(true), Needs: needAtomics})
	register(Case{Name: "faa-lat", Metric: AtomicLatency, Run: atomicLatency(false), Needs: needAtomics})
	register(Case{Name: "faa-rate", Metric: AtomicRate, Run: atomicRate, Needs: needAtomics})
}

// atomicDepth is the atomics outstanding in the rate case, on both ours
// and ib_atomic_bw (-o): rdma.Config's default READ/atomic depth.
const atomicDepth = 16

// atomicPair sets up the server's export (its first word zeroed before
// its descriptor leaves) and returns the client's connection and that
// descriptor; the server's side returns a nil Conn once its client closed.
func atomicPair(s *Side) (*rdma.Conn, rdma.RemoteBuf, error) {
	c, err := rdmaConn(s)
	if err != nil {
		return nil, rdma.RemoteBuf{}, err
	}
	ctx := context.Background()
	if !s.Server {
		m, err := c.Recv(ctx)
		if err != nil {
			return nil, rdma.RemoteBuf{}, err
		}
		remote, err := rdma.ParseRemoteBuf(m.Bytes())
		m.Release()
		return c, remote, err
	}
	word, err := c.Alloc(64)
	if err != nil {
		return nil, rdma.RemoteBuf{}, err
	}
	defer word.Release()
	clear(word.Bytes())
	exp, err := c.Export(word, rdma.RemoteAtomic)
	if err != nil {
		return nil, rdma.RemoteBuf{}, err
	}
	defer exp.Close()
	d, err := c.Alloc(64)
	if err != nil {
		return nil, rdma.RemoteBuf{}, err
	}
	d.SetLen(len(exp.Remote().AppendTo(d.Bytes()[:0])))
	if err := c.Send(ctx, d); err != nil {
		return nil, rdma.RemoteBuf{}, err
	}
	_, err = c.Recv(ctx) // the client closes when done
	_ = err
	return nil, rdma.RemoteBuf{}, nil
}

// atomicLatency: one CompareAndSwap (of i for i+1, so each one swaps) or
// FetchAdd at a time; each operation's whole time, as ib_atomic_lat's.
func atomicLatency(cas bool) func(s *Side) (*Sample, error) {
	return func(s *Side) (*Sample, error) {
		c, remote, err := atomicPair(s)
		if err != nil || c == nil {
			return nil, err
		}
		ctx := context.Background()
		ops := make([]time.Duration, 0, s.Iters)
		for i := 0; i < s.Warmup+s.Iters; i++ {
			start := time.Now()
			var old uint64
			if cas {
				old, err = c.CompareAndSwap(ctx, remote, 0, uint64(i), uint64(i+1))
			} else {
				old, err = c.FetchAdd(ctx, remote, 0, 1)
			}
			if err != nil {
				return nil, err
			}
			if old != uint64(i) {
				return nil, fmt.Errorf("operation %d returned %d, want %d", i, old, i)
			}
			ops = s.done(ops, i, start)
		}
		return durationSample(ops, 1), nil
	}
}

// atomicRate: FetchAdds posted with atomicDepth outstanding, their ends
// taken with RecvCompletion; millions of operations per second.
func atomicRate(s *Side) (*Sample, error) {
	c, remote, err := atomicPair(s)
	if err != nil || c == nil {
		return nil, err
	}
	ctx := context.Background()
	seen := make([]bool, s.Iters)
	next := func() error {
		oc, err := c.RecvCompletion(ctx)
		if err == nil {
			err = oc.Err
		}
		if err == nil && (oc.Value >= uint64(len(seen)) || seen[oc.Value]) {
			err = fmt.Errorf("fetch-and-add %d returned %d: out of range or twice", oc.ID, oc.Value)
		}
		if err == nil {
			seen[oc.Value] = true
		}
		return err
	}
	start := time.Now()
	if err := postWindowed(s.Iters, atomicDepth, func(i int) error { return c.PostFetchAdd(remote, 0, 1, uint64(i)) }, next); err != nil {
		return nil, err
	}
	el := time.Since(start)
	return &Sample{Value: float64(s.Iters) / el.Seconds() / 1e6}, nil
}
