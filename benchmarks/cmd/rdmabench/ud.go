//go:build linux

package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/verbline/rdma"
)

// Cases of unreliable datagrams (PacketConn), beside perftest's -c UD.
func init() {
	register(Case{Name: "ud-pingpong", Metric: Latency, Run: udPingPong, Packet: true, MaxSize: udMaxSize, Needs: needUD})
	register(Case{Name: "ud-msgrate", Metric: Rate, Run: udMsgRate, Packet: true, MaxSize: udMaxSize, Needs: needUD})
}

// udMaxSize is the largest size the UD cases and baselines run at: one
// packet of a 1024-byte MTU, less the PacketConn's 24-byte header (the
// latency sizes are 8 B, 64 B and 4 KiB: they run at the first two).
const udMaxSize = 1000

// udStop is the end of a run: a datagram of no bytes (the cases' sizes are
// at least 1).
var udStop = []byte{}

// udPingPong: the client writes Size bytes with WriteToAddrPort and reads
// the echo with ReadFromAddrPort, Iters times after Warmup untimed round
// trips (the first resolves the server's address); the server echoes to
// the address each datagram came from. No read deadline is set while
// timing (as conn-pingpong sets none: a pending deadline is a runtime timer,
// which makes the scheduler read the clock at every turn of a spinning
// wait; see internal/coarseclock): a datagram lost (none is expected on one
// host) hangs the run until the harness's -timeout kills it.
func udPingPong(s *Side) (*Sample, error) {
	p := s.Packet
	buf := make([]byte, 64<<10)
	if s.Server {
		for {
			n, from, err := p.ReadFromAddrPort(buf)
			if err != nil {
				return nil, fmt.Errorf("echo read: %w", err)
			}
			if _, err := p.WriteToAddrPort(buf[:n], from); err != nil {
				return nil, fmt.Errorf("echo write: %w", err)
			}
			if n == 0 {
				return nil, nil // the client's stop, echoed
			}
		}
	}
	msg := pattern(s.Size)
	rtts := make([]time.Duration, 0, s.Iters)
	for i := 0; i < s.Warmup+s.Iters; i++ {
		s.Slow.begin()
		start := time.Now()
		if _, err := p.WriteToAddrPort(msg, s.Peer); err != nil {
			return nil, fmt.Errorf("write: %w", err)
		}
		n, _, err := p.ReadFromAddrPort(buf)
		if err != nil {
			return nil, fmt.Errorf("read echo %d of %d (lost?): %w", i, s.Warmup+s.Iters, err)
		}
		if n != s.Size {
			return nil, fmt.Errorf("echo of %d bytes, want %d", n, s.Size)
		}
		rtts = s.done(rtts, i, start)
	}
	if err := udStopServer(p, s.Peer); err != nil {
		return nil, err
	}
	return latencySample(rtts), nil
}

// udStopServer sends the stop datagram until the server echoes it (a few
// tries: a lost stop must not hang the client, whose result is complete).
func udStopServer(p *rdma.PacketConn, server netip.AddrPort) error {
	buf := make([]byte, 64<<10)
	for try := 0; try < 20; try++ {
		if _, err := p.WriteToAddrPort(udStop, server); err != nil {
			return fmt.Errorf("write stop: %w", err)
		}
		p.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		for {
			n, _, err := p.ReadFromAddrPort(buf)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			if err != nil {
				return fmt.Errorf("read stop: %w", err)
			}
			if n == 0 {
				return nil
			}
		}
	}
	fmt.Fprintln(os.Stderr, "rdmabench child: the server never answered the stop datagram")
	return nil
}

