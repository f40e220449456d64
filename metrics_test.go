package rdma

import (
	"encoding/json"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Host tests of metrics.go: the registry's aggregation (running totals
// survive closed connections and torn-down devices, and never go down,
// whatever the interleaving), and the sysfs reader against a fake tree.

// fakeSource stands for a connection or a device: a few counters that
// move while the registry reads them.
type fakeSource struct {
	dev   string
	bytes atomic.Uint64 // reported as BytesSent and BytesReceived
	parks atomic.Uint64 // reported as Parks
	inUse atomic.Int64  // reported as PoolInUseBytes, a gauge
	gone  atomic.Bool
}

func (f *fakeSource) metricsDevice() string { return f.dev }
func (f *fakeSource) metricsGone() bool     { return f.gone.Load() }
func (f *fakeSource) readCounters(k *Counters) {
	b := f.bytes.Load()
	k.BytesSent += b
	k.BytesReceived += b
	k.Parks += f.parks.Load()
	k.PoolInUseBytes += f.inUse.Load()
}

func deviceOf(t *testing.T, ds []DeviceMetrics, name string) Counters {
	t.Helper()
	for _, d := range ds {
		if d.Device == name {
			return d.Counters
		}
	}
	t.Fatalf("no device %q in %+v", name, ds)
	return Counters{}
}

func TestMetricsRegistry(t *testing.T) {
	var r metricsRegistry
	if got := r.snapshot(); len(got) != 0 {
		t.Fatalf("empty registry: %+v", got)
	}
	dev0 := &fakeSource{dev: "mlx5_0"}
	a, b := &fakeSource{dev: "mlx5_0"}, &fakeSource{dev: "mlx5_0"}
	c := &fakeSource{dev: "rxe0"}
	r.addConn(a, dev0)
	r.addConn(b, dev0)
	r.addConn(c, nil)
	a.bytes.Store(100)
	b.bytes.Store(20)
	c.bytes.Store(3)
	dev0.parks.Store(7)
	dev0.inUse.Store(4096)

	snap := r.snapshot()
	if len(snap) != 2 || snap[0].Device != "mlx5_0" || snap[1].Device != "rxe0" {
		t.Fatalf("devices not sorted by name, one each: %+v", snap)
	}
	d0 := deviceOf(t, snap, "mlx5_0")
	if d0.ConnsOpen != 2 || d0.ConnsTotal != 2 || d0.BytesSent != 120 || d0.Parks != 7 || d0.PoolInUseBytes != 4096 {
		t.Errorf("mlx5_0 with two connections: %+v", d0)
	}
	if d1 := deviceOf(t, snap, "rxe0"); d1.ConnsOpen != 1 || d1.ConnsTotal != 1 || d1.BytesSent != 3 {
		t.Errorf("rxe0 with one connection: %+v", d1)
	}

	// A closed connection's counts stay in its device's totals; what it
	// would count afterwards is not read any more.
	r.removeConn(a)
	a.bytes.Store(1 << 40)
	r.removeConn(a) // twice: no second fold
	d0 = deviceOf(t, r.snapshot(), "mlx5_0")
	if d0.ConnsOpen != 1 || d0.ConnsTotal != 2 || d0.BytesSent != 120 {
		t.Errorf("after closing one connection of two: %+v", d0)
	}

	// A torn-down device's counts stay too; its gauges do not.
	dev0.parks.Store(9)
	dev0.gone.Store(true)
	d0 = deviceOf(t, r.snapshot(), "mlx5_0")
	if d0.Parks != 9 || d0.PoolInUseBytes != 0 {
		t.Errorf("after the device was torn down: parks %d (want 9), pool in use %d (want 0)", d0.Parks, d0.PoolInUseBytes)
	}
	dev0.parks.Store(1 << 40)
	r.removeConn(b)
	r.removeConn(c)
	snap = r.snapshot()
	d0 = deviceOf(t, snap, "mlx5_0")
	if d0.ConnsOpen != 0 || d0.ConnsTotal != 2 || d0.BytesSent != 120 || d0.Parks != 9 {
		t.Errorf("every connection closed: %+v", d0)
	}
	if d1 := deviceOf(t, snap, "rxe0"); d1.ConnsOpen != 0 || d1.ConnsTotal != 1 || d1.BytesSent != 3 {
		t.Errorf("rxe0 closed: %+v", d1)
	}

	// A device set up again under the same name continues its totals.
	dev0b, d := &fakeSource{dev: "mlx5_0"}, &fakeSource{dev: "mlx5_0"}
	r.addConn(d, dev0b)
	d.bytes.Store(5)
	dev0b.parks.Store(1)
	d0 = deviceOf(t, r.snapshot(), "mlx5_0")
	if d0.ConnsOpen != 1 || d0.ConnsTotal != 3 || d0.BytesSent != 125 || d0.Parks != 10 {
		t.Errorf("the device again: %+v", d0)
	}
}

// TestMetricsMonotonic churns connections and devices from many
// goroutines while snapshots are taken: no running total may ever go down,
// and at the end the totals are exactly what was counted.
func TestMetricsMonotonic(t *testing.T) {
	var r metricsRegistry
	const workers, rounds = 8, 200
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var bad atomic.Value
	var snaps atomic.Int64
	scraper := func() {
		defer wg.Done()
		prev := map[string]Counters{}
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, d := range r.snapshot() {
				p := prev[d.Device]
				if d.ConnsTotal < p.ConnsTotal || d.BytesSent < p.BytesSent || d.BytesReceived < p.BytesReceived || d.Parks < p.Parks {
					bad.Store("went down: " + d.Device)
				}
				if d.ConnsOpen < 0 || uint64(d.ConnsOpen) > d.ConnsTotal {
					bad.Store("open connections out of range")
				}
				prev[d.Device] = d.Counters
			}
			snaps.Add(1)
		}
	}
	wg.Add(2)
	go scraper()
	go scraper()

	var counted, parked [2]atomic.Uint64
	var work sync.WaitGroup
	for w := range workers {
		work.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			devIdx := w % 2
			name := []string{"dev0", "dev1"}[devIdx]
			dev := &fakeSource{dev: name}
			for range rounds {
				c := &fakeSource{dev: name}
				r.addConn(c, dev)
				for range rng.IntN(20) {
					n := uint64(rng.IntN(1000))
					c.bytes.Add(n)
					counted[devIdx].Add(n)
				}
				if rng.IntN(4) == 0 {
					dev.parks.Add(1)
					parked[devIdx].Add(1)
				}
				r.removeConn(c)
				if rng.IntN(10) == 0 { // the device is torn down, a new one set up
					dev.gone.Store(true)
					dev = &fakeSource{dev: name}
				}
			}
			dev.gone.Store(true)
		})
	}
	work.Wait()
	close(stop)
	wg.Wait()
	if v := bad.Load(); v != nil {
		t.Fatal(v)
	}
	if snaps.Load() == 0 {
		t.Fatal("no snapshot was taken during the churn")
	}
	for i, name := range []string{"dev0", "dev1"} {
		d := deviceOf(t, r.snapshot(), name)
		if d.ConnsOpen != 0 || d.ConnsTotal != workers/2*rounds || d.BytesSent != counted[i].Load() || d.Parks != parked[i].Load() {
			t.Errorf("%s at the end: open %d total %d bytes %d parks %d; want 0, %d, %d, %d", name,
				d.ConnsOpen, d.ConnsTotal, d.BytesSent, d.Parks, workers/2*rounds, counted[i].Load(), parked[i].Load())
		}
	}
	t.Logf("%d snapshots during the churn", snaps.Load())
}

