// Package buffer provides memory for RDMA: large arenas mapped outside the Go
// heap (the NIC reads and writes them while Go's collector must not move or
// scan them), backed by 2 MiB huge pages when the system has them reserved,
// else transparent huge pages, else ordinary 4 KiB pages.
package buffer

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// PageKind says what backs an arena.
type PageKind int

const (
	Pages4K        PageKind = iota // ordinary pages
	PagesTHP                       // transparent huge pages requested with madvise
	PagesHugeTLB2M                 // reserved 2 MiB huge pages (MAP_HUGETLB)
)

func (k PageKind) String() string {
	return [...]string{"4KiB pages", "transparent huge pages", "2MiB hugetlb pages"}[k]
}

const hugePage = 2 << 20

// Arena is one mmap'd region.
type Arena struct {
	mu   sync.Mutex
	mem  []byte
	kind PageKind
}

// ErrReleased is returned when an arena or buffer is used after release.
var ErrReleased = errors.New("buffer: used after release")

// NewArena maps at least size bytes, preferring huge pages. With hugetlb the
// size is rounded up to 2 MiB.
func NewArena(size int) (*Arena, error) {
	if size <= 0 {
		return nil, fmt.Errorf("buffer: arena size %d", size)
	}
	prot := unix.PROT_READ | unix.PROT_WRITE
	flags := unix.MAP_PRIVATE | unix.MAP_ANONYMOUS
	if size >= hugePage/2 {
		hsize := (size + hugePage - 1) &^ (hugePage - 1)
		if mem, err := unix.Mmap(-1, 0, hsize, prot, flags|unix.MAP_HUGETLB|unix.MAP_POPULATE); err == nil {
			return &Arena{mem: mem, kind: PagesHugeTLB2M}, nil
		}
	}
	mem, err := unix.Mmap(-1, 0, size, prot, flags)
	if err != nil {
		return nil, fmt.Errorf("buffer: mmap %d bytes: %w", size, err)
	}
	kind := Pages4K
	if size >= hugePage && unix.Madvise(mem, unix.MADV_HUGEPAGE) == nil {
		kind = PagesTHP
	}
	return &Arena{mem: mem, kind: kind}, nil
}

// Bytes is the arena's memory; valid until Close.
func (a *Arena) Bytes() []byte { return a.mem }

// Kind reports what backs the arena.
func (a *Arena) Kind() PageKind { return a.kind }

// Close unmaps the arena. Idempotent. The caller must have deregistered it.
func (a *Arena) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mem == nil {
		return nil
	}
	err := unix.Munmap(a.mem)
	a.mem = nil
	return err
}
