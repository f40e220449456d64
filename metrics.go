package rdma

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Metrics for watching the library in production: what every connection of
// the process moved and how, by device and in total, with the devices'
// hardware counters. ReadMetrics takes a snapshot; the subpackages
// metrics/rdmaexpvar and metrics/rdmaprom publish it through expvar and
// Prometheus (apart, so that this package imports neither, nor net/http).
//
// Nothing is counted twice on the data path: connections keep atomic
// counters (their QP's posts, and the bytes, messages and credit stalls of
// metrics_conn.go) and the devices' pollers theirs; a snapshot reads them
// all. A closed connection's counts, and a torn-down device's, are folded
// into its device's totals, so every counter only grows.

// Metrics is a snapshot of the library's counters: the process's totals
// (every connection it opened, on every device) and each device's share.
type Metrics struct {
	Counters
	// Devices has one entry per RDMA device this process has opened a
	// connection on (by name, sorted), its connections closed or not.
	Devices []DeviceMetrics
}

// DeviceMetrics are one device's counters, and its hardware counters.
type DeviceMetrics struct {
	Device string // the device's name, e.g. "mlx5_0" or "rxe0"
	Counters
	// Ports are the device's hardware counters, read from sysfs when the
	// snapshot is taken (see DeviceCounters). Unlike the other counters
	// they count every user of the device, not only this process.
	Ports []PortCounters
	// PortsError says why Ports could not be read ("" if they were).
	PortsError string `json:",omitempty"`
}

// Counters are counts over a set of connections: one device's, or the
// whole process's. ConnsOpen and the Pool gauges are values now; every
// other field is a running total since the process started, over the
// connections open now and those closed.
type Counters struct {
	ConnsOpen  int64  // connections established and not closed yet
	ConnsTotal uint64 // connections established (dialed and accepted)

	// Payload moved by the stream and the message view: BytesSent counts
	// what Write, Send and PostSend handed to the NIC, BytesReceived what
	// the NIC delivered (stream bytes and whole messages, large ones
	// included, whether or not the application has read them yet).
	// One-sided transfers (WriteRemote, ReadRemote) are not counted here.
	BytesSent, BytesReceived uint64
	// Messages of the message view: Send and PostSend calls that posted
	// their message, and messages received.
	MessagesSent, MessagesReceived uint64
	// CreditStalls counts the times a sender (Write, Send) found the
	// peer's receive window closed (no credit left) and had to wait for the
	// peer to read and return credits: a peer that reads slowly, or a
	// window (Config.RecvBuffers) too small for the bandwidth-delay product.
	CreditStalls uint64

	// The work behind the connections, as ConnStats counts it for one:
	// post calls and work requests summed over the connections' queue
	// pairs; the poller fields (PollCalls, Completions, PollerSleeps,
	// PollerWakeups, InlinePolls, EmptyPolls, Parks, Arms) summed over the
	// devices' pollers, which connections share (diagnostics whose meaning
	// follows the implementation, as ConnStats says); KeepaliveProbes summed
	// over the connections, DeviceEvents over the devices; BufferBytes, a
	// gauge, over the connections open now.
	ConnStats

	// The devices' registered buffer pools: bytes mapped and registered
	// (PoolMappedBytes) and held by buffers in use (PoolInUseBytes), both
	// gauges of the devices set up now; PoolExhausted counts allocations
	// that found the pool at Config.PoolMaxBytes.
	PoolMappedBytes, PoolInUseBytes int64
	PoolExhausted                   uint64
}

// PortCounters are the hardware counters of one port of an RDMA device as
// its driver exports them in sysfs, by file name: the values are the
// driver's, unscaled. Which counters exist depends on the driver. Among
// them: retransmissions and timeouts (rxe: retry_exceeded_err,
// completer_retry_err; mlx5: local_ack_timeout_err, roce_adp_retrans),
// receiver-not-ready NAKs (rxe: rcvd_rnr_err, send_rnr_err; mlx5:
// rnr_nak_retry_err), sequence errors (rxe: rcvd_seq_err,
// out_of_seq_request; mlx5: out_of_sequence, packet_seq_err).
type PortCounters struct {
	// Port is the port number; 0 holds the counters a driver keeps for the
	// whole device.
	Port int
	// HW is the driver's hw_counters directory
	// (/sys/class/infiniband/<dev>/ports/<n>/hw_counters, or the device's
	// own for port 0), without "lifespan", which is a setting.
	HW map[string]uint64 `json:",omitempty"`
	// Standard is the port's counters directory: the InfiniBand
	// performance counters where the driver has them (port_xmit_data and
	// port_rcv_data count 4-byte words). Soft-RoCE has none.
	Standard map[string]uint64 `json:",omitempty"`
}

