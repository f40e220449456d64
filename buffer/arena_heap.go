//go:build !unix

package buffer

// mapArena allocates size bytes on the Go heap: systems without mmap (Windows)
// have no RDMA through this module, so an arena there only has to hold bytes.
// Go's collector does not move heap objects, so Addr stays valid while the
// arena is open, as with a mapping.
func mapArena(size, _ int) (*Arena, error) {
	return &Arena{mem: make([]byte, size), kind: Pages4K}, nil
}

// unmapArena does nothing: Close drops the arena's reference and the collector
// frees the memory.
func unmapArena([]byte) error { return nil }
