package rdma

import (
	"net"
	"net/netip"
	"reflect"
	"testing"
	"time"
)

// The defaults Config documents for each zero value, as withDefaults applies
// them. Fields whose zero value is resolved elsewhere (MaxMessageSize,
// Pollers, PollCPUs, PoolMaxBytes: see TestConfigZeroResolvedLater in device_test.go) stay 0.
var documentedDefaults = Config{
	RecvBuffers:    64,
	SendBuffers:    64,
	BufferSize:     32 << 10,
	MaxUnreadBytes: 16 << 20,
	ConnectTimeout: 15 * time.Second,
	CloseTimeout:   5 * time.Second,
	RetryCount:     6,
	RNRRetry:       6,
	ReadDepth:      16,
	KeepAlive:      15 * time.Second,
	PollMode:       PollAdaptive,
	PollSpin:       50 * time.Microsecond,
	Backlog:        128,
	// HandshakeTimeout: "0 means 5 s".
	HandshakeTimeout: 5 * time.Second,
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
		RecvBuffers: 16, SendBuffers: 8, BufferSize: 4096, MaxMessageSize: 1 << 20, MaxUnreadBytes: 1 << 20,
		ConnectTimeout: time.Second, CloseTimeout: 2 * time.Second, RetryCount: 3,
		KeepAlive: -1, AckTimeout: 65 * time.Millisecond, RNRRetry: 1, ReadDepth: 3, MinRNRTimer: time.Millisecond,
		MaxPathMTU: 2048, ServiceLevel: 3, TrafficClass: 104,
		PollMode: PollBusy, PollSpin: time.Millisecond, Pollers: 2, PollCPUs: []int{3, 1},
		PollNoPin: true, PoolMaxBytes: 64 << 20, Backlog: 7, HandshakeTimeout: 3 * time.Second,
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
		{"RetryCount 1", Config{RetryCount: 1}, func(c Config) int { return c.RetryCount }, 1},
		{"RNRRetry 2", Config{RNRRetry: 2}, func(c Config) int { return c.RNRRetry }, 2},
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

func TestAckTimeoutExp(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want uint8
	}{
		{time.Nanosecond, 1}, {8192 * time.Nanosecond, 1}, {8193 * time.Nanosecond, 2},
		{30 * time.Millisecond, 13}, {time.Second, 18}, {1073741824 * time.Nanosecond, 18},
		{1073741825 * time.Nanosecond, 19}, {100 * time.Hour, 31},
	} {
		if got := ackTimeoutExp(tc.d); got != tc.want {
			t.Errorf("ackTimeoutExp(%v) = %d (%v), want %d (%v)", tc.d, got, ackTimeoutOf(got), tc.want, ackTimeoutOf(tc.want))
		}
	}
}
