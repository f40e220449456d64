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

// CompareAndSwap compares the 8-byte word at offset in the peer's export
// with compare and, if equal, replaces it with swap, atomically in the
// peer's NIC; it returns the word's value before (equal to compare when
// the swap took place). It waits, like ReadRemote, for the NIC's answer
// (bounded by ctx and the write deadline).
//
// offset must be a multiple of 8 inside the descriptor's range, and the
// export must have been given RemoteAtomic; a misaligned or out-of-range
// offset is refused here (ErrRemoteAccess) before anything is posted, and
// the connection is unharmed. A descriptor the peer's NIC refuses (no
// RemoteAtomic, another connection's, a closed export) fails with
// ErrRemoteAccess and, as RC requires, ends the connection. Where either
// device has no atomics, or the peer runs a release without them, the
// call fails at once with an error wrapping errors.ErrUnsupported; on a
// TCP-backed connection it returns ErrNotRDMA.
func (c *Conn) CompareAndSwap(ctx context.Context, remote RemoteBuf, offset, compare, swap uint64) (uint64, error) {
	if c.tcp != nil {
		return 0, c.tcp.notRDMA("compare and swap")
	}
	return c.atomic(ctx, "compare and swap", verbs.OpAtomicCompareSwap, remote, offset, compare, swap, false, 0)
}

// FetchAdd adds add to the 8-byte word at offset in the peer's export,
// atomically in the peer's NIC (wrapping modulo 2^64), and returns the
// word's value before. Its rules are CompareAndSwap's.
func (c *Conn) FetchAdd(ctx context.Context, remote RemoteBuf, offset, add uint64) (uint64, error) {
	if c.tcp != nil {
		return 0, c.tcp.notRDMA("fetch and add")
	}
	return c.atomic(ctx, "fetch and add", verbs.OpAtomicFetchAdd, remote, offset, add, 0, false, 0)
}

// PostCompareAndSwap starts CompareAndSwap and returns once it is posted;
// its end arrives on Completions() (or RecvCompletion) with id, the old
// value in OpCompletion.Value. More atomics and READs may be posted than
// the connection's READ depth (Config.ReadDepth): the NIC holds the extra
// ones until answers return; none fails for it.
func (c *Conn) PostCompareAndSwap(remote RemoteBuf, offset, compare, swap, id uint64) error {
	if c.tcp != nil {
		return c.tcp.notRDMA("compare and swap")
	}
	_, err := c.atomic(context.Background(), "compare and swap", verbs.OpAtomicCompareSwap, remote, offset,
		compare, swap, true, id)
	return err
}

// PostFetchAdd starts FetchAdd; its end arrives on Completions() (or
// RecvCompletion) with id, the old value in OpCompletion.Value.
func (c *Conn) PostFetchAdd(remote RemoteBuf, offset, add, id uint64) error {
	if c.tcp != nil {
		return c.tcp.notRDMA("fetch and add")
	}
	_, err := c.atomic(context.Background(), "fetch and add", verbs.OpAtomicFetchAdd, remote, offset, add, 0, true, id)
	return err
}

// atomicsUnsupported says why this connection cannot make or accept
// atomics, or returns nil.
func (c *Conn) atomicsUnsupported() error {
	if c.dev.attr.Atomics == verbs.AtomicNone {
		return fmt.Errorf("%w: RDMA atomics: device %s has none (atomic_cap none, as iWARP devices); "+
			"keep the word behind a lock of the application's, or update it with messages",
			errors.ErrUnsupported, c.dev.ctx.Name())
	}
	if c.features&wire.FeatureAtomics == 0 {
		return fmt.Errorf("%w: RDMA atomics: the peer does not accept them (its device has none, "+
			"or it runs a release older than wire protocol 1.3)", errors.ErrUnsupported)
	}
	return nil
}

// announced is the feature set this side's Hello announces: all it knows,
// less atomics where the device has none.
func (c *Conn) announced() wire.Features {
	f := wire.Supported
	if c.dev.attr.Atomics == verbs.AtomicNone {
		f &^= wire.FeatureAtomics
	}
	return f
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

func (c *Conn) atomic(ctx context.Context, op string, opcode uint32, remote RemoteBuf, offset, compareAdd, swap uint64,
	async bool, id uint64) (uint64, error) {
	if err := c.atomicsUnsupported(); err != nil {
		return 0, c.opError(op, err)
	}
	if err := checkAtomicTarget(remote, offset); err != nil {
		return 0, c.opError(op, err)
	}
	if err := c.atomicResults(); err != nil {
		return 0, c.opError(op, err)
	}
	return c.postOneSided(ctx, op, op, verbs.SendWR{Opcode: opcode, RemoteAddr: remote.Addr + offset, RKey: remote.RKey,
		CompareAdd: compareAdd, Swap: swap}, buffer.Buf{}, async, id)
}

// atomicResults makes sure the connection has its atomics' result buffer:
// 8 bytes per operation slot, registered (the NIC writes the old values
// there), taken from the pool outside c.mu at the first atomic.
func (c *Conn) atomicResults() error {
	c.mu.Lock()
	have := c.atomicRes.Valid()
	c.mu.Unlock()
	if have {
		return nil
	}
	b, err := c.dev.pool.Get(c.ep.maxOps * atomicWordSize)
	if err != nil {
		return fmt.Errorf("a buffer for the atomics' results: %w", err)
	}
	c.mu.Lock()
	if c.atomicRes.Valid() || c.released { // another caller was first, or the connection is gone
		c.mu.Unlock()
		b.Release()
		return nil
	}
	c.atomicRes = b
	c.mu.Unlock()
	return nil
}

// atomicResult reads the old value the NIC wrote for the atomic in slot
// idx (whose completion the poller holds: the write came before it).
func atomicResult(res []byte, idx int) uint64 {
	return binary.NativeEndian.Uint64(res[idx*atomicWordSize:])
}