// udMsgRate: after one untimed round trip (which resolves the addresses),
// the client writes Iters datagrams of Size (64) bytes with WriteToAddrPort
// as fast as they are taken, then the stop datagram. The rate is the
// sender's, as perftest's ib_send_bw -c UD reports it: datagrams posted per
// second from the first to the last. Nothing slows a UD sender down to its
// receiver: datagrams that find no receive posted are dropped, so the
// server counts what arrived, from the first to the stop, and answers the
// stop with that count and rate; the client reports them as the counters
// "delivered_Mmps" and "lost" (the fraction of datagrams that never
// arrived).
func udMsgRate(s *Side) (*Sample, error) {
	p := s.Packet
	buf := make([]byte, 64<<10)
	if s.Server {
		var got int
		var first time.Time
		for {
			n, from, err := p.ReadFromAddrPort(buf)
			if err != nil {
				return nil, fmt.Errorf("read after %d datagrams: %w", got, err)
			}
			switch {
			case n == 1 && got == 0: // the client's hello: answer it
				if _, err := p.WriteToAddrPort(buf[:1], from); err != nil {
					return nil, err
				}
				continue
			case n == s.Size:
				if got == 0 {
					first = time.Now()
				}
				got++
				continue
			case n != 0:
				return nil, fmt.Errorf("datagram of %d bytes, want %d", n, s.Size)
			}
			// The stop: answer with what arrived (again for each repeated stop).
			el := time.Since(first)
			rate := 0.0
			if got >= 2 && el > 0 {
				rate = float64(got-1) / el.Seconds() / 1e6
			}
			var report [16]byte
			binary.BigEndian.PutUint64(report[:], uint64(got))
			binary.BigEndian.PutUint64(report[8:], math.Float64bits(rate))
			if _, err := p.WriteToAddrPort(report[:], from); err != nil {
				return nil, err
			}
			// Linger for repeated stops (the report may be lost), then end.
			p.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			for {
				n, from, err := p.ReadFromAddrPort(buf)
				if err != nil {
					return nil, nil
				}
				if n == 0 {
					p.WriteToAddrPort(report[:], from)
				}
			}
		}
	}
	p.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := p.WriteToAddrPort([]byte{1}, s.Peer); err != nil {
		return nil, fmt.Errorf("hello: %w", err)
	}
	if _, _, err := p.ReadFromAddrPort(buf); err != nil {
		return nil, fmt.Errorf("hello answer: %w", err)
	}
	p.SetReadDeadline(time.Time{}) // no timer pending while timing
	msg := pattern(s.Size)
	start := time.Now()
	for i := 0; i < s.Iters; i++ {
		if _, err := p.WriteToAddrPort(msg, s.Peer); err != nil {
			return nil, fmt.Errorf("write %d of %d: %w", i, s.Iters, err)
		}
	}
	el := time.Since(start)
	for try := 0; ; try++ {
		if try == 20 {
			return nil, errors.New("the server never answered the stop datagram")
		}
		if _, err := p.WriteToAddrPort(udStop, s.Peer); err != nil {
			return nil, fmt.Errorf("write stop: %w", err)
		}
		p.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, _, err := p.ReadFromAddrPort(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read the server's report: %w", err)
		}
		if n != 16 {
			continue
		}
		got := binary.BigEndian.Uint64(buf)
		printCounters(map[string]float64{
			"delivered_Mmps": math.Float64frombits(binary.BigEndian.Uint64(buf[8:])),
			"lost":           1 - float64(got)/float64(s.Iters),
		})
		return &Sample{Value: float64(s.Iters) / el.Seconds() / 1e6}, nil
	}
}

// runPacketChild is runChild for a Packet case: each side opens a
// PacketConn on the RDMA address; the server prints "ready ADDR" and the
// client gets ADDR as the server's address.
func runPacketChild(serve bool, connect string, c Case, a childArgs, addr string, depth int, spin time.Duration) error {
	if a.network != "rdma" {
		return fmt.Errorf("case %s runs over RDMA only", c.Name)
	}
	lc := rdma.ListenConfig{Config: rdmaConfig(depth, spin)}
	p, err := lc.ListenPacket(context.Background(), "rdma", net.JoinHostPort(addr, "0"))
	if err != nil {
		return fmt.Errorf("listen packet: %w", err)
	}
	defer p.Close()
	side := &Side{Server: serve, Packet: p, Size: a.size, Iters: a.iters, Warmup: a.warmup}
	if serve {
		fmt.Printf("ready %s\n", p.LocalAddr())
	} else if side.Peer, err = netip.ParseAddrPort(connect); err != nil {
		return fmt.Errorf("server address: %w", err)
	} else if c.Metric == Latency {
		if side.Slow, err = newSlowLog(c.Name, a.size, nil); err != nil {
			return err
		}
		defer side.Slow.close()
	}
	stop, err := startProfile(serve)
	if err != nil {
		return err
	}
	defer stop()
	before := p.Stats()
	csw0, _ := ctxSwitches()
	s, err := c.Run(side)
	if err != nil {
		return err
	}
	m := perDatagram(before, p.Stats(), a.iters+a.warmup)
	csw1, thr1 := ctxSwitches()
	n := float64(max(1, a.iters+a.warmup))
	m["ctx_switches_voluntary"] = (csw1[0] - csw0[0]) / n
	m["ctx_switches_involuntary"] = (csw1[1] - csw0[1]) / n
	m["threads"] = thr1
	printCounters(m)
	if s != nil {
		printResult(s)
	}
	return nil
}

// perDatagram is perMessage for a PacketConn's counters.
func perDatagram(a, b rdma.PacketStats, n int) map[string]float64 {
	if n <= 0 {
		n = 1
	}
	d := func(x, y uint64) float64 { return float64(y-x) / float64(n) }
	polls := d(a.InlinePolls, b.InlinePolls) + d(a.PollCalls, b.PollCalls)
	empty := d(a.EmptyPolls, b.EmptyPolls)
	return map[string]float64{
		"send_doorbells": d(a.SendPosts, b.SendPosts),
		"recv_doorbells": d(a.RecvPosts, b.RecvPosts),
		"send_wrs":       d(a.SendWRs, b.SendWRs),
		"signaled":       d(a.Signaled, b.Signaled),
		"inlined":        d(a.Inlined, b.Inlined),
		"completions":    d(a.Completions, b.Completions),
		"caller_polls":   d(a.InlinePolls, b.InlinePolls),
		"poller_polls":   d(a.PollCalls, b.PollCalls),
		"poller_wakeups": d(a.PollerWakeups, b.PollerWakeups),
		"parks":          d(a.Parks, b.Parks),
		"arms":           d(a.Arms, b.Arms),
		"cgo_work":       d(a.SendPosts, b.SendPosts) + d(a.RecvPosts, b.RecvPosts) + polls - empty,
		"cgo_empty":      empty + d(a.Arms, b.Arms),
		"dropped":        d(a.Dropped, b.Dropped),
		"resolutions":    float64(b.Resolutions - a.Resolutions),
	}
}
