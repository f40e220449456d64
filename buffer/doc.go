// Package buffer provides memory for RDMA: large arenas mapped outside the Go
// heap (the NIC reads and writes them while Go's collector must not move or
// scan them), backed by 2 MiB huge pages when the system has them reserved,
// else transparent huge pages, else ordinary 4 KiB pages.
//
// A Pool carves arenas into buffers of a few size classes. Each arena is
// registered once with a protection domain through a Registrar, so every
// buffer carries the keys and device address the NIC needs. Get and Release
// take no lock and allocate nothing once the pool has warmed up; only a Get
// that needs a new arena takes the pool's mutex. Registering an arena takes
// milliseconds, so code that must not stall takes buffers with TryGet
// (never registers) and leaves the registration to Grow, run elsewhere.
//
// The package builds on every system Go supports, so code that holds Bufs
// compiles, and its tests run, on a laptop too. Only Linux has huge pages
// here (PagesHugeTLB2M, PagesTHP); other Unix systems map ordinary pages, and
// systems without mmap (Windows) take arenas from the Go heap, which the
// collector does not move. RDMA itself (the package rdma) needs Linux.
//
// # How long a Buf's bytes stay valid
//
// A Buf is a small value handle. Its bytes (Bytes, Full) belong to the
// holders of its references until the last Release; from then on the handle
// is stale and the memory belongs to whoever gets the buffer next. A stale
// handle is detected by a generation number: Bytes and Full return nil,
// Len, Cap, Addr and the keys return 0, and Release, Retain, SetLen,
// SetRecycler and Free return an error wrapping ErrReleased (in a test binary
// they panic with it, so the faulty line shows up). Slices taken from Bytes
// before the last Release are not tracked: do not keep them past it.
// Pool.Close unmaps every arena and makes every handle stale.
//
// The generation is 32 bits, so a handle kept across 2^32 reuses of the same
// buffer would no longer be recognised as stale; detection is a debugging
// aid, not a safety guarantee.
package buffer
