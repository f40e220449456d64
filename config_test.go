package rdma

import (
	"net"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/poller"
)

// The defaults Config documents for each zero value, as withDefaults applies
// them. Fields whose zero value is resolved elsewhere (MaxMessageSize,
// Pollers, PollCPUs, PoolMaxBytes: see TestConfigZeroResolvedLater) stay 0.
var documentedDefaults = Config{
	RecvBuffers:    64,
	SendBuffers:    64,
	BufferSize:     32 << 10,
	ConnectTimeout: 15 * time.Second,
	CloseTimeout:   5 * time.Second,
	RetryCount:     7,
	PollMode:       PollAdaptive,
	PollSpin:       50 * time.Microsecond,
	Backlog:        128,
}

func TestConfigDefaults(t *testing.T) {
	var zero Config
	if got := zero.withDefaults(); !reflect.DeepEqual(got, documentedDefaults) {
		t.Fatalf("zero Config:\n got %+v\nwant %+v", got, documentedDefaults)
	}
	var nilCfg *Config
	if got := nilCfg.withDefaults(); !reflect.DeepEqual(got, documentedDefaults) {
		t.Fatalf("nil *Config:\n got %+v\nwant %+v", got, documentedDefaults)
	}
	if !reflect.DeepEqual(zero, Config{}) {
		t.Fatal("withDefaults changed its receiver")
	}
}

func TestConfigKeepsSetValues(t *testing.T) {
	in := Config{
		RecvBuffers: 16, SendBuffers: 8, BufferSize: 4096, MaxMessageSize: 1 << 20,
		ConnectTimeout: time.Second, CloseTimeout: 2 * time.Second, RetryCount: 3,
		PollMode: PollBusy, PollSpin: time.Millisecond, Pollers: 2, PollCPUs: []int{3, 1},
		PollNoPin: true, PoolMaxBytes: 64 << 20, Backlog: 7,
	}
	got := in.withDefaults()
	if !reflect.DeepEqual(got, in) {
		t.Fatalf("set values changed:\n got %+v\nwant %+v", got, in)
	}
}

func TestConfigMinimums(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Config
		get  func(Config) int
		want int
	}{
		{"RecvBuffers 1", Config{RecvBuffers: 1}, func(c Config) int { return c.RecvBuffers }, 4},
		{"RecvBuffers -5", Config{RecvBuffers: -5}, func(c Config) int { return c.RecvBuffers }, 4},
		{"RecvBuffers 4", Config{RecvBuffers: 4}, func(c Config) int { return c.RecvBuffers }, 4},
		{"SendBuffers 1", Config{SendBuffers: 1}, func(c Config) int { return c.SendBuffers }, 2},
		{"SendBuffers -1", Config{SendBuffers: -1}, func(c Config) int { return c.SendBuffers }, 2},
		{"BufferSize 10", Config{BufferSize: 10}, func(c Config) int { return c.BufferSize }, 64},
		{"BufferSize 65", Config{BufferSize: 65}, func(c Config) int { return c.BufferSize }, 65},
		{"RetryCount -1", Config{RetryCount: -1}, func(c Config) int { return c.RetryCount }, 1},
		{"RetryCount 9", Config{RetryCount: 9}, func(c Config) int { return c.RetryCount }, 7},
		{"RetryCount 1", Config{RetryCount: 1}, func(c Config) int { return c.RetryCount }, 1},
		{"Backlog -3", Config{Backlog: -3}, func(c Config) int { return c.Backlog }, 1},
	} {
		if got := tc.get(tc.in.withDefaults()); got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, got, tc.want)
		}
	}
}

// A negative PollSpin means PollEvent, whatever PollMode says.
func TestConfigNegativeSpinMeansEvent(t *testing.T) {
	for _, mode := range []PollMode{PollAdaptive, PollBusy, PollEvent} {
		got := (&Config{PollMode: mode, PollSpin: -1}).withDefaults()
		if got.PollMode != PollEvent {
			t.Errorf("PollMode %d with PollSpin -1: mode %d, want PollEvent", mode, got.PollMode)
		}
		if pc := got.pollerConfig(); pc.Mode != poller.Event {
			t.Errorf("PollMode %d with PollSpin -1: poller mode %v, want %v", mode, pc.Mode, poller.Event)
		}
	}
}

