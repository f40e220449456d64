package buffer

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapArena maps size bytes: 2 MiB hugetlb pages when reserved ones are free
// (and the rounded-up size stays within limit), else an aligned mapping
// advised to use transparent huge pages, else ordinary pages.
func mapArena(size, limit int) (*Arena, error) {
	if size >= hugePage/2 {
		hsize := (size + hugePage - 1) &^ (hugePage - 1)
		// MAP_HUGE_2MB: the default huge page size may be 1 GiB; ask for 2 MiB
		// explicitly so PagesHugeTLB2M is true. Fails (ENOMEM) unless pages are
		// reserved (vm.nr_hugepages); MAP_POPULATE faults them in now.
		const flags = unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_HUGETLB | unix.MAP_HUGE_2MB | unix.MAP_POPULATE
		if hsize <= limit {
			if p, err := mmap(hsize, flags); err == nil {
				return &Arena{mem: unsafe.Slice((*byte)(p), hsize), kind: PagesHugeTLB2M}, nil
			}
		}
	}
	if size >= hugePage && thpAvailable() {
		if mem, err := mmapAligned(size); err == nil {
			if unix.Madvise(mem, unix.MADV_HUGEPAGE) == nil {
				return &Arena{mem: mem, kind: PagesTHP}, nil
			}
			return &Arena{mem: mem, kind: Pages4K}, nil
		}
	}
	p, err := mmap(size, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("buffer: mmap %d bytes: %w", size, err)
	}
	return &Arena{mem: unsafe.Slice((*byte)(p), size), kind: Pages4K}, nil
}

// unmapArena unmaps what mapArena mapped.
func unmapArena(mem []byte) error {
	return unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(mem)), uintptr(len(mem)))
}

// mmap goes through MmapPtr rather than unix.Mmap because mmapAligned unmaps
// parts of a mapping, which unix.Munmap (it tracks whole mappings) refuses.
func mmap(size, flags int) (unsafe.Pointer, error) {
	return unix.MmapPtr(-1, 0, nil, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, flags)
}

// mmapAligned maps size bytes starting on a 2 MiB boundary: the kernel backs
// only aligned 2 MiB extents with transparent huge pages, so an unaligned
// 4 MiB region would get one huge page instead of two. It over-maps by 2 MiB
// and unmaps the unaligned head and the tail.
func mmapAligned(size int) ([]byte, error) {
	total := size + hugePage
	p, err := mmap(total, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, err
	}
	head := int((hugePage - uintptr(p)%hugePage) % hugePage)
	if head > 0 {
		unix.MunmapPtr(p, uintptr(head))
	}
	if tail := total - head - size; tail > 0 {
		unix.MunmapPtr(unsafe.Add(p, head+size), uintptr(tail))
	}
	return unsafe.Slice((*byte)(unsafe.Add(p, head)), size), nil
}

var thp struct {
	once sync.Once
	ok   bool
}

// thpAvailable is false when THP is switched off ("[never]"): madvise still
// succeeds then, but no huge page would back the arena, and Stats must report
// what was actually obtained.
func thpAvailable() bool {
	thp.once.Do(func() {
		b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
		thp.ok = err == nil && !bytes.Contains(b, []byte("[never]"))
	})
	return thp.ok
}