// setEveryField gives every numeric field of v (a struct, embedded structs
// included) a distinct non-zero value.
func setEveryField(v reflect.Value, next *int64) {
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Struct:
			setEveryField(f, next)
		case reflect.Int64:
			*next++
			f.SetInt(*next)
		case reflect.Uint64:
			*next++
			f.SetUint(uint64(*next))
		default:
			panic("Counters has a field of kind " + f.Kind().String() + ": teach add and this test about it")
		}
	}
}

// TestCountersAddEveryField fails when a field is added to Counters or
// ConnStats and not to add (which would drop it from every total).
func TestCountersAddEveryField(t *testing.T) {
	var o Counters
	var n int64
	setEveryField(reflect.ValueOf(&o).Elem(), &n)
	var sum Counters
	sum.add(&o)
	if sum != o {
		t.Errorf("add dropped a field:\n got %+v\nwant %+v", sum, o)
	}
	var totals Counters
	totals.addTotals(&o)
	want := o
	want.ConnsOpen, want.BufferBytes, want.PoolMappedBytes, want.PoolInUseBytes = 0, 0, 0, 0
	if totals != want {
		t.Errorf("addTotals: every running total and no gauge:\n got %+v\nwant %+v", totals, want)
	}
}

// writeTree creates files (path -> contents) under root.
func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, s := range files {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// fakeSysfs is a /sys/class/infiniband with an mlx5-like device (device
// counters, two ports with both directories) and an rxe-like one (port 1's
// hw_counters only).
func fakeSysfs(t *testing.T) string {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"mlx5_0/hw_counters/cq_overflow":                     "0\n",
		"mlx5_0/hw_counters/lifespan":                        "10\n",
		"mlx5_0/ports/1/hw_counters/out_of_sequence":         "12\n",
		"mlx5_0/ports/1/hw_counters/rnr_nak_retry_err":       "3\n",
		"mlx5_0/ports/1/hw_counters/local_ack_timeout_err":   "18446744073709551615\n",
		"mlx5_0/ports/1/hw_counters/lifespan":                "10\n",
		"mlx5_0/ports/1/counters/port_xmit_data":             "123456789\n",
		"mlx5_0/ports/1/counters/port_rcv_data":              "987654321\n",
		"mlx5_0/ports/1/counters/unreadable_one":             "N/A\n",
		"mlx5_0/ports/1/state":                               "4: ACTIVE\n",
		"mlx5_0/ports/2/counters/port_xmit_data":             "5",
		"mlx5_0/ports/10/hw_counters/out_of_sequence":        "1",
		"mlx5_0/ports/not-a-port/hw_counters/x":              "1",
		"rxe0/ports/1/hw_counters/rcvd_rnr_err":              "0\n",
		"rxe0/ports/1/hw_counters/retry_exceeded_err":        "2\n",
		"rxe0/ports/1/hw_counters/rcvd_seq_err":              "1\n",
		"rxe0/ports/1/hw_counters/sent_pkts":                 "4711\n",
		"rxe0/ports/1/hw_counters/lifespan":                  "12\n",
		"rxe0/ports/1/gids/0":                                "fe80::",
		"rxe0/ports/1/cm_rx_msgs/req":                        "3",
		"rxe0/ports/1/hw_counters/subdir/ignored":            "1",
		"noports0/node_type":                                 "1: CA",
		"mlx5_0/ports/1/hw_counters/empty_file_is_not_a_num": "",
	})
	return root
}

