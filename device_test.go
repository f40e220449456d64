//go:build linux && cgo

package rdma

import (
	"reflect"
	"testing"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/poller"
)

// Host tests of device.go's pure parts: the Config's share for the pollers
// and the defaults the device's buffer pool resolves.

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
	// A negative PollSpin means PollEvent for the pollers too.
	for _, mode := range []PollMode{PollAdaptive, PollBusy, PollEvent} {
		cfg := (&Config{PollMode: mode, PollSpin: -1}).withDefaults()
		if pc := cfg.pollerConfig(); pc.Mode != poller.Event {
			t.Errorf("PollMode %d with PollSpin -1: poller mode %v, want %v", mode, pc.Mode, poller.Event)
		}
	}
}

// The zero values Config resolves outside withDefaults: MaxMessageSize (the
// pool's largest buffer, 4 MiB or BufferSize if larger) and PoolMaxBytes
// (the buffer pool's default) come from the pool device.PoolClasses describes.
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
		pool, err := buffer.NewPool(nil, buffer.Options{MaxBytes: cfg.PoolMaxBytes, Classes: device.PoolClasses(cfg.BufferSize)})
		if err != nil {
			t.Fatalf("BufferSize %d: a pool with the default PoolMaxBytes: %v", tc.bufSize, err)
		}
		if got := pool.MaxSize(); got != tc.maxSize {
			t.Errorf("BufferSize %d: largest pool buffer (the default MaxMessageSize) %d, want %d", tc.bufSize, got, tc.maxSize)
		}
		pool.Close()
	}
}
