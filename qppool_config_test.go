package rdma

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// Config.QPPool and Config.DeviceLinger: out of range, Dial and Listen fail
// with a *ConfigError naming the field before any device work; the edges
// pass; zero and negative values resolve to the documented default and off.
func TestQPPoolConfigRanges(t *testing.T) {
	for _, tc := range []struct {
		field string
		cfg   Config
		want  string
	}{
		{"QPPool", Config{QPPool: maxQPPool + 1}, "up to 4096 QPs per device"},
		{"DeviceLinger", Config{DeviceLinger: time.Hour + 1}, "up to 1h0m0s"},
	} {
		d := Dialer{Config: tc.cfg}
		_, err := d.DialContext(context.Background(), "rdma", "169.254.0.1:7471")
		lc := ListenConfig{Config: tc.cfg}
		ln, lerr := lc.Listen(context.Background(), "rdma", "169.254.0.1:0")
		if ln != nil {
			ln.Close()
		}
		for _, err := range []error{err, lerr} {
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%+v: %v, want a *ConfigError for %s saying %q", tc.cfg, err, tc.field, tc.want)
			}
		}
	}
	for _, ok := range []Config{{QPPool: maxQPPool}, {QPPool: -1}, {DeviceLinger: time.Hour}, {DeviceLinger: -1}} {
		if err := ok.check(); err != nil {
			t.Errorf("%+v refused: %v", ok, err)
		}
	}
	for _, tc := range []struct {
		cfg    Config
		pool   int
		linger time.Duration
	}{
		{Config{}, 64, 2 * time.Second},
		{Config{QPPool: -5, DeviceLinger: -time.Second}, 0, 0},
		{Config{QPPool: 3, DeviceLinger: time.Minute}, 3, time.Minute},
	} {
		if p, l := tc.cfg.qpPoolSize(), tc.cfg.deviceLinger(); p != tc.pool || l != tc.linger {
			t.Errorf("%+v: pool %d, linger %v; want %d, %v", tc.cfg, p, l, tc.pool, tc.linger)
		}
	}
}
