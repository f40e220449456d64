//go:build linux && cgo

package faults

import (
	"context"
	"os"
	"fmt"
	"testing"
	"time"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/rdmatest/twoguest"
)

func init() {
	peerRoles["reader"] = func(ctx context.Context, addr string) (any, error) {
		return withConn(ctx, addr, func(c *rdma.Conn) (any, error) {
			m, err := c.Recv(ctx)
			if err != nil {
				return nil, err
			}
			r, err := rdma.ParseRemoteBuf(m.Bytes())
			m.Release()
			if err != nil {
				return nil, err
			}
			local, _ := c.Alloc(64 << 10)
			defer local.Release()
			for i := 0; i < 100; i++ {
				rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				start := time.Now()
				err := c.ReadRemote(rctx, local, r, uint64(i%16)*(64<<10))
				cancel()
				fmt.Printf("read %d: %v after %v\n", i, err, time.Since(start).Round(time.Millisecond))
				if err != nil {
					return nil, err
				}
			}
			return "ok", nil
		})
	}
}

func init() {
	peerRoles["reader8"] = func(ctx context.Context, addr string) (any, error) {
		return withConn(ctx, addr, func(c *rdma.Conn) (any, error) {
			m, err := c.Recv(ctx)
			if err != nil {
				return nil, err
			}
			r, err := rdma.ParseRemoteBuf(m.Bytes())
			m.Release()
			if err != nil {
				return nil, err
			}
			var locals []bufT
			for i := 0; i < 8; i++ {
				l, _ := c.Alloc(64 << 10)
				locals = append(locals, l)
			}
			for round := 0; round < 30; round++ {
				start := time.Now()
				for i, l := range locals {
					if err := c.PostReadRemote(l, r, uint64(i)*(64<<10), uint64(i)); err != nil {
						return nil, err
					}
				}
				for range locals {
					select {
					case oc := <-c.Completions():
						if oc.Err != nil {
							return nil, oc.Err
						}
					case <-time.After(20 * time.Second):
						fmt.Printf("round %d: completions stuck\n", round)
						return nil, fmt.Errorf("round %d stuck", round)
					}
				}
				fmt.Printf("round %d: %v\n", round, time.Since(start).Round(time.Millisecond))
			}
			return "ok", nil
		})
	}
}

type bufT = buffer.Buf

func TestExpReadRemote(t *testing.T) {
	env := twoguest.Require(t)
	ln := listenWith(t, env, lossyConfig())
	env.Netem(t, lossy...)
	p := startPeer(t, env, os.Getenv("FAULTS_EXP_ROLE"), "lossy", ln)
	c := accept(t, ln, p, time.Minute)
	defer c.Close()
	b, _ := c.Alloc(1 << 20)
	defer b.Release()
	exp, err := c.Export(b, rdma.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Close()
	d, _ := c.Alloc(64)
	n := copy(d.Bytes(), exp.Remote().AppendTo(nil))
	_ = n
	d2, _ := c.Alloc(len(exp.Remote().AppendTo(nil)))
	copy(d2.Bytes(), exp.Remote().AppendTo(nil))
	d.Release()
	if err := c.Send(context.Background(), d2); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	st, err := p.Wait(ctx)
	t.Logf("%v %v\n%s", st, err, st.Output)
}
