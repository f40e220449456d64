//go:build linux

package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/verbline/rdma"
)

// The case registry. A case measures one way of using the library; it is one
// function, called in two processes (the server and the client, pinned to
// different CPUs) that hold the two ends of one connection. The side that
// measures returns a Sample, the other returns nil. Add a case by writing its
// function and one register call in init, e.g. for the zero-copy message view:
//
//	register(Case{Name: "msgview-pingpong", Metric: Latency, Run: msgViewPingPong})
//
// where msgViewPingPong type-asserts s.Conn to *rdma.Conn and uses the new API.
// The case then gets the perftest baselines of its metric (perftest.go) and the
// metric's TCP baseline in the same run, table, JSON and chart.
var registry []Case

// A Case is one measurement of this library.
type Case struct {
	Name   string // e.g. "conn-pingpong"; -cases matches "metric/name"
	Metric Metric
	Run    func(s *Side) (*Sample, error)
	// TCP: Run uses only net.Conn, so it also runs over TCP on 127.0.0.1; the
	// first such case of a metric is that metric's TCP baseline.
	TCP bool
	// Packet: the two processes hold a PacketConn each (Side.Packet), not
	// the ends of a connection (cases_ud.go).
	Packet bool
	// MaxSize: the case runs only at sizes up to it (0: every size).
	MaxSize int
	// Needs: what the case needs of the device beyond connections; on a
	// device without it the case is left out of the plan.
	Needs need
	// DefaultConfig: the two ends use the library's default Config (its
	// window starts small and grows with traffic), not -depth buffers.
	DefaultConfig bool
	// Floor: the Go floor, the same send/receive ping-pong over raw verbs
	// with no library logic (floor.go); a baseline column beside perftest,
	// run with -net verbs. Run is unused.
	Floor bool
	// Peer: another way of doing what our cases of the metric do (grpc-go
	// beside grpcrdma): a column our cases are compared with, run over
	// RDMA as ours are, and a row compared with the other columns.
	Peer bool
}

func register(c Case) { registry = append(registry, c) }

func init() {
	register(Case{Name: "conn-pingpong", Metric: Latency, Run: pingPong, TCP: true})
	register(Case{Name: "conn-stream", Metric: Bandwidth, Run: stream, TCP: true})
	// The same stream with rdma.Config{} as a service would dial it: the
	// receive window starts at 4 credits and grows to the default 64, so
	// this shows what autotuning reaches against the fixed -depth rings.
	register(Case{Name: "conn-stream-default", Metric: Bandwidth, Run: stream, DefaultConfig: true})
	// The same stream read through io.Copy (Conn.WriteTo): each received
	// chunk goes to the writer straight from its receive buffer, with no
	// copy into a buffer of the reader's; the writer here only counts, as
	// perftest's receiver never touches the data either.
	register(Case{Name: "conn-stream-copy", Metric: Bandwidth, Run: streamCopy})
	register(Case{Name: "conn-msgrate", Metric: Rate, Run: msgRate, TCP: true})
	// The Go floor: what a Go program pays per round trip for the verbs
	// calls alone (floor.go), in two processes pinned as perftest's.
	register(Case{Name: "go-floor", Metric: Latency, Floor: true})
}

func caseByName(name string) (Case, bool) {
	i := slices.IndexFunc(registry, func(c Case) bool { return c.Name == name })
	if i < 0 {
		return Case{}, false
	}
	return registry[i], true
}

// Side is what a case's function gets in each of the two processes.
type Side struct {
	Server bool
	Conn   net.Conn // a *rdma.Conn, or a *net.TCPConn when the case runs as the TCP baseline
	// Packet cases: each side's PacketConn, and on the client the server's address.
	Packet *rdma.PacketConn
	Peer   netip.AddrPort
	Size   int      // message size in bytes
	Iters  int      // timed messages (round trips for latency), as perftest's -n
	Warmup int      // untimed round trips before the timed ones (latency)
	Slow   *slowLog // a latency client's log of slow round trips (nil: off)
}

