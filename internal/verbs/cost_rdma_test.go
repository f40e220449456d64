//go:build linux && cgo

package verbs

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"

	"golang.org/x/sys/unix"
)

// The costs below are what the library's data path is made of, measured
// one by one so that a ping-pong's time can be accounted for
// (docs/performance.md). Run them where a device is, e.g.
//
//	scripts/softroce run -- .build/verbs.test -test.run '^$' -test.bench Cost -test.benchtime 20000x
//
// A crossing into C is BenchmarkCostPollEmpty less BenchmarkCostPollTries's
// per-poll cost. Each runs twice: through cgo ("cgo") and through the fast
// calls the data path uses ("fast", fastcall.go).

// bothCalls runs f as sub-benchmarks through cgo and through fast calls.
func bothCalls(b *testing.B, f func(b *testing.B)) {
	for _, fast := range []bool{false, true} {
		name := map[bool]string{false: "cgo", true: "fast"}[fast]
		b.Run(name, func(b *testing.B) {
			old := SetFastCalls(fast)
			defer SetFastCalls(old)
			f(b)
		})
	}
}

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
func BenchmarkCostPollEmpty(b *testing.B) { bothCalls(b, costPollEmpty) }

func costPollEmpty(b *testing.B) {
	cq := costCQ(b)
	wcs := make([]WC, 16)
	b.ResetTimer()
	for range b.N {
		cq.Poll(wcs)
	}
}

// BenchmarkCostPollTries: polls of an empty CQ inside one cgo call, per poll.
func BenchmarkCostPollTries(b *testing.B) { bothCalls(b, costPollTries) }

func costPollTries(b *testing.B) {
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
func BenchmarkCostPingPong(b *testing.B) { bothCalls(b, costPingPong) }

func costPingPong(b *testing.B) {
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

// BenchmarkCostPingPongThreads: the floor for a Go ping-pong. Two QPs of
// one process, each side a goroutine locked to its own thread and pinned
// to its own CPU (as perftest's two processes are), busy-polling its own
// CQ, reposting the receive and answering in one call into C, signaling
// one send in 16: what a Go program pays per round trip with no library
// logic (locks, credits, waiters) on the path. One op is a round trip;
// divide by 2 for perftest's one-way figure. Needs 2 CPUs.
func BenchmarkCostPingPongThreads(b *testing.B) { bothCalls(b, costPingPongThreads) }

func costPingPongThreads(b *testing.B) {
	if runtime.NumCPU() < 2 {
		b.Skip("needs 2 CPUs")
	}
	ctx, port, dev, gid := testDevice(b)
	lim := port.Limits(dev)
	pd, err := ctx.AllocPD()
	if err != nil {
		b.Fatal(err)
	}
	defer pd.Close()
	mem := make([]byte, 4*4096)
	mr, err := pd.RegMR(mem, AccessLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	defer mr.Close()
	type side struct {
		cq  *CQ
		qp  *QP
		buf uint64 // send buffer; the receive buffer follows it
	}
	sides := make([]side, 2)
	for i := range sides {
		cq, err := ctx.CreateCQ(64, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer cq.Close()
		qp, err := pd.CreateQP(QPConfig{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, SendWR: 64, RecvWR: 64, InlineData: 64})
		if err != nil {
			b.Fatal(err)
		}
		defer qp.Close()
		sides[i] = side{cq: cq, qp: qp, buf: mr.Addr() + uint64(i)*8192}
	}
	connectPair(b, QPTypeRC, port, lim, gid, sides[0].qp, sides[1].qp)
	recvWR := func(s side) []RecvWR {
		return []RecvWR{{WRID: 2, Addr: s.buf + 4096, Len: 4096, LKey: mr.LKey}}
	}
	for _, s := range sides {
		if err := s.qp.PostRecv(recvWR(s)); err != nil {
			b.Fatal(err)
		}
	}
	n := b.N
	// run is one side: the client (first) sends first; each waits for the
	// other's message, reposts the receive with its reply.
	run := func(s side, cpu int, first bool, errc chan<- error) {
		runtime.LockOSThread()
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			errc <- err
			return
		}
		wcs := make([]WC, 16)
		recvs := recvWR(s)
		// COST_PHASE_LABELS=1 with -test.cpuprofile: label samples by
		// phase, so that the time inside C (runtime._ExternalCode, no Go
		// stack) splits into posting and polling (go tool pprof -tags).
		label := func(string) {}
		if os.Getenv("COST_PHASE_LABELS") != "" {
			ctxs := map[string]context.Context{}
			for _, p := range []string{"send", "recv"} {
				ctxs[p] = pprof.WithLabels(context.Background(), pprof.Labels("phase", p))
			}
			label = func(p string) { pprof.SetGoroutineLabels(ctxs[p]) }
		}
		send := []SendWR{{WRID: 1, Addr: s.buf, Len: 64, LKey: mr.LKey, Opcode: OpSend}}
		post := func(i int, withRecv bool) error {
			send[0].Flags = SendInline
			if i%16 == 15 {
				send[0].Flags |= SendSignaled
			}
			if withRecv {
				_, err := s.qp.PostRecvSend(recvs, send)
				return err
			}
			return s.qp.PostSend(send)
		}
		if first {
			if err := post(0, false); err != nil {
				errc <- err
				return
			}
		}
		for i := 0; i < n; i++ {
			label("recv")
			for got := false; !got; {
				k, err := s.cq.PollTries(wcs, 16)
				if err != nil {
					errc <- err
					return
				}
				for _, wc := range wcs[:k] {
					if err := wc.Err(); err != nil {
						errc <- err
						return
					}
					got = got || wc.WRID == 2
				}
			}
			if first && i == n-1 {
				break // the last reply arrived
			}
			label("send")
			if err := post(i+1, true); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}
	errc := make(chan error, 2)
	b.ResetTimer()
	go run(sides[1], 0, false, errc)
	go run(sides[0], 1, true, errc)
	for range 2 {
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCostRegister: registering a region of memory already touched
// (its pages present) and deregistering it, with local access only, as the
// buffer pool registers an arena (4 MiB by default) and as a large message
// or an export gets a registration of exactly its bytes where windows
// cannot bound an access. It is what isolating keys per connection without
// memory windows would cost: a protection domain per connection, with
// every buffer its queue pair touches registered in it (docs/devices.md).
func BenchmarkCostRegister(b *testing.B) {
	for _, n := range []int{64 << 10, 1 << 20, 4 << 20} {
		b.Run(fmt.Sprintf("%dKiB", n>>10), func(b *testing.B) {
			ctx, _ := openTestDevice(b)
			pd, err := ctx.AllocPD()
			must(b, err)
			defer pd.Close()
			mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
			must(b, err)
			defer unix.Munmap(mem)
			for i := 0; i < n; i += os.Getpagesize() {
				mem[i] = 1
			}
			b.SetBytes(int64(n))
			b.ResetTimer()
			for range b.N {
				mr, err := pd.RegMR(mem, AccessLocalWrite)
				must(b, err)
				must(b, mr.Close())
			}
		})
	}
}