// ReadMetrics returns a snapshot of the library's counters. It takes a few
// microseconds per connection and reads the devices' hardware counters
// from sysfs; it does not slow the data path, whose counters are atomics.
// In a build without RDMA it returns zeros.
func ReadMetrics() Metrics { return readMetrics(&metricsReg, sysfsInfiniband) }

// readMetrics is ReadMetrics over registry r and the sysfs directory root.
func readMetrics(r *metricsRegistry, root string) Metrics {
	var m Metrics
	m.Devices = r.snapshot()
	for i := range m.Devices {
		d := &m.Devices[i]
		ports, err := readDeviceCounters(root, d.Device)
		d.Ports = ports
		if err != nil {
			d.PortsError = err.Error()
		}
		m.Counters.add(&d.Counters)
	}
	return m
}

// sysfsInfiniband is where the kernel lists RDMA devices.
const sysfsInfiniband = "/sys/class/infiniband"

// DeviceCounters reads the hardware counters of the named RDMA device (as
// `rdma link show` names it) from sysfs, one entry per port that has any,
// port 0 first when the driver keeps device-wide ones. It needs no
// connection and works on any device of the machine.
func DeviceCounters(device string) ([]PortCounters, error) {
	return readDeviceCounters(sysfsInfiniband, device)
}

func readDeviceCounters(root, device string) ([]PortCounters, error) {
	if device == "" || device == "." || device == ".." || strings.ContainsRune(device, '/') {
		return nil, fmt.Errorf("hardware counters: %q is not an RDMA device name (`rdma link show` lists them)", device)
	}
	dir := filepath.Join(root, device)
	if _, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("hardware counters of %s: no such RDMA device in %s (`rdma link show` lists them): %w",
				device, root, err)
		}
		return nil, fmt.Errorf("hardware counters of %s: %w", device, err)
	}
	var out []PortCounters
	hw, err := readCounterDir(filepath.Join(dir, "hw_counters"))
	if err != nil {
		return nil, fmt.Errorf("hardware counters of %s: %w", device, err)
	}
	if len(hw) > 0 {
		out = append(out, PortCounters{Port: 0, HW: hw})
	}
	entries, err := os.ReadDir(filepath.Join(dir, "ports"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("hardware counters of %s: %w", device, err)
	}
	var ports []int
	for _, e := range entries {
		if n, err := strconv.Atoi(e.Name()); err == nil && n > 0 {
			ports = append(ports, n)
		}
	}
	slices.Sort(ports)
	for _, n := range ports {
		pdir := filepath.Join(dir, "ports", strconv.Itoa(n))
		pc := PortCounters{Port: n}
		if pc.HW, err = readCounterDir(filepath.Join(pdir, "hw_counters")); err != nil {
			return nil, fmt.Errorf("hardware counters of %s port %d: %w", device, n, err)
		}
		if pc.Standard, err = readCounterDir(filepath.Join(pdir, "counters")); err != nil {
			return nil, fmt.Errorf("hardware counters of %s port %d: %w", device, n, err)
		}
		if pc.HW != nil || pc.Standard != nil {
			out = append(out, pc)
		}
	}
	return out, nil
}

// readCounterDir reads a sysfs directory of counters, one decimal value
// per file. A missing directory is no error (nil, nil): drivers differ in
// which they have. A file that cannot be read or holds no number is left
// out (some counters fail to read on some devices, e.g. with EINVAL).
func readCounterDir(dir string) (map[string]uint64, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var m map[string]uint64
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || name == "lifespan" { // lifespan: how long the driver caches the values (ms)
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			continue
		}
		if m == nil {
			m = make(map[string]uint64, len(entries))
		}
		m[name] = v
	}
	return m, nil
}

// add adds o's counts and gauges to c.
func (c *Counters) add(o *Counters) {
	c.addTotals(o)
	c.ConnsOpen += o.ConnsOpen
	c.BufferBytes += o.BufferBytes
	c.PoolMappedBytes += o.PoolMappedBytes
	c.PoolInUseBytes += o.PoolInUseBytes
}

// addTotals adds o's running totals to c, not its gauges: what remains of
// a connection or device once it is gone.
func (c *Counters) addTotals(o *Counters) {
	c.ConnsTotal += o.ConnsTotal
	c.BytesSent += o.BytesSent
	c.BytesReceived += o.BytesReceived
	c.MessagesSent += o.MessagesSent
	c.MessagesReceived += o.MessagesReceived
	c.CreditStalls += o.CreditStalls
	c.PoolExhausted += o.PoolExhausted
	c.ConnStats.add(&o.ConnStats)
}

