//go:build linux && cgo

package device

import (
	"slices"
	"testing"

	"github.com/verbline/rdma/buffer"
)

func TestPoolClasses(t *testing.T) {
	powers := []int{256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20}
	if got := PoolClasses(32 << 10); !slices.Equal(got, []int{256, 1 << 10, 4 << 10, 16 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20}) {
		t.Fatalf("PoolClasses(32 KiB) = %v", got)
	}
	for _, bs := range []int{64, 65, 100, 255, 256, 257, 1000, 1 << 10, 4097, 32 << 10, 1<<20 + 1, 3 << 20, 4 << 20, 4<<20 + 1, 16 << 20} {
		got := PoolClasses(bs)
		// The buffer pool's own rule: positive and strictly ascending.
		if _, err := buffer.NewPool(nil, buffer.Options{Classes: got, MaxBytes: 1 << 30}); err != nil {
			t.Errorf("PoolClasses(%d) = %v: %v", bs, got, err)
		}
		// The connections' buffer size is a class, so their rings waste nothing.
		if !slices.Contains(got, bs) {
			t.Errorf("PoolClasses(%d) = %v: the buffer size is not a class", bs, got)
		}
		// Every power of four from 256 B to 4 MiB stays, and nothing else is added.
		for _, p := range powers {
			if !slices.Contains(got, p) {
				t.Errorf("PoolClasses(%d) = %v: %d missing", bs, got, p)
			}
		}
		if want := len(powers) + 1; !slices.Contains(powers, bs) && len(got) != want {
			t.Errorf("PoolClasses(%d) = %v: %d classes, want %d", bs, got, len(got), want)
		}
		if slices.Contains(powers, bs) && len(got) != len(powers) {
			t.Errorf("PoolClasses(%d) = %v: a power of four added twice", bs, got)
		}
	}
}