// Sample is one run's result, in the metric's unit.
type Sample struct {
	Value float64 `json:"value"`          // latency: median one-way µs; bandwidth: MB/s (10^6 B); rate: 10^6 msg/s
	P99   float64 `json:"p99,omitempty"`  // latency: 99th percentile, one-way µs
	P999  float64 `json:"p999,omitempty"` // latency: 99.9th percentile, one-way µs
	Avg   float64 `json:"avg,omitempty"`  // latency: mean, one-way µs
	// Check is perftest's bandwidth recomputed as MsgRate[Mpps] x size, in MB/s:
	// it verifies the MiB -> MB conversion of "BW average[MB/sec]".
	Check float64 `json:"check,omitempty"`
	// Latency cases of ours and TCP: the one-way latencies over the run
	// (per chunk of round trips in order: median and max, µs) and their
	// histogram ((bucket upper bound µs, count)), for the chart.
	Series [][2]float64 `json:"series,omitempty"`
	Hist   [][2]float64 `json:"hist,omitempty"`
	// Counters: the library's ConnStats of both processes, per message
	// (per round trip for latency), keyed "client.X" / "server.X" (ours only).
	// The completion and polling keys (completions, caller_polls,
	// poller_polls, poller_wakeups, parks, arms, cgo_work, cgo_empty) are
	// diagnostics whose meaning follows the implementation.
	Counters map[string]float64 `json:"counters,omitempty"`
	// Packets: the device's packets per message (round trip), both
	// directions, on one host (packets.go); 0 when not counted.
	Packets float64 `json:"packets,omitempty"`
	// Stages: CPU profile samples by stage of the message's path (-stages,
	// stages.go), keyed "client.stage" / "server.stage" (ours and the floor).
	Stages map[string]float64 `json:"stages,omitempty"`
	// CPU: each CPU's busy time per message (round trip) on one host (cpu.go).
	CPU []CPUUse `json:"cpu,omitempty"`
	// Harness: this process's own CPU time over the same window, as a share
	// of one CPU: what the sampling and the harness's runtime took from
	// the CPUs above, which counts in them.
	Harness float64 `json:"harness_cpu_share,omitempty"`
}

// pingPong: the client writes Size bytes and reads the echo with io.ReadFull,
// Iters times after Warmup untimed round trips; the server echoes. Latency is
// one-way, half the round trip, as perftest reports it.
func pingPong(s *Side) (*Sample, error) {
	buf := make([]byte, s.Size)
	if s.Server {
		for {
			phase(phaseRecv)
			if _, err := io.ReadFull(s.Conn, buf); err != nil {
				if err == io.EOF {
					return nil, nil
				}
				return nil, fmt.Errorf("echo read: %w", err)
			}
			phase(phaseSend)
			if _, err := s.Conn.Write(buf); err != nil {
				return nil, fmt.Errorf("echo write: %w", err)
			}
		}
	}
	msg := pattern(s.Size)
	rtts := make([]time.Duration, 0, s.Iters)
	for i := 0; i < s.Warmup+s.Iters; i++ {
		s.Slow.begin()
		start := time.Now()
		phase(phaseSend)
		if _, err := s.Conn.Write(msg); err != nil {
			return nil, fmt.Errorf("write: %w", err)
		}
		phase(phaseRecv)
		if _, err := io.ReadFull(s.Conn, buf); err != nil {
			return nil, fmt.Errorf("read echo: %w", err)
		}
		phase(phaseOther)
		rtts = s.done(rtts, i, start)
	}
	return latencySample(rtts), nil
}

// done ends round trip i, begun at start: its time is kept past the
// warm-up, and logged if slow (Slow).
func (s *Side) done(rtts []time.Duration, i int, start time.Time) []time.Duration {
	d := time.Since(start)
	s.Slow.end(i, d)
	if i >= s.Warmup {
		rtts = append(rtts, d)
	}
	return rtts
}

// latencySample turns round-trip times into one-way (halved) statistics in µs.
// The median is perftest's t_typical; percentiles are nearest-rank.
func latencySample(rtts []time.Duration) *Sample { return durationSample(rtts, 2) }

// durationSample is the statistics of times divided by div, in µs.
func durationSample(ds []time.Duration, div int) *Sample {
	us := make([]float64, len(ds))
	sum := 0.0
	for i, d := range ds {
		us[i] = float64(d) / float64(div) / float64(time.Microsecond)
		sum += us[i]
	}
	series := latencySeries(us, 200)
	h := newHist()
	for _, d := range ds {
		h.record(d / time.Duration(div))
	}
	slices.Sort(us)
	return &Sample{Value: median(us), P99: percentile(us, 0.99), P999: percentile(us, 0.999), Avg: sum / float64(len(us)),
		Series: series, Hist: h.histBins()}
}

// latencySeries cuts values (in run order) into at most points chunks and
// returns each chunk's median and max.
func latencySeries(vals []float64, points int) [][2]float64 {
	if len(vals) == 0 {
		return nil
	}
	chunk := (len(vals) + points - 1) / points
	var out [][2]float64
	for i := 0; i < len(vals); i += chunk {
		c := slices.Clone(vals[i:min(i+chunk, len(vals))])
		slices.Sort(c)
		out = append(out, [2]float64{median(c), c[len(c)-1]})
	}
	return out
}

