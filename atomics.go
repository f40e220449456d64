//go:build linux && cgo

package rdma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// RDMA atomics on exported memory: compare-and-swap and fetch-and-add of
// one 8-byte word of a peer's export given RemoteAtomic, executed by the
// peer's NIC without its CPU.
//
// The atomicity domain is the device's (atomic_cap HCA on Soft-RoCE and
// most NICs): an atomic is atomic against every other RDMA atomic through
// the same device, from any connection, and against nothing else. The
// exporter's CPU (its own sync/atomic operations, plain writes) and RDMA
// writes to the same word may interleave with it, and a READ may see the
// word before or after it. So the owner of an export that peers update
// with atomics should only read the word (or update it through an atomic
// of its own, over a connection to itself through the same device), and
// peers should not mix WriteRemote with atomics on one word.
//
// The word is in the exporter's byte order as the verbs define it: the
// NIC adds to and compares the 8 bytes as an integer of the exporter's
// host order (little-endian on x86 and arm64), and the old value arrives
// in the initiator's host order. Old values land in 8 bytes per operation
// slot of a registered buffer the connection owns (atomicRes), taken from
// the device's pool at the connection's first atomic.
//
// An atomic in flight when the connection ends may or may not have been
// executed by the peer's NIC: its call returns an error (the connection's,
// or ErrClosed) and its effect is unknown, as for a write.

// atomicWordSize is the size and alignment of the word an atomic works on.
const atomicWordSize = 8

// atomicsUnsupported says why this connection cannot make or accept
// atomics, or returns nil.
func (c *engine) atomicsUnsupported() error {
	if c.dev.Caps.Atomics == verbs.AtomicNone {
		return fmt.Errorf("%w: RDMA atomics: device %s has none (atomic_cap none, as iWARP devices); "+
			"keep the word behind a lock of the application's, or update it with messages",
			errors.ErrUnsupported, c.dev.Name())
	}
	if c.features&wire.FeatureAtomics == 0 {
		return fmt.Errorf("%w: RDMA atomics: the peer does not accept them (its device has none, "+
			"or it runs a release older than wire protocol 1.3)", errors.ErrUnsupported)
	}
	return nil
}

// checkAtomicTarget refuses, before anything is posted, an atomic the
// peer's NIC would refuse for its address: outside the descriptor's range,
// or not 8-byte aligned.
func checkAtomicTarget(remote RemoteBuf, offset uint64) error {
	if offset > uint64(remote.Len) || uint64(remote.Len)-offset < atomicWordSize {
		return fmt.Errorf("%w: an 8-byte word at offset %d of a %d-byte export", ErrRemoteAccess, offset, remote.Len)
	}
	if (remote.Addr+offset)%atomicWordSize != 0 {
		return fmt.Errorf("%w: an atomic's word must be 8-byte aligned: offset %d of an export at 0x%x "+
			"(use an offset that is a multiple of 8)", ErrRemoteAccess, offset, remote.Addr)
	}
	return nil
}

// compareAndSwap is CompareAndSwap; async: PostCompareAndSwap.
func (c *engine) compareAndSwap(ctx context.Context, remote RemoteBuf, offset, compare, swap uint64, async bool,
	id uint64) (uint64, error) {
	return c.atomic(ctx, "compare and swap", verbs.OpAtomicCompareSwap, remote, offset, compare, swap, async, id)
}

// fetchAdd is FetchAdd; async: PostFetchAdd.
func (c *engine) fetchAdd(ctx context.Context, remote RemoteBuf, offset, add uint64, async bool, id uint64) (uint64, error) {
	return c.atomic(ctx, "fetch and add", verbs.OpAtomicFetchAdd, remote, offset, add, 0, async, id)
}

func (c *engine) atomic(ctx context.Context, name string, opcode uint32, remote RemoteBuf, offset, compareAdd, swap uint64,
	async bool, id uint64) (uint64, error) {
	if err := c.atomicsUnsupported(); err != nil {
		return 0, err
	}
	if err := checkAtomicTarget(remote, offset); err != nil {
		return 0, err
	}
	if err := c.atomicResults(); err != nil {
		return 0, err
	}
	return c.postOneSided(ctx, name, verbs.SendWR{Opcode: opcode, RemoteAddr: remote.Addr + offset, RKey: remote.RKey,
		CompareAdd: compareAdd, Swap: swap}, buffer.Buf{}, async, id)
}

// atomicResults makes sure the connection has its atomics' result buffer:
// 8 bytes per operation slot, registered (the NIC writes the old values
// there), taken from the pool outside c.mu at the first atomic.
func (c *engine) atomicResults() error {
	c.mu.Lock()
	have := c.rma.atomicRes.Valid()
	c.mu.Unlock()
	if have {
		return nil
	}
	b, err := c.dev.Pool.Get(c.ep.maxOps * atomicWordSize)
	if err != nil {
		return fmt.Errorf("a buffer for the atomics' results: %w", err)
	}
	c.mu.Lock()
	if c.rma.atomicRes.Valid() || c.released { // another caller was first, or the connection is gone
		c.mu.Unlock()
		b.Release()
		return nil
	}
	c.rma.atomicRes = b
	c.mu.Unlock()
	return nil
}

// atomicResult reads the old value the NIC wrote for the atomic in slot
// idx (whose completion the poller holds: the write came before it).
func atomicResult(res []byte, idx int) uint64 {
	return binary.NativeEndian.Uint64(res[idx*atomicWordSize:])
}