func (s *ConnStats) add(o *ConnStats) {
	s.PostCalls += o.PostCalls
	s.WorkRequests += o.WorkRequests
	s.SendPosts += o.SendPosts
	s.SendWRs += o.SendWRs
	s.Signaled += o.Signaled
	s.Inlined += o.Inlined
	s.RecvPosts += o.RecvPosts
	s.RecvWRs += o.RecvWRs
	s.PollCalls += o.PollCalls
	s.Completions += o.Completions
	s.PollerSleeps += o.PollerSleeps
	s.PollerWakeups += o.PollerWakeups
	s.InlinePolls += o.InlinePolls
	s.EmptyPolls += o.EmptyPolls
	s.Parks += o.Parks
	s.Arms += o.Arms
	s.KeepaliveProbes += o.KeepaliveProbes
	s.DeviceEvents += o.DeviceEvents
	// BufferBytes is a gauge: Counters.add adds it, running totals do not.
}

// metricsSource is a connection or device whose counters a snapshot reads
// (metrics_conn.go; the tests' fakes).
type metricsSource interface {
	metricsDevice() string      // the device's name
	readCounters(add *Counters) // adds its counts now (atomic loads, no lock of the data path)
}

// deviceSource is a device: the registry forgets it, keeping its final
// counts, once it is torn down.
type deviceSource interface {
	metricsSource
	metricsGone() bool
}

// metricsRegistry knows the live connections and devices of the process
// and keeps, by device name, the final counts of those that are gone.
type metricsRegistry struct {
	mu    sync.Mutex
	conns map[metricsSource]struct{}
	devs  map[deviceSource]struct{}
	gone  map[string]*Counters
}

// metricsReg is the process's registry: connections join it when they are
// established and leave it when they are closed.
var metricsReg metricsRegistry

// goneLocked returns the totals kept for the device of that name.
func (r *metricsRegistry) goneLocked(device string) *Counters {
	if r.gone == nil {
		r.conns = make(map[metricsSource]struct{})
		r.devs = make(map[deviceSource]struct{})
		r.gone = make(map[string]*Counters)
	}
	g := r.gone[device]
	if g == nil {
		g = new(Counters)
		r.gone[device] = g
	}
	return g
}

// addConn registers an established connection and its device.
func (r *metricsRegistry) addConn(c metricsSource, d deviceSource) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.goneLocked(c.metricsDevice()).ConnsTotal++
	r.pruneLocked()
	r.conns[c] = struct{}{}
	if d != nil {
		r.devs[d] = struct{}{}
	}
}

// removeConn unregisters a closed connection, keeping its final counts.
func (r *metricsRegistry) removeConn(c metricsSource) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.conns[c]; !ok {
		return
	}
	delete(r.conns, c)
	var k Counters
	c.readCounters(&k)
	r.goneLocked(c.metricsDevice()).addTotals(&k)
	r.pruneLocked()
}

// pruneLocked forgets the devices that were torn down, keeping their
// final counts (a counter read after this fold would only be higher, and
// is never read: every counter stays monotonic).
func (r *metricsRegistry) pruneLocked() {
	for d := range r.devs {
		if d.metricsGone() {
			var k Counters
			d.readCounters(&k)
			r.goneLocked(d.metricsDevice()).addTotals(&k)
			delete(r.devs, d)
		}
	}
}

// snapshot returns every device's counters, sorted by name, without their
// hardware counters.
func (r *metricsRegistry) snapshot() []DeviceMetrics {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pruneLocked()
	by := make(map[string]*Counters, len(r.gone))
	for name, g := range r.gone {
		k := *g
		by[name] = &k
	}
	find := func(name string) *Counters {
		if by[name] == nil {
			by[name] = new(Counters)
		}
		return by[name]
	}
	for c := range r.conns {
		k := find(c.metricsDevice())
		k.ConnsOpen++
		c.readCounters(k)
	}
	for d := range r.devs {
		d.readCounters(find(d.metricsDevice()))
	}
	out := make([]DeviceMetrics, 0, len(by))
	for name, k := range by {
		out = append(out, DeviceMetrics{Device: name, Counters: *k})
	}
	slices.SortFunc(out, func(a, b DeviceMetrics) int { return cmp.Compare(a.Device, b.Device) })
	return out
}
