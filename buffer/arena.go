package buffer

import (
	"errors"
	"fmt"
	"math"
	"sync"
)

// PageKind says what backs an arena.
type PageKind int

const (
	Pages4K        PageKind = iota // ordinary pages
	PagesTHP                       // transparent huge pages requested with madvise
	PagesHugeTLB2M                 // reserved 2 MiB huge pages (MAP_HUGETLB)
)

func (k PageKind) String() string {
	switch k {
	case Pages4K:
		return "4KiB pages"
	case PagesTHP:
		return "transparent huge pages"
	case PagesHugeTLB2M:
		return "2MiB hugetlb pages"
	}
	return fmt.Sprintf("PageKind(%d)", int(k))
}

const hugePage = 2 << 20

// Arena is one mmap'd region (on systems without mmap, such as Windows, a Go
// heap allocation: see the package documentation).
type Arena struct {
	mu   sync.Mutex
	mem  []byte
	kind PageKind
}

// ErrReleased is returned when an arena or buffer is used after release.
var ErrReleased = errors.New("buffer: used after release")

// NewArena maps at least size bytes, preferring huge pages. With hugetlb the
// size is rounded up to 2 MiB. Huge pages are used on Linux only; other
// systems get ordinary pages.
func NewArena(size int) (*Arena, error) { return newArena(size, math.MaxInt) }

// newArena is NewArena that only takes hugetlb pages when the size rounded up
// to 2 MiB stays within limit (the pool's remaining MaxBytes), so rounding
// never pushes a pool past its cap; it falls back to THP or 4 KiB pages then.
func newArena(size, limit int) (*Arena, error) {
	if size <= 0 {
		return nil, fmt.Errorf("buffer: arena size %d", size)
	}
	return mapArena(size, limit)
}

// Bytes is the arena's memory; valid until Close.
func (a *Arena) Bytes() []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mem
}

// Kind reports what backs the arena.
func (a *Arena) Kind() PageKind { return a.kind }

// Close unmaps the arena. Idempotent. The caller must have deregistered it.
func (a *Arena) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mem == nil {
		return nil
	}
	err := unmapArena(a.mem)
	a.mem = nil
	if err != nil {
		return fmt.Errorf("buffer: munmap: %w", err)
	}
	return nil
}