func TestDeviceCountersSysfs(t *testing.T) {
	root := fakeSysfs(t)
	got, err := readDeviceCounters(root, "mlx5_0")
	if err != nil {
		t.Fatal(err)
	}
	want := []PortCounters{
		{Port: 0, HW: map[string]uint64{"cq_overflow": 0}},
		{Port: 1, HW: map[string]uint64{"out_of_sequence": 12, "rnr_nak_retry_err": 3, "local_ack_timeout_err": 1<<64 - 1},
			Standard: map[string]uint64{"port_xmit_data": 123456789, "port_rcv_data": 987654321}},
		{Port: 2, Standard: map[string]uint64{"port_xmit_data": 5}},
		{Port: 10, HW: map[string]uint64{"out_of_sequence": 1}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("mlx5_0:\n got %+v\nwant %+v", got, want)
	}

	got, err = readDeviceCounters(root, "rxe0")
	if err != nil {
		t.Fatal(err)
	}
	want = []PortCounters{{Port: 1, HW: map[string]uint64{"rcvd_rnr_err": 0, "retry_exceeded_err": 2, "rcvd_seq_err": 1, "sent_pkts": 4711}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("rxe0:\n got %+v\nwant %+v", got, want)
	}

	if got, err := readDeviceCounters(root, "noports0"); err != nil || got != nil {
		t.Errorf("a device without counters: %+v, %v; want none and no error", got, err)
	}

	_, err = readDeviceCounters(root, "mlx9_9")
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "rdma link show") {
		t.Errorf("a missing device: %v; want fs.ErrNotExist and what lists the devices", err)
	}
	for _, name := range []string{"", ".", "..", "../mlx5_0", "rxe0/ports"} {
		if _, err := readDeviceCounters(root, name); err == nil || !strings.Contains(err.Error(), "not an RDMA device name") {
			t.Errorf("device name %q: %v; want it refused", name, err)
		}
	}
}

// TestReadMetricsComposes checks what ReadMetrics adds to the registry's
// snapshot: each device's hardware counters (or why there are none) and
// the process's totals, and that it all encodes to JSON as expvar shows it.
func TestReadMetricsComposes(t *testing.T) {
	root := fakeSysfs(t)
	var r metricsRegistry
	dev := &fakeSource{dev: "rxe0"}
	c1, c2 := &fakeSource{dev: "rxe0"}, &fakeSource{dev: "mlx9_9"}
	r.addConn(c1, dev)
	r.addConn(c2, nil)
	c1.bytes.Store(10)
	c2.bytes.Store(5)
	dev.inUse.Store(1 << 20)

	m := readMetrics(&r, root)
	if m.ConnsOpen != 2 || m.ConnsTotal != 2 || m.BytesSent != 15 || m.PoolInUseBytes != 1<<20 {
		t.Errorf("process totals: %+v", m.Counters)
	}
	if len(m.Devices) != 2 || m.Devices[0].Device != "mlx9_9" || m.Devices[1].Device != "rxe0" {
		t.Fatalf("devices: %+v", m.Devices)
	}
	if m.Devices[0].Ports != nil || !strings.Contains(m.Devices[0].PortsError, "no such RDMA device") {
		t.Errorf("a device missing from sysfs: ports %+v, error %q", m.Devices[0].Ports, m.Devices[0].PortsError)
	}
	rxe := m.Devices[1]
	if rxe.PortsError != "" || len(rxe.Ports) != 1 || rxe.Ports[0].HW["retry_exceeded_err"] != 2 {
		t.Errorf("rxe0's hardware counters: %+v (%s)", rxe.Ports, rxe.PortsError)
	}

	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ConnsOpen", "BytesSent", "CreditStalls", "PollerWakeups", "Parks", "Devices"} {
		if _, ok := back[k]; !ok {
			t.Errorf("JSON has no %s at the top level: %s", k, b)
		}
	}
	devs := back["Devices"].([]any)
	port := devs[1].(map[string]any)["Ports"].([]any)[0].(map[string]any)
	if port["HW"].(map[string]any)["sent_pkts"] != 4711.0 {
		t.Errorf("JSON of rxe0's port: %v", port)
	}
}