func TestPollerConfig(t *testing.T) {
	for mode, want := range map[PollMode]poller.Mode{
		PollAdaptive: poller.Adaptive,
		PollBusy:     poller.Busy,
		PollEvent:    poller.Event,
	} {
		cfg := (&Config{PollMode: mode, PollSpin: 7 * time.Microsecond, Pollers: 3, PollCPUs: []int{5, 4}, PollNoPin: true}).withDefaults()
		got := cfg.pollerConfig()
		wantCfg := poller.Config{Pollers: 3, CPUs: []int{5, 4}, Mode: want, Spin: 7 * time.Microsecond, NoPin: true}
		if !reflect.DeepEqual(got, wantCfg) {
			t.Errorf("PollMode %d:\n got %+v\nwant %+v", mode, got, wantCfg)
		}
	}
	// The zero Config's poller settings: the poller's own zero values
	// (one poller, CPUs from the topology) and the documented spin.
	zeroCfg := (&Config{}).withDefaults()
	got := zeroCfg.pollerConfig()
	if want := (poller.Config{Mode: poller.Adaptive, Spin: 50 * time.Microsecond}); !reflect.DeepEqual(got, want) {
		t.Errorf("zero Config: got %+v, want %+v", got, want)
	}
}

// The zero values Config resolves outside withDefaults: MaxMessageSize (the
// pool's largest buffer, 4 MiB or BufferSize if larger) and PoolMaxBytes
// (the buffer pool's default) come from the pool poolClasses describes.
func TestConfigZeroResolvedLater(t *testing.T) {
	for _, tc := range []struct {
		bufSize, maxSize int
	}{
		{documentedDefaults.BufferSize, 4 << 20},
		{64, 4 << 20},
		{4 << 20, 4 << 20},
		{8 << 20, 8 << 20},
	} {
		cfg := (&Config{BufferSize: tc.bufSize}).withDefaults()
		pool, err := buffer.NewPool(nil, buffer.Options{MaxBytes: cfg.PoolMaxBytes, Classes: poolClasses(cfg.BufferSize)})
		if err != nil {
			t.Fatalf("BufferSize %d: a pool with the default PoolMaxBytes: %v", tc.bufSize, err)
		}
		if got := pool.MaxSize(); got != tc.maxSize {
			t.Errorf("BufferSize %d: largest pool buffer (the default MaxMessageSize) %d, want %d", tc.bufSize, got, tc.maxSize)
		}
		pool.Close()
	}
}

func TestPoolClasses(t *testing.T) {
	powers := []int{256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20}
	if got := poolClasses(32 << 10); !slices.Equal(got, []int{256, 1 << 10, 4 << 10, 16 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20}) {
		t.Fatalf("poolClasses(32 KiB) = %v", got)
	}
	for _, bs := range []int{64, 65, 100, 255, 256, 257, 1000, 1 << 10, 4097, 32 << 10, 1<<20 + 1, 3 << 20, 4 << 20, 4<<20 + 1, 16 << 20} {
		got := poolClasses(bs)
		// The buffer pool's own rule: positive and strictly ascending.
		if _, err := buffer.NewPool(nil, buffer.Options{Classes: got, MaxBytes: 1 << 30}); err != nil {
			t.Errorf("poolClasses(%d) = %v: %v", bs, got, err)
		}
		// The connections' buffer size is a class, so their rings waste nothing.
		if !slices.Contains(got, bs) {
			t.Errorf("poolClasses(%d) = %v: the buffer size is not a class", bs, got)
		}
		// Every power of four from 256 B to 4 MiB stays, and nothing else is added.
		for _, p := range powers {
			if !slices.Contains(got, p) {
				t.Errorf("poolClasses(%d) = %v: %d missing", bs, got, p)
			}
		}
		if want := len(powers) + 1; !slices.Contains(powers, bs) && len(got) != want {
			t.Errorf("poolClasses(%d) = %v: %d classes, want %d", bs, got, len(got), want)
		}
		if slices.Contains(powers, bs) && len(got) != len(powers) {
			t.Errorf("poolClasses(%d) = %v: a power of four added twice", bs, got)
		}
	}
}

func TestAddr(t *testing.T) {
	for _, tc := range []struct {
		ap   string
		want string
	}{
		{"192.168.1.10:7471", "192.168.1.10:7471"},
		{"[fe80::1%rd0]:1", "[fe80::1%rd0]:1"},
		{"[::1]:0", "[::1]:0"},
	} {
		a := &Addr{netip.MustParseAddrPort(tc.ap)}
		if a.Network() != "rdma" || a.String() != tc.want {
			t.Errorf("Addr(%s): %q %q", tc.ap, a.Network(), a.String())
		}
	}
	var nilAddr *Addr
	if nilAddr.String() != "<nil>" {
		t.Errorf("nil *Addr: %q", nilAddr.String())
	}
	var _ net.Addr = nilAddr
}
