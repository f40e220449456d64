//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// rstream (rdma-core's rdmacm-utils) measures rsockets, rdma_cm's socket
// API over RDMA, with a pattern of its own: after a 16-byte exchange each
// way, the client sends count transfers of size bytes and the server, once
// it has them all, sends count back; that repeats iterations times. Its
// latency test is one transfer each way per iteration; its bandwidth test
// one iteration of many transfers. It reports microseconds per transfer:
// the time over iterations x count x 2 transfers. The rstream metrics run
// that tool (the "rstream" column) beside conn-rstream-lat and
// conn-rstream-bw, the same pattern over a Conn's stream, and over TCP.
func init() {
	register(Case{Name: "conn-rstream-lat", Metric: RStreamLatency, Run: rstreamPattern(RStreamLatency), TCP: true})
	register(Case{Name: "conn-rstream-bw", Metric: RStreamBandwidth, Run: rstreamPattern(RStreamBandwidth), TCP: true})
}

// rstreamShape is the iterations and the transfers per iteration of a run
// of m with n transfers each way, as rstream's tests shape them.
func rstreamShape(m Metric, n int) (iterations, count int) {
	if m == RStreamLatency {
		return n, 1
	}
	return 1, n
}

// rstreamArgs is rstream's command line for a run of m at size with n
// transfers each way, but for the port and the address (its custom mode:
// -S, -C and -I given; non-blocking calls that spin, its default).
func rstreamArgs(m Metric, size, n int) []string {
	iterations, count := rstreamShape(m, n)
	return []string{"rstream", "-S", strconv.Itoa(size), "-C", strconv.Itoa(count), "-I", strconv.Itoa(iterations)}
}

// rstreamSample turns a run's time for n transfers each way of size bytes
// into m's value: the mean one-way time of a transfer in µs, or its rate
// in MB/s (10^6 bytes), both directions' transfers counted, as rstream
// counts them.
func rstreamSample(m Metric, size, n int, el time.Duration) *Sample {
	return perXferSample(m, size, float64(el)/float64(time.Microsecond)/float64(2*n))
}

// perXferSample is m's value from the time of one transfer of size bytes,
// in µs, as rstream reports it (usec/xfer).
func perXferSample(m Metric, size int, perXfer float64) *Sample {
	if m == RStreamLatency {
		return &Sample{Value: perXfer, Avg: perXfer}
	}
	return &Sample{Value: float64(size) / perXfer}
}

// rstreamPattern is conn-rstream-lat and -bw: rstream's pattern over s.Conn, s.Iters
// transfers each way. The client measures; the server reads until the
// client closes.
func rstreamPattern(m Metric) func(s *Side) (*Sample, error) {
	return func(s *Side) (*Sample, error) {
		iterations, count := rstreamShape(m, s.Iters)
		buf := pattern(s.Size)
		client := !s.Server
		xfer := func(b []byte, send bool) error {
			if send {
				phase(phaseSend)
				_, err := s.Conn.Write(b)
				return err
			}
			phase(phaseRecv)
			_, err := io.ReadFull(s.Conn, b)
			return err
		}
		sync := make([]byte, 16)
		if err := xfer(sync, client); err != nil {
			return nil, fmt.Errorf("sync: %w", err)
		}
		if err := xfer(sync, !client); err != nil {
			return nil, fmt.Errorf("sync: %w", err)
		}
		start := time.Now()
		for i := range iterations {
			for range count {
				if err := xfer(buf, client); err != nil {
					return nil, fmt.Errorf("iteration %d, the client's transfers: %w", i, err)
				}
			}
			for range count {
				if err := xfer(buf, !client); err != nil {
					return nil, fmt.Errorf("iteration %d, the server's transfers: %w", i, err)
				}
			}
		}
		el := time.Since(start)
		if s.Server {
			if n, err := s.Conn.Read(sync); err != io.EOF {
				if err == nil {
					return nil, fmt.Errorf("after the last transfer: %d bytes more from the client, want its close", n)
				}
				return nil, fmt.Errorf("after the last transfer: want the client's close: %w", err)
			}
			return nil, nil
		}
		return rstreamSample(m, s.Size, s.Iters, el), nil
	}
}

// runRStream runs one rstream server and client, pinned as perftest's, and
// parses the client's report.
func (h *harness) runRStream(ctx context.Context, m Metric, size, n int) (*Sample, error) {
	port, err := h.freePort()
	if err != nil {
		return nil, err
	}
	argv := append(rstreamArgs(m, size, n), "-p", strconv.Itoa(port))
	srv, err := startProc(ctx, h.timeout, h.serverCPU, h.lineBuffered(append(argv, "-b", h.addr))...)
	if err != nil {
		return nil, err
	}
	defer srv.kill()
	if err := waitListening(ctx, srv, port, h.readyTimeout); err != nil {
		return nil, childErr(fmt.Errorf("rstream server: %v", status(srv, err)), srv)
	}
	cli, err := startProc(ctx, h.timeout, h.clientCPU, h.lineBuffered(append(argv, "-s", h.addr))...)
	if err != nil {
		return nil, err
	}
	defer cli.kill()
	cerr := cli.wait(h.timeout)
	serr := srv.wait(15 * time.Second)
	s, err := parseRStream(cli.stdout.String(), m, size)
	if err != nil {
		return nil, childErr(fmt.Errorf("rstream: client: %w (%s); server: %s", err, status(cli, cerr), status(srv, serr)), cli, srv)
	}
	return s, nil
}

// parseRStream reads rstream's report: a header line, then one line per
// test, "custom" in custom mode:
//
//	name      bytes   xfers   iters   total       time     Gb/sec    usec/xfer
//	custom    64      1       10k     1.2m       0.53s      2.41      21.21
//
// The value comes from usec/xfer (two decimals of a time per transfer, more
// precise than Gb/sec's two decimals of a rate).
func parseRStream(out string, m Metric, size int) (*Sample, error) {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) != 8 || f[0] != "custom" {
			continue
		}
		perXfer, err := strconv.ParseFloat(f[7], 64)
		if err != nil || perXfer <= 0 {
			return nil, fmt.Errorf("rstream's usec/xfer %q in %q is not a time", f[7], l)
		}
		return perXferSample(m, size, perXfer), nil
	}
	return nil, fmt.Errorf("no report line (\"custom ...\") in rstream's output %q", firstLine(out))
}
