//go:build linux && cgo

package verbs

import (
	"testing"
)

// The costs below are what the library's data path is made of, measured
// one by one so that a ping-pong's time can be accounted for (README,
// "Where the remaining time goes"). Run them where a device is, e.g.
//
//	scripts/softroce run -- .build/verbs.test -test.run '^$' -test.bench Cost -test.benchtime 20000x
//
// A cgo crossing is BenchmarkCostPollEmpty less BenchmarkCostPollTries's
// per-poll cost.

func costCQ(b *testing.B) *CQ {
	ctx, _, _, _ := testDevice(b)
	cq, err := ctx.CreateCQ(64, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cq.Close() })
	return cq
}

// BenchmarkCostPollEmpty: one cgo call that polls an empty CQ once.
func BenchmarkCostPollEmpty(b *testing.B) {
	cq := costCQ(b)
	wcs := make([]WC, 16)
	b.ResetTimer()
	for range b.N {
		cq.Poll(wcs)
	}
}

// BenchmarkCostPollTries: polls of an empty CQ inside one cgo call, per poll.
func BenchmarkCostPollTries(b *testing.B) {
	cq := costCQ(b)
	wcs := make([]WC, 16)
	const tries = 1000
	b.ResetTimer()
	for i := 0; i < b.N; i += tries {
		cq.PollTries(wcs, tries)
	}
}

// BenchmarkCostPingPong: a 64-byte RC send each way between two QPs of one
// process, one thread doing both sides' work (post receive, post send, poll
// until both completions) through the same cgo calls the library makes: the
// cost of a round trip without Go's scheduler, channels or locks.
func BenchmarkCostPingPong(b *testing.B) {
	ctx, port, dev, gid := testDevice(b)
	lim := port.Limits(dev)
	pd, err := ctx.AllocPD()
	if err != nil {
		b.Fatal(err)
	}
	defer pd.Close()
	mem := make([]byte, 8192)
	mr, err := pd.RegMR(mem, AccessLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	defer mr.Close()
	cq, err := ctx.CreateCQ(64, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer cq.Close()
	cfg := QPConfig{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, SendWR: 16, RecvWR: 16}
	a, err := pd.CreateQP(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	c, err := pd.CreateQP(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	connectPair(b, QPTypeRC, port, lim, gid, a, c)
	wcs := make([]WC, 16)
	oneWay := func(from, to *QP) {
		if err := to.PostRecv([]RecvWR{{WRID: 2, Addr: mr.Addr() + 4096, Len: 4096, LKey: mr.LKey}}); err != nil {
			b.Fatal(err)
		}
		if err := from.PostSend([]SendWR{{WRID: 1, Addr: mr.Addr(), Len: 64, LKey: mr.LKey,
			Opcode: OpSend, Flags: SendSignaled}}); err != nil {
			b.Fatal(err)
		}
		for got := 0; got < 2; {
			n, err := cq.Poll(wcs)
			if err != nil {
				b.Fatal(err)
			}
			for _, wc := range wcs[:n] {
				if err := wc.Err(); err != nil {
					b.Fatal(err)
				}
			}
			got += n
		}
	}
	b.ResetTimer()
	for range b.N {
		oneWay(a, c)
		oneWay(c, a)
	}
}
