//go:build linux && cgo

package device

import (
	"testing"

	"github.com/verbline/rdma/internal/verbs"
)

// The pool's bookkeeping, with QP structures that hold no kernel QP
// (Close frees nothing) and a fake state.
func testPool(states map[*verbs.QP]verbs.QPState) *QPPool {
	return &QPPool{state: func(q *verbs.QP) verbs.QPState { return states[q] }}
}

func TestQPPoolBookkeeping(t *testing.T) {
	states := map[*verbs.QP]verbs.QPState{}
	pl := testPool(states)
	a, b := QPShape{SendWR: 64, RecvWR: 32, Inline: 64}, QPShape{SendWR: 64, RecvWR: 32}
	if _, ok := pl.Get(a); ok {
		t.Fatal("an empty pool gave a QP")
	}
	q1, q2, q3 := &verbs.QP{Num: 1}, &verbs.QP{Num: 2}, &verbs.QP{Num: 3}
	if !pl.Put(a, PooledQP{QP: q1}, 2) || !pl.Put(b, PooledQP{QP: q2}, 2) {
		t.Fatal("a pool with room refused a QP in RESET")
	}
	if pl.Put(a, PooledQP{QP: q3}, 2) {
		t.Fatal("a full pool took a QP")
	}
	states[q3] = verbs.StateErr
	if pl.Put(a, PooledQP{QP: q3}, 3) {
		t.Fatal("the pool took a QP not in RESET")
	}
	// Shapes do not mix.
	if q, ok := pl.Get(b); !ok || q.QP != q2 {
		t.Fatalf("Get(b) = %v, %v; want QP 2", q.QP, ok)
	}
	if _, ok := pl.Get(b); ok {
		t.Fatal("Get(b) gave a QP of another shape")
	}
	pl.Count(func(st *QPPoolStats) { st.Created++ })
	st, n := pl.Stats()
	if want := (QPPoolStats{Created: 1, Reused: 1, Returned: 2, Destroyed: 2}); st != want || n != 1 || pl.Len() != 1 {
		t.Fatalf("stats %+v, %d pooled; want %+v, 1", st, n, want)
	}
	var seen []uint32
	pl.Each(func(q PooledQP) { seen = append(seen, q.QP.Num) })
	if len(seen) != 1 || seen[0] != 1 {
		t.Fatalf("Each saw %v, want [1]", seen)
	}
	// Empty keeps the pool open; Drain closes it.
	if err := pl.Empty(); err != nil || pl.Len() != 0 || pl.Closed() {
		t.Fatalf("Empty: %v, %d left, closed %v", err, pl.Len(), pl.Closed())
	}
	if !pl.Put(a, PooledQP{QP: q1}, 2) {
		t.Fatal("an emptied pool refused a QP")
	}
	if err := pl.Drain(); err != nil || pl.Len() != 0 || !pl.Closed() {
		t.Fatalf("Drain: %v, %d left, closed %v", err, pl.Len(), pl.Closed())
	}
	if st, _ := pl.Stats(); st.Drained != 1 {
		t.Fatalf("drained %d, want 1 (Empty does not count as drained)", st.Drained)
	}
	if pl.Put(a, PooledQP{QP: q1}, 2) {
		t.Fatal("a drained pool took a QP")
	}
}
