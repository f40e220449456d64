//go:build linux && cgo

package rdma

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
)

func TestPeerCacheLRU(t *testing.T) {
	ap := func(i int) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), uint16(i)) }
	var evicted []string
	c := newPeerCache[int](3, func(k netip.AddrPort, v int) { evicted = append(evicted, fmt.Sprint(k.Port(), "=", v)) })
	order := func() []uint16 {
		var out []uint16
		c.each(func(k netip.AddrPort, _ int) { out = append(out, k.Port()) })
		return out
	}
	for i := 1; i <= 3; i++ {
		c.put(ap(i), i*10)
	}
	if !slices.Equal(order(), []uint16{3, 2, 1}) || c.len() != 3 || len(evicted) != 0 {
		t.Fatalf("order %v, len %d, evicted %v", order(), c.len(), evicted)
	}
	if v, ok := c.get(ap(1)); !ok || v != 10 {
		t.Fatalf("get 1: %d %v", v, ok)
	}
	// 1 was used last: 2 is the least recently used and goes first.
	c.put(ap(4), 40)
	if !slices.Equal(order(), []uint16{4, 1, 3}) || !slices.Equal(evicted, []string{"2=20"}) {
		t.Fatalf("after put 4: order %v, evicted %v", order(), evicted)
	}
	if _, ok := c.get(ap(2)); ok {
		t.Fatal("evicted entry still found")
	}
	// Replacing a value neither evicts nor reports the old one.
	c.put(ap(3), 33)
	if v, _ := c.get(ap(3)); v != 33 || len(evicted) != 1 || !slices.Equal(order(), []uint16{3, 4, 1}) {
		t.Fatalf("replace: %d, evicted %v, order %v", v, evicted, order())
	}
	// remove does not report either.
	c.remove(ap(4))
	c.remove(ap(99))
	if c.len() != 2 || len(evicted) != 1 || !slices.Equal(order(), []uint16{3, 1}) {
		t.Fatalf("remove: len %d, evicted %v, order %v", c.len(), evicted, order())
	}
	// Many puts keep it at its bound, evicting in LRU order.
	for i := 10; i < 20; i++ {
		c.put(ap(i), i)
	}
	if c.len() != 3 || !slices.Equal(order(), []uint16{19, 18, 17}) || len(evicted) != 1+9 {
		t.Fatalf("bounded: len %d, order %v, %d evicted", c.len(), order(), len(evicted))
	}
}
