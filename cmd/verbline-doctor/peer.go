package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"sync"
	"syscall"
	"time"

	cerrors "github.com/cockroachdb/errors"

	"github.com/verbline/rdma"
)

// warmup round trips are run before the measured ones (the first ones pay
// for the pollers' and the connection's first use).
const warmup = 10

// LatencyData is the -peer check's figures in -json output.
type LatencyData struct {
	Addr      string  `json:"addr"`
	Count     int     `json:"count"`
	Size      int     `json:"size"`
	ConnectMS float64 `json:"connect_ms"`
	MedianUS  float64 `json:"median_us"`
	MeanUS    float64 `json:"mean_us"`
	P99US     float64 `json:"p99_us"`
	MinUS     float64 `json:"min_us"`
	MaxUS     float64 `json:"max_us"`
	// PinnedBytes is the kernel's count of this process's pinned memory
	// (VmPin) with the connection open; EstimateBytes is what the memlock
	// check estimates for one connection.
	PinnedBytes   int64 `json:"pinned_bytes"`
	EstimateBytes int64 `json:"estimate_bytes"`
}

// checkPeer dials a verbline listener that echoes (verbline-doctor -listen)
// and times count ping-pongs of size bytes over the stream view.
func checkPeer(addr string, count, msgSize int, timeout time.Duration) Result {
	name := "peer " + addr
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d := rdma.Dialer{Timeout: timeout}
	start := time.Now()
	nc, err := d.DialContext(ctx, "rdma", addr)
	if err != nil {
		return problem(Fail, name, "dial: "+err.Error(), dialFix(err, addr))
	}
	defer nc.Close()
	connect := time.Since(start)
	nc.SetDeadline(time.Now().Add(timeout))
	data := LatencyData{Addr: addr, Count: count, Size: msgSize, ConnectMS: ms(connect), EstimateBytes: pinnedBytes(1)}
	data.PinnedBytes, _ = vmPin("/")

	out, in := make([]byte, msgSize), make([]byte, msgSize)
	rtts := make([]time.Duration, 0, count)
	for i := -warmup; i < count; i++ {
		for j := range out {
			out[j] = byte(i + j)
		}
		t0 := time.Now()
		if _, err := nc.Write(out); err != nil {
			return problem(Fail, name, fmt.Sprintf("write after %d round trips: %v", i+warmup, err), pingFix(err))
		}
		if _, err := io.ReadFull(nc, in); err != nil {
			return problem(Fail, name, fmt.Sprintf("read after %d round trips: %v", i+warmup, err), pingFix(err))
		}
		rtt := time.Since(t0)
		if !bytes.Equal(in, out) {
			return problem(Fail, name, fmt.Sprintf("round trip %d came back different from what was sent", i+warmup),
				"the listener must echo (verbline-doctor -listen); if it does, report this as a bug with `dmesg` from both sides")
		}
		if i >= 0 {
			rtts = append(rtts, rtt)
		}
	}
	sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
	var sum time.Duration
	for _, r := range rtts {
		sum += r
	}
	data.MedianUS = us(median(rtts))
	data.MeanUS = us(sum / time.Duration(len(rtts)))
	data.P99US = us(rtts[(len(rtts)*99+99)/100-1])
	data.MinUS, data.MaxUS = us(rtts[0]), us(rtts[len(rtts)-1])
	r := ok(name, "%d round trips of %d B: median %.1f µs, mean %.1f µs, p99 %.1f µs (min %.1f, max %.1f); connected in %.1f ms; "+
		"this process pins %s with it open (VmPin; the memlock estimate for one connection: %s)",
		count, msgSize, data.MedianUS, data.MeanUS, data.P99US, data.MinUS, data.MaxUS, data.ConnectMS,
		size(data.PinnedBytes), size(data.EstimateBytes))
	r.Data = data
	return r
}

func median(s []time.Duration) time.Duration {
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// dialFix says what to do about a failed dial.
func dialFix(err error, addr string) string {
	switch {
	case errors.Is(err, rdma.ErrNoDevice):
		return "this machine cannot run RDMA: see the devices, rdma_cm and uverbs checks above"
	case errors.Is(err, rdma.ErrNotRDMAAddress):
		return "the route to " + addr + " must leave through an RDMA netdev: use the peer's IP on its RDMA netdev\n" +
			libraryHint(err, "(`rdma link show` lists them)")
	case errors.Is(err, rdma.ErrMemlock):
		return libraryHint(err, memlockFix)
	case errors.Is(err, syscall.ECONNREFUSED):
		return "nothing listens there: start `verbline-doctor -listen " + addr + "` on the peer (or your service)"
	case errors.Is(err, rdma.ErrHandshake):
		return "the listener is not a verbline listener of a compatible version"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), isTimeout(err):
		return "no answer in time: check that the peer's address is reachable through the RDMA netdevs on both sides (ping it) and that a listener runs there, or raise -timeout"
	}
	return "check the checks above on both machines and the kernel log (dmesg)"
}

// libraryHint is the hint the library attached to err (what to do on
// this machine: its RDMA addresses, its memlock limit), or fallback.
func libraryHint(err error, fallback string) string {
	if h := cerrors.FlattenHints(err); h != "" {
		return h
	}
	return fallback
}

func pingFix(err error) string {
	if isTimeout(err) {
		return "the echo stalled: check the link and the peer (rdma statistic show on both sides), or raise -timeout"
	}
	return "the connection broke: check the peer's log and the kernel log (dmesg) on both sides"
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// echoServer echoes every connection of ln until ln is closed; close stops
// it and waits for the connections to end.
type echoServer struct {
	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	closed bool // guarded by mu, as conns
	conns  map[net.Conn]bool
}

func newEchoServer(ln net.Listener) *echoServer {
	s := &echoServer{ln: ln, conns: map[net.Conn]bool{}}
	s.wg.Add(1)
	go s.serve()
	return s
}

func (s *echoServer) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			io.Copy(c, c)
			c.Close()
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

func (s *echoServer) close() {
	s.ln.Close()
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}
