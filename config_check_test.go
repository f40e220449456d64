package rdma

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// Each transport setting out of its range fails Dial and Listen with a
// *ConfigError naming the field and the range, before any device work (so
// on any host); the edges of each range pass the check.
func TestConfigRanges(t *testing.T) {
	for _, tc := range []struct {
		field string
		cfg   Config
		want  string // in the message, beside "Config.<field>"
	}{
		{"AckTimeout", Config{AckTimeout: -time.Second}, "4.096 µs x 2^31"},
		{"AckTimeout", Config{AckTimeout: maxAckTimeout + 1}, "rounded up"},
		{"RetryCount", Config{RetryCount: 7}, "retry forever on some devices (Soft-RoCE among them)"},
		{"RetryCount", Config{RetryCount: 8}, "want 1..6 (0 means 6)"},
		{"RetryCount", Config{RetryCount: -1}, "want 1..6 (0 means 6)"},
		{"ReadDepth", Config{ReadDepth: 256}, "want 0 (16) or 1..255"},
		{"ReadDepth", Config{ReadDepth: -1}, "want 0 (16) or 1..255"},
		{"RNRRetry", Config{RNRRetry: 7}, "retry forever"},
		{"RNRRetry", Config{RNRRetry: 9}, "want 1..6 (0 means 6)"},
		{"RNRRetry", Config{RNRRetry: -2}, "want 1..6"},
		{"MinRNRTimer", Config{MinRNRTimer: -time.Millisecond}, "655.36 ms"},
		{"MinRNRTimer", Config{MinRNRTimer: 656 * time.Millisecond}, "RNR NAK timer table"},
		{"MaxPathMTU", Config{MaxPathMTU: 255}, "256..4096"},
		{"MaxPathMTU", Config{MaxPathMTU: 8192}, "256..4096"},
		{"MaxPathMTU", Config{MaxPathMTU: -1}, "256..4096"},
		{"ServiceLevel", Config{ServiceLevel: 16}, "0..15"},
		{"ServiceLevel", Config{ServiceLevel: -1}, "0..15"},
		{"TrafficClass", Config{TrafficClass: 256}, "0..255"},
		{"TrafficClass", Config{TrafficClass: -1}, "0..255"},
	} {
		check := func(what string, err error) {
			t.Helper()
			var ce *ConfigError
			var oe *net.OpError
			if !errors.As(err, &ce) || ce.Field != tc.field || !errors.As(err, &oe) {
				t.Errorf("%s with %s %+v: %v, want a *ConfigError for %s in a *net.OpError", what, tc.field, tc.cfg, err, tc.field)
				return
			}
			if msg := err.Error(); !strings.Contains(msg, "Config."+tc.field) || !strings.Contains(msg, tc.want) {
				t.Errorf("%s: %q lacks Config.%s or %q", what, msg, tc.field, tc.want)
			}
		}
		d := Dialer{Config: tc.cfg}
		_, err := d.DialContext(context.Background(), "rdma", "169.254.0.1:7471")
		check("Dial", err)
		lc := ListenConfig{Config: tc.cfg}
		ln, err := lc.Listen(context.Background(), "rdma", "169.254.0.1:0")
		if ln != nil {
			ln.Close()
		}
		check("Listen", err)
		p, err := lc.ListenPacket(context.Background(), "rdma", "169.254.0.1:0")
		if p != nil {
			p.Close()
		}
		check("ListenPacket", err)
	}
	for _, ok := range []Config{
		{}, {AckTimeout: maxAckTimeout}, {AckTimeout: time.Nanosecond}, {RetryCount: 1}, {RetryCount: 6}, {ReadDepth: 1}, {ReadDepth: 255},
		{RNRRetry: 1}, {RNRRetry: 6}, {MinRNRTimer: time.Nanosecond}, {MinRNRTimer: maxMinRNRTimer},
		{MaxPathMTU: 256}, {MaxPathMTU: 4096}, {MaxPathMTU: 1500}, {ServiceLevel: 15}, {TrafficClass: 255},
	} {
		if err := ok.check(); err != nil {
			t.Errorf("%+v refused: %v", ok, err)
		}
	}
	var nilCfg *Config
	if err := nilCfg.check(); err != nil {
		t.Errorf("nil Config: %v", err)
	}
}

// Durations are rounded up to the RNR NAK timer table; code 0 is its
// longest entry.
func TestRNRTimerCode(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want uint8
	}{
		{time.Nanosecond, 1}, {10 * time.Microsecond, 1}, {11 * time.Microsecond, 2},
		{50 * time.Microsecond, 5}, {640 * time.Microsecond, 12}, {time.Millisecond, 14},
		{491520 * time.Microsecond, 31}, {491521 * time.Microsecond, 0}, {maxMinRNRTimer, 0},
	} {
		if got := rnrTimerCode(tc.d); got != tc.want {
			t.Errorf("rnrTimerCode(%v) = %d (%v), want %d (%v)", tc.d, got, rnrTimerOf(got), tc.want, rnrTimerOf(tc.want))
		}
	}
	for code := 2; code < 32; code++ { // the table grows from code 1 to 31, and code 0 tops it
		if rnrTimerTable[code] <= rnrTimerTable[code-1] || rnrTimerTable[code] >= rnrTimerTable[0] {
			t.Errorf("table not monotonic at code %d", code)
		}
	}
}

func TestMTUCode(t *testing.T) {
	for _, tc := range []struct{ bytes, want int }{
		{256, 1}, {511, 1}, {512, 2}, {1024, 3}, {1500, 3}, {2048, 4}, {4095, 4}, {4096, 5},
	} {
		if got := mtuCode(tc.bytes); int(got) != tc.want {
			t.Errorf("mtuCode(%d) = %d, want %d", tc.bytes, got, tc.want)
		}
	}
}

func TestQPInfoString(t *testing.T) {
	i := QPInfo{QPN: 0x11, DestQPN: 0x12, State: "RTS", PathMTU: 1024, AckTimeout: ackTimeoutOf(19), TimeoutExp: 19,
		RetryCount: 6, RNRRetry: 6, MinRNRTimer: rnrTimerOf(0), SendPSN: 0x5f2b1, RecvPSN: 0xc1a2, MaxInline: 256}
	want := "QP 0x11 -> 0x12 RTS mtu 1024 timeout 2.147483648s (n=19) retry_cnt 6 rnr_retry 6 " +
		"min_rnr_timer 655.36ms (code 0) sq_psn 0x5f2b1 rq_psn 0xc1a2 sl 0 tc 0 max_inline 256"
	if got := i.String(); got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

// TestMaxUnreadBytesRange: a negative Config.MaxUnreadBytes fails Dial and
// Listen with a *ConfigError naming the field; 0 means 16 MiB.
func TestMaxUnreadBytesRange(t *testing.T) {
	cfg := Config{MaxUnreadBytes: -1}
	d := Dialer{Config: cfg}
	_, err := d.DialContext(context.Background(), "rdma", "169.254.0.1:7471")
	lc := ListenConfig{Config: cfg}
	ln, lerr := lc.Listen(context.Background(), "rdma", "169.254.0.1:0")
	if ln != nil {
		ln.Close()
	}
	for _, err := range []error{err, lerr} {
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != "MaxUnreadBytes" || !strings.Contains(err.Error(), "a positive number of bytes") {
			t.Errorf("%v, want a *ConfigError for MaxUnreadBytes", err)
		}
	}
	if got := (&Config{}).withDefaults().MaxUnreadBytes; got != 16<<20 {
		t.Errorf("zero MaxUnreadBytes resolves to %d, want 16 MiB", got)
	}
}