// stream: the client writes Iters messages of Size bytes with Conn.Write; the
// server reads them all. Bandwidth is measured on the receiver.
func stream(s *Side) (*Sample, error) {
	if s.Server {
		bytes, el, err := receive(s.Conn, int64(s.Size)*int64(s.Iters), max(s.Size, 64<<10))
		if err != nil {
			return nil, err
		}
		return &Sample{Value: float64(bytes) / el.Seconds() / 1e6}, nil
	}
	return nil, send(s.Conn, s.Size, s.Iters)
}

// streamCopy: stream, with the server taking the bytes through
// io.Copy(counter, conn), which Conn.WriteTo serves.
func streamCopy(s *Side) (*Sample, error) {
	if !s.Server {
		return nil, send(s.Conn, s.Size, s.Iters)
	}
	sink := &countSink{total: int64(s.Size) * int64(s.Iters)}
	if _, err := io.Copy(sink, s.Conn); !errors.Is(err, errAllCounted) {
		return nil, fmt.Errorf("io.Copy after %d of %d bytes: %w", sink.got, sink.total, err)
	}
	el := time.Since(sink.start)
	if counted := sink.got - sink.first; counted == 0 || el <= 0 {
		return nil, fmt.Errorf("all %d bytes arrived in the first chunk: too few to time (raise the iterations)", sink.total)
	}
	if _, err := s.Conn.Write([]byte{1}); err != nil {
		return nil, fmt.Errorf("write acknowledgement: %w", err)
	}
	return &Sample{Value: float64(sink.got-sink.first) / el.Seconds() / 1e6}, nil
}

// countSink counts what io.Copy hands it and stops the copy (errAllCounted)
// once total bytes came. Its clock starts at the first chunk, whose bytes
// are not counted, as receive's at the first read.
type countSink struct {
	total, got, first int64
	start             time.Time
}

var errAllCounted = errors.New("every byte counted")

func (w *countSink) Write(p []byte) (int, error) {
	if w.start.IsZero() {
		w.start, w.first = time.Now(), int64(len(p))
	}
	w.got += int64(len(p))
	if w.got >= w.total {
		return len(p), errAllCounted
	}
	return len(p), nil
}

// msgRate: the client writes Iters messages of Size (64) bytes, each its own
// Conn.Write, as fast as the connection takes them (many in flight: a Write
// returns once the message is posted); the server counts messages per second.
func msgRate(s *Side) (*Sample, error) {
	if s.Server {
		bytes, el, err := receive(s.Conn, int64(s.Size)*int64(s.Iters), 64<<10)
		if err != nil {
			return nil, err
		}
		return &Sample{Value: float64(bytes) / float64(s.Size) / el.Seconds() / 1e6}, nil
	}
	return nil, send(s.Conn, s.Size, s.Iters)
}

// send writes n messages of size bytes, then waits for the receiver's
// one-byte acknowledgement so that closing cannot cut the measurement short.
func send(c net.Conn, size, n int) error {
	msg := pattern(size)
	for i := 0; i < n; i++ {
		if _, err := c.Write(msg); err != nil {
			return fmt.Errorf("write %d of %d: %w", i, n, err)
		}
	}
	var ack [1]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return fmt.Errorf("read acknowledgement: %w", err)
	}
	return nil
}

// receive reads total bytes. The clock starts when the first read returns
// (the connection is set up and data flows), so the bytes of that first read
// are not counted: it returns the bytes read after it and the time they took.
func receive(c net.Conn, total int64, bufSize int) (int64, time.Duration, error) {
	buf := make([]byte, bufSize)
	n, err := c.Read(buf)
	if err != nil {
		return 0, 0, fmt.Errorf("read: %w", err)
	}
	start := time.Now()
	got, counted := int64(n), int64(0)
	for got < total {
		n, err := c.Read(buf)
		got += int64(n)
		counted += int64(n)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, 0, fmt.Errorf("read after %d of %d bytes: %w", got, total, err)
		}
	}
	el := time.Since(start)
	if got != total {
		return 0, 0, fmt.Errorf("received %d bytes, want %d", got, total)
	}
	if counted == 0 || el <= 0 {
		return 0, 0, fmt.Errorf("all %d bytes arrived in the first read: too few to time (raise the iterations)", total)
	}
	if _, err := c.Write([]byte{1}); err != nil {
		return 0, 0, fmt.Errorf("write acknowledgement: %w", err)
	}
	return counted, el, nil
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + 1)
	}
	return b
}

// median of sorted values (the mean of the middle two for an even count).
func median(sorted []float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// percentile of sorted values, nearest rank.
func percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	i := int(math.Ceil(float64(n)*p)) - 1
	return sorted[min(max(i, 0), n-1)]
}
