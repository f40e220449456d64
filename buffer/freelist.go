package buffer

import "sync/atomic"

// freeList is a lock-free (Treiber) stack of one size class's free slots.
//
// Slots are named by index rather than pointer so the head fits in one
// 64-bit word together with an ABA tag: head = tag<<32 | (index+1), 0 in the
// low half meaning empty. Every successful push or pop bumps the tag, so a
// pop that read head, slept while the slot was popped and pushed back, and
// then tries its CAS fails instead of installing a stale next.
type freeList struct {
	head  atomic.Uint64
	table atomic.Pointer[slotTable]
	per   int // slots per chunk (buffers per arena)
}

// slotTable maps indices to slots. Chunks (one per arena) never move, and the
// table itself is immutable: growing publishes a new table that shares the
// old chunks. So a reader needs only one atomic load and no lock, and a
// *slot handed out earlier stays valid forever.
type slotTable struct {
	chunks [][]slot
}

const emptyHead = 0

func (f *freeList) slot(i uint32) *slot {
	t := f.table.Load()
	return &t.chunks[int(i)/f.per][int(i)%f.per]
}

// pop takes a free slot, or returns nil if the list is empty.
func (f *freeList) pop() *slot {
	for {
		h := f.head.Load()
		i := uint32(h)
		if i == emptyHead {
			return nil
		}
		s := f.slot(i - 1)
		// s.next may be overwritten by a concurrent pop+push of s; then the
		// tag has moved on and the CAS below fails.
		next := s.next.Load()
		if f.head.CompareAndSwap(h, (h>>32+1)<<32|uint64(next)) {
			return s
		}
	}
}

// push returns one slot to the list.
func (f *freeList) push(s *slot) { f.pushChain(s, s) }

// pushChain pushes first..last, already linked through next, in one CAS.
func (f *freeList) pushChain(first, last *slot) {
	for {
		h := f.head.Load()
		last.next.Store(uint32(h))
		if f.head.CompareAndSwap(h, (h>>32+1)<<32|uint64(first.idx+1)) {
			return
		}
	}
}

// grow publishes a new chunk whose slots are already filled in, with indices
// starting at len(chunks())*per. Callers serialize grow with the pool's mutex.
func (f *freeList) grow(chunk []slot) {
	var chunks [][]slot
	if t := f.table.Load(); t != nil {
		chunks = make([][]slot, len(t.chunks), len(t.chunks)+1)
		copy(chunks, t.chunks)
	}
	f.table.Store(&slotTable{chunks: append(chunks, chunk)})
}

// chunks is the current table's chunks (for Close and Leaks).
func (f *freeList) chunks() [][]slot {
	if t := f.table.Load(); t != nil {
		return t.chunks
	}
	return nil
}
