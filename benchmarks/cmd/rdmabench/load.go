//go:build linux

package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/verbline/rdma"
)

// Request/response workloads over net.Conn (ours or TCP): Conns connections,
// each with requests of sizes drawn from Req answered by responses of sizes
// drawn from Resp. A request is an 8-byte header (request and response
// lengths, big-endian uint32) and the payload, in one Write; the server
// answers with one Write of the response length.
//
// Closed loop (Rate 0): InFlight requests outstanding per connection; a new
// one is sent as soon as a response arrives. Latency runs from the send.
//
// Open loop (Rate > 0): requests are scheduled at Rate per second over all
// connections (request k at start + k/Rate, connection k mod Conns), sent
// at their scheduled time or as soon after as the connection lets; latency
// runs from the scheduled time, so a stall that delays later sends counts
// in their latency instead of vanishing (coordinated omission).
type loadSpec struct {
	Conns, InFlight int
	Req, Resp       *sizeDist
	Duration        time.Duration // stop issuing after this (with Count 0)
	Count           int           // total requests (0: run for Duration)
	Rate            float64       // open loop: requests per second; 0: closed loop
	Seed            uint64
	View            string              // "conn" (Write and Read, the default) or "msg" (the message view: Alloc/Send, Recv/Release; our Conn only)
	Progress        func(progressPoint) // called once a second while running (may be nil)
}

// openLoopMaxInFlight bounds a connection's outstanding requests in open
// loop, so that a dead server cannot make the client buffer forever.
const openLoopMaxInFlight = 4096

type progressPoint struct {
	T        float64 `json:"t_s"`
	Requests uint64  `json:"requests"`
	Rate     float64 `json:"req_per_s"`
	latencySummary
}

type loadResult struct {
	Mode       string          `json:"mode"` // "closed" or "open"
	Conns      int             `json:"conns"`
	InFlight   int             `json:"in_flight,omitempty"`
	TargetRate float64         `json:"target_req_per_s,omitempty"`
	Req        string          `json:"req_sizes"`
	Resp       string          `json:"resp_sizes"`
	Requests   uint64          `json:"requests"`
	Elapsed    float64         `json:"elapsed_s"`
	Throughput float64         `json:"req_per_s"`
	MBps       float64         `json:"MBps"` // request and response payload bytes per second, MB = 10^6 B
	Latency    latencySummary  `json:"latency"`
	Bins       [][2]float64    `json:"histogram"` // (bucket upper bound µs, count)
	Progress   []progressPoint `json:"progress"`
}

// loadRecorder collects latencies from every connection.
type loadRecorder struct {
	mu       sync.Mutex
	all, win *hist
	n, bytes uint64
	winN     uint64
}

func (r *loadRecorder) add(d time.Duration, bytes int) {
	r.mu.Lock()
	r.all.record(d)
	r.win.record(d)
	r.n++
	r.winN++
	r.bytes += uint64(bytes)
	r.mu.Unlock()
}

// tick closes the current one-second window.
func (r *loadRecorder) tick(t float64, span time.Duration) progressPoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := progressPoint{T: t, Requests: r.winN, Rate: float64(r.winN) / span.Seconds(), latencySummary: r.win.summary()}
	r.win, r.winN = newHist(), 0
	return p
}

func (s *loadSpec) check() error {
	switch {
	case s.Conns < 1:
		return errors.New("-load-conns must be at least 1")
	case s.Rate == 0 && s.InFlight < 1:
		return errors.New("-load-inflight must be at least 1")
	case s.Rate < 0:
		return errors.New("-load-rate must not be negative")
	case s.Count <= 0 && s.Duration <= 0:
		return errors.New("give -load-count or -load-duration")
	case s.Req.maxSize() > 1<<30 || s.Resp.maxSize() > 1<<30:
		return errors.New("sizes above 1 GiB")
	case s.View != "" && s.View != "conn" && s.View != "msg" && s.View != "write":
		return fmt.Errorf("-load-view %q: conn, msg or write", s.View)
	}
	return nil
}

