//go:build linux && cgo

package rdma

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/poller"
)

// Host tests of device.go's pure parts: the Config's share for the pollers
// and the buffer pool's size classes.

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
