package ud

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
)

// TestPeerCacheLRU: entries go least recently used first; replacing and
// removing report nothing to onEvict.
func TestPeerCacheLRU(t *testing.T) {
	ap := func(i int) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), uint16(i)) }
	var evicted []string
	c := NewPeerCache[int](3, func(k netip.AddrPort, v int) { evicted = append(evicted, fmt.Sprint(k.Port(), "=", v)) })
	order := func() []uint16 {
		var out []uint16
		c.Each(func(k netip.AddrPort, _ int) { out = append(out, k.Port()) })
		return out
	}
	for i := 1; i <= 3; i++ {
		c.Put(ap(i), i*10)
	}
	if !slices.Equal(order(), []uint16{3, 2, 1}) || c.Len() != 3 || len(evicted) != 0 {
		t.Fatalf("order %v, len %d, evicted %v", order(), c.Len(), evicted)
	}
	if v, ok := c.Get(ap(1)); !ok || v != 10 {
		t.Fatalf("get 1: %d %v", v, ok)
	}
	// 1 was used last: 2 is the least recently used and goes first.
	c.Put(ap(4), 40)
	if !slices.Equal(order(), []uint16{4, 1, 3}) || !slices.Equal(evicted, []string{"2=20"}) {
		t.Fatalf("after put 4: order %v, evicted %v", order(), evicted)
	}
	if _, ok := c.Get(ap(2)); ok {
		t.Fatal("evicted entry still found")
	}
	// Replacing a value neither evicts nor reports the old one.
	c.Put(ap(3), 33)
	if v, _ := c.Get(ap(3)); v != 33 || len(evicted) != 1 || !slices.Equal(order(), []uint16{3, 4, 1}) {
		t.Fatalf("replace: %d, evicted %v, order %v", v, evicted, order())
	}
	// remove does not report either.
	c.Remove(ap(4))
	c.Remove(ap(99))
	if c.Len() != 2 || len(evicted) != 1 || !slices.Equal(order(), []uint16{3, 1}) {
		t.Fatalf("remove: len %d, evicted %v, order %v", c.Len(), evicted, order())
	}
	// Many puts keep it at its bound, evicting in LRU order.
	for i := 10; i < 20; i++ {
		c.Put(ap(i), i)
	}
	if c.Len() != 3 || !slices.Equal(order(), []uint16{19, 18, 17}) || len(evicted) != 1+9 {
		t.Fatalf("bounded: len %d, order %v, %d evicted", c.Len(), order(), len(evicted))
	}
}

// TestPeerCacheKinds: a Put evicts the least recently used entry of either
// kind; a PutLearned evicts only learnt entries, keeps them within half the
// cache, and caches nothing when entries this side resolved fill it.
func TestPeerCacheKinds(t *testing.T) {
	ap := func(i int) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), uint16(i)) }
	var evicted []uint16
	c := NewPeerCache[int](4, func(k netip.AddrPort, _ int) { evicted = append(evicted, k.Port()) })
	c.Put(ap(1), 1)
	for i := 2; i <= 4; i++ {
		if !c.PutLearned(ap(i), i) {
			t.Fatalf("putLearned %d refused", i)
		}
	}
	// At most 4/2 learnt: 2 went for 4.
	if c.Len() != 3 || c.LenLearned() != 2 || !slices.Equal(evicted, []uint16{2}) {
		t.Fatalf("len %d, learnt %d, evicted %v", c.Len(), c.LenLearned(), evicted)
	}
	if c.PutLearned(ap(3), 33) {
		t.Fatal("putLearned replaced a cached entry")
	}
	c.Get(ap(1)) // 3 is now the least recently used
	c.Put(ap(5), 5)
	c.Put(ap(6), 6)
	if !slices.Equal(evicted, []uint16{2, 3}) || c.Len() != 4 {
		t.Fatalf("put: evicted %v, len %d", evicted, c.Len())
	}
	// A put of a learnt address makes it resolved.
	c.Put(ap(4), 44)
	if c.LenLearned() != 0 || c.Len() != 4 {
		t.Fatalf("after resolving 4: learnt %d, len %d", c.LenLearned(), c.Len())
	}
	if c.PutLearned(ap(7), 7) || c.Len() != 4 || len(evicted) != 2 {
		t.Fatalf("a full cache of resolved entries took a learnt one: len %d, evicted %v", c.Len(), evicted)
	}
	var order []uint16
	c.Each(func(k netip.AddrPort, _ int) { order = append(order, k.Port()) })
	if !slices.Equal(order, []uint16{4, 6, 5, 1}) {
		t.Fatalf("order %v", order)
	}
}
