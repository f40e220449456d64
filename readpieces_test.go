//go:build linux && cgo

package rdma

import "testing"

// TestReadPieces: the READs of a large message cover it exactly, in order,
// none above readChunk+readTail; above 2*readTail bytes the last is
// readTail bytes (one packet at any MTU), so that a loss in an earlier
// piece is noticed by its response, and every other is at least that; and
// there are no more pieces than readChunk-sized ones and the last need.
func TestReadPieces(t *testing.T) {
	for _, n := range []uint32{1, readTail, 2 * readTail, 2*readTail + 1, readChunk, readChunk + readTail - 1,
		readChunk + readTail, readChunk + readTail + 1, readChunk + 2*readTail, 2*readChunk + readTail,
		3*readChunk + 17, 1 << 20, 4<<20 + 3} {
		var pieces []uint32
		for off := uint32(0); off < n; {
			l := readPieceLen(off, n)
			if l == 0 || l >= readChunk+readTail {
				t.Fatalf("n=%d: piece at %d of %d bytes", n, off, l)
			}
			pieces = append(pieces, l)
			off += l
			if off > n {
				t.Fatalf("n=%d: pieces %v run past the end", n, pieces)
			}
		}
		if n <= 2*readTail {
			if len(pieces) != 1 {
				t.Errorf("n=%d: pieces %v, want one", n, pieces)
			}
			continue
		}
		if last := pieces[len(pieces)-1]; last != readTail {
			t.Errorf("n=%d: pieces %v: the last is not %d bytes", n, pieces, readTail)
		}
		for _, l := range pieces[:len(pieces)-1] {
			if l < readTail {
				t.Errorf("n=%d: pieces %v: one before the last is under %d bytes", n, pieces, readTail)
			}
		}
		if most := (n-readTail+readChunk-1)/readChunk + 1; uint32(len(pieces)) > most {
			t.Errorf("n=%d: %d pieces, more than %d", n, len(pieces), most)
		}
	}
}
