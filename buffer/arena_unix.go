//go:build unix && !linux

package buffer

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// mapArena maps size bytes of ordinary pages. Outside Linux there is no RDMA
// (the package rdma needs Linux), so the arena only has to behave as one:
// memory outside the Go heap, unmapped by Close.
func mapArena(size, _ int) (*Arena, error) {
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("buffer: mmap %d bytes: %w", size, err)
	}
	return &Arena{mem: mem, kind: Pages4K}, nil
}

// unmapArena unmaps what mapArena mapped.
func unmapArena(mem []byte) error { return unix.Munmap(mem) }
