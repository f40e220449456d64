package poller

import (
	"sync"
	"testing"

	"github.com/verbline/rdma/internal/verbs"
)

type recorder struct {
	mu   sync.Mutex
	got  []uint64
	runs int
}

func (r *recorder) HandleCompletions(wcs []verbs.WC) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs++
	for _, wc := range wcs {
		r.got = append(r.got, wc.WRID)
	}
}

func wc(tok uint32, n uint64) verbs.WC { return verbs.WC{WRID: uint64(tok)<<TokenShift | n} }

func TestDispatchRuns(t *testing.T) {
	tb := newTable()
	a, b := &recorder{}, &recorder{}
	ta, tbk := tb.add(a), tb.add(b)
	if ta == 0 || tbk == 0 || ta == tbk {
		t.Fatalf("tokens %d %d", ta, tbk)
	}
	batch := []verbs.WC{wc(ta, 1), wc(ta, 2), wc(tbk, 3), wc(ta, 4), wc(99, 5)}
	if d := tb.dispatch(batch); d != 1 {
		t.Fatalf("dropped %d, want 1 (unknown token)", d)
	}
	if len(a.got) != 3 || a.got[0]&0xff != 1 || a.got[2]&0xff != 4 || a.runs != 2 {
		t.Fatalf("a got %v in %d runs", a.got, a.runs)
	}
	if len(b.got) != 1 || b.runs != 1 {
		t.Fatalf("b got %v", b.got)
	}
	tb.remove(ta)
	if d := tb.dispatch([]verbs.WC{wc(ta, 6)}); d != 1 {
		t.Fatal("completion for a removed handler was delivered")
	}
}

// Attaching and detaching while a poller dispatches is safe (run with -race).
func TestDispatchConcurrentAttach(t *testing.T) {
	tb := newTable()
	r := &recorder{}
	tok := tb.add(r)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tb.dispatch([]verbs.WC{wc(tok, uint64(i))})
		}
	}()
	for i := 0; i < 1000; i++ {
		tb.remove(tb.add(&recorder{}))
	}
	close(stop)
	wg.Wait()
	if len(r.got) == 0 {
		t.Fatal("the long-lived handler got nothing")
	}
}

func TestTokenReuseIsDelayed(t *testing.T) {
	tb := newTable()
	first := tb.add(&recorder{})
	tb.remove(first)
	if again := tb.add(&recorder{}); again == first {
		t.Fatal("a token was reused at once: a late completion could reach the wrong connection")
	}
}

func TestPickCPUs(t *testing.T) {
	cpus := PickCPUs(64)
	if len(cpus) == 0 {
		t.Fatal("no CPUs picked")
	}
	seen := map[int]bool{}
	for _, c := range cpus {
		if seen[c] {
			t.Fatalf("CPU %d picked twice: %v", c, cpus)
		}
		seen[c] = true
	}
	if one := PickCPUs(1); len(one) != 1 {
		t.Fatalf("PickCPUs(1) = %v", one)
	}
	t.Logf("poller CPUs in order of preference: %v", cpus)
}