// runLoad runs the client side: it dials Conns connections and drives them.
func runLoad(ctx context.Context, dial func(context.Context) (net.Conn, error), s loadSpec) (*loadResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	conns := make([]net.Conn, 0, s.Conns)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < s.Conns; i++ {
		c, err := dial(ctx)
		if err != nil {
			return nil, fmt.Errorf("dial connection %d of %d: %w", i+1, s.Conns, err)
		}
		conns = append(conns, c)
	}
	rec := &loadRecorder{all: newHist(), win: newHist()}
	res := &loadResult{Mode: "closed", Conns: s.Conns, InFlight: s.InFlight, Req: s.Req.String(), Resp: s.Resp.String()}
	if s.Rate > 0 {
		res.Mode, res.InFlight, res.TargetRate = "open", 0, s.Rate
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	// Progress, once a second.
	progDone := make(chan struct{})
	go func() {
		defer close(progDone)
		tk := time.NewTicker(time.Second)
		defer tk.Stop()
		last := start
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tk.C:
				p := rec.tick(now.Sub(start).Seconds(), now.Sub(last))
				last = now
				res.Progress = append(res.Progress, p)
				if s.Progress != nil {
					s.Progress(p)
				}
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make([]error, len(conns))
	for i, c := range conns {
		share := 0
		if s.Count > 0 {
			share = s.Count / s.Conns
			if i < s.Count%s.Conns {
				share++
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := driveConn(ctx, c, i, share, start, s, rec); err != nil {
				errs[i] = fmt.Errorf("connection %d: %w", i+1, err)
				cancel()
				for _, c := range conns {
					c.Close() // unblock the others
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	cancel()
	<-progDone
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	res.Requests, res.Elapsed = rec.n, el.Seconds()
	res.Throughput = float64(rec.n) / el.Seconds()
	res.MBps = float64(rec.bytes) / el.Seconds() / 1e6
	res.Latency, res.Bins = rec.all.summary(), rec.all.histBins()
	return res, nil
}

type pending struct {
	t    time.Time // send time (closed loop) or scheduled time (open loop)
	resp int
	req  int
}

// driveConn runs connection idx: a writer (this goroutine) and a reader.
// share is its number of requests (0: until the duration has passed).
func driveConn(ctx context.Context, c net.Conn, idx, share int, start time.Time, s loadSpec, rec *loadRecorder) error {
	depth := s.InFlight
	if s.Rate > 0 {
		depth = openLoopMaxInFlight
	}
	// How a request is sent and its response received, by view.
	buf := make([]byte, max(s.Resp.maxSize(), 1))
	send := func(_ int, b []byte) error { _, err := c.Write(b); return err }
	recv := func(_, n int) error { _, err := io.ReadFull(c, buf[:n]); return err }
	rc, ours := c.(*rdma.Conn)
	if !ours && (s.View == "msg" || s.View == "write") {
		return fmt.Errorf("-load-view %s needs our Conn (-load-net rdma)", s.View)
	}
	switch s.View {
	case "msg":
		send = func(_ int, b []byte) error {
			m, err := rc.Alloc(len(b))
			if err != nil {
				return err
			}
			copy(m.Bytes(), b)
			return rc.Send(ctx, m)
		}
		recv = func(_, n int) error {
			m, err := rc.Recv(ctx)
			if err != nil {
				return err
			}
			defer m.Release()
			if m.Len() != n {
				return fmt.Errorf("response of %d bytes, want %d", m.Len(), n)
			}
			return nil
		}
	case "write":
		if s.Rate > 0 {
			depth = writeSlotsOpenLoop
		}
		w, err := newWriteClient(rc, depth, s.Req.maxSize(), s.Resp.maxSize())
		if err != nil {
			return err
		}
		defer w.close()
		send = func(i int, b []byte) error { return w.send(ctx, i, b) }
		recv = func(i, _ int) error { return w.recv(ctx, i) }
	}
	q := make(chan pending, depth)
	slots := make(chan struct{}, depth)
	readErr := make(chan error, 1)
	readFailed := make(chan struct{})
	go func() {
		k := 0
		for p := range q {
			if err := recv(k, p.resp); err != nil {
				readErr <- fmt.Errorf("read response: %w", err)
				close(readFailed)
				for range q { // let the writer finish
					<-slots
				}
				return
			}
			k++
			rec.add(time.Since(p.t), p.req+p.resp)
			<-slots
		}
		readErr <- nil
	}()
	rng := rand.New(rand.NewPCG(s.Seed, uint64(idx)))
	msg := pattern(8 + s.Req.maxSize())
	var interval time.Duration
	if s.Rate > 0 {
		interval = time.Duration(float64(time.Second) / s.Rate)
	}
	end := start.Add(s.Duration)
	var werr error
	for i := 0; share == 0 || i < share; i++ {
		var t time.Time
		if s.Rate > 0 {
			// Request k = i*Conns + idx of the whole schedule.
			t = start.Add(time.Duration(i*s.Conns+idx) * interval)
			if share == 0 && !t.Before(end) {
				break
			}
			if d := time.Until(t); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
				case <-readFailed:
				}
			}
		} else if share == 0 && !time.Now().Before(end) {
			break
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		case <-readFailed:
		}
		if ctx.Err() != nil || isClosed(readFailed) {
			break
		}
		req, resp := s.Req.next(rng), s.Resp.next(rng)
		binary.BigEndian.PutUint32(msg[0:4], uint32(req))
		binary.BigEndian.PutUint32(msg[4:8], uint32(resp))
		if s.Rate == 0 {
			t = time.Now()
		}
		q <- pending{t: t, resp: resp, req: req}
		if err := send(i, msg[:8+req]); err != nil {
			werr = fmt.Errorf("write request %d: %w", i, err)
			break
		}
	}
	close(q)
	rerr := <-readErr
	if werr != nil {
		return werr
	}
	if rerr != nil {
		return rerr
	}
	return ctx.Err()
}

// serveLoad answers requests on c until the client closes it.
func serveLoad(c net.Conn) error {
	var hdr [8]byte
	var buf, resp []byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("read request header: %w", err)
		}
		req, rl := binary.BigEndian.Uint32(hdr[0:4]), binary.BigEndian.Uint32(hdr[4:8])
		if req > 1<<30 || rl > 1<<30 {
			return fmt.Errorf("request of %d bytes asks for %d: not an rdmabench load client", req, rl)
		}
		if cap(buf) < int(req) {
			buf = make([]byte, req)
		}
		if _, err := io.ReadFull(c, buf[:req]); err != nil {
			return fmt.Errorf("read request: %w", err)
		}
		if cap(resp) < int(rl) {
			resp = pattern(int(rl))
		}
		if _, err := c.Write(resp[:rl]); err != nil {
			return fmt.Errorf("write response: %w", err)
		}
	}
}

// serveLoadMsg is serveLoad over the message view: each request is one
// message, answered by one message.
func serveLoadMsg(c *rdma.Conn) error {
	ctx := context.Background()
	for {
		m, err := c.Recv(ctx)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("recv request: %w", err)
		}
		b := m.Bytes()
		if len(b) < 8 {
			m.Release()
			return fmt.Errorf("request of %d bytes: no header", len(b))
		}
		req, rl := binary.BigEndian.Uint32(b[0:4]), binary.BigEndian.Uint32(b[4:8])
		m.Release()
		if int(req) != len(b)-8 || rl > 1<<30 {
			return fmt.Errorf("request of %d bytes says %d and asks for %d: not an rdmabench load client", len(b), req, rl)
		}
		r, err := c.Alloc(int(rl))
		if err != nil {
			return err
		}
		if err := c.Send(ctx, r); err != nil {
			return fmt.Errorf("send response: %w", err)
		}
	}
}

// serveLoadListener serves every connection ln accepts until it is closed,
// over view ("msg": the message view, else Read and Write).
func serveLoadListener(ln net.Listener, view string, logf func(string, ...any)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			serve := serveLoad
			if rc, ok := c.(*rdma.Conn); ok && view == "msg" {
				serve = func(net.Conn) error { return serveLoadMsg(rc) }
			} else if ok && view == "write" {
				serve = func(net.Conn) error { return serveLoadWrite(rc) }
			}
			if err := serve(c); err != nil && logf != nil {
				logf("load server: %v", err)
			}
		}()
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
