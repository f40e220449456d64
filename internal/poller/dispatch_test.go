//go:build linux && cgo

package poller

import (
	"sync"
	"sync/atomic"
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
	ta, tbk := tb.add(a.HandleCompletions), tb.add(b.HandleCompletions)
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

// Attaching and detaching while a poller dispatches is safe (run with -race):
// every completion for a connection that stays attached reaches it, in order,
// and none reaches a connection that came and went meanwhile.
//
// The churn starts only once the dispatcher is running, and goes on until the
// dispatcher has made a number of passes during it: stopping after a fixed
// amount of churn could let the stop arrive before the dispatching goroutine
// was ever scheduled.
func TestDispatchConcurrentAttach(t *testing.T) {
	const minChurn, minPasses = 1000, 1000
	tb := newTable()
	r := &recorder{}
	tok := tb.add(r.HandleCompletions)
	var (
		passes  atomic.Int64 // dispatches made so far
		dropped int          // completions for tok that found no handler; read after wg.Wait
		stop    = make(chan struct{})
		started = make(chan struct{})
		wg      sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := uint64(0); ; i++ {
			dropped += tb.dispatch([]verbs.WC{wc(tok, i)})
			if passes.Add(1) == 1 {
				close(started)
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	<-started
	atStart := passes.Load()
	var churned []*recorder
	for len(churned) < minChurn || passes.Load()-atStart < minPasses {
		c := &recorder{}
		churned = append(churned, c)
		tb.remove(tb.add(c.HandleCompletions))
	}
	close(stop)
	wg.Wait()

	n := passes.Load()
	t.Logf("%d dispatches, %d of them during %d attach/detach pairs", n, n-atStart, len(churned))
	if dropped != 0 {
		t.Fatalf("%d completions for an attached handler were dropped", dropped)
	}
	if int64(len(r.got)) != n {
		t.Fatalf("the long-lived handler got %d completions, want %d", len(r.got), n)
	}
	for i, id := range r.got {
		if Token(id) != tok || id&(1<<TokenShift-1) != uint64(i) {
			t.Fatalf("completion %d: got wrid %#x, want token %d, id %d", i, id, tok, i)
		}
	}
	for i, c := range churned {
		if len(c.got) != 0 {
			t.Fatalf("handler %d, attached and detached during the run, got completions %v", i, c.got)
		}
	}
}

func TestTokenReuseIsDelayed(t *testing.T) {
	tb := newTable()
	first := tb.add((&recorder{}).HandleCompletions)
	tb.remove(first)
	if again := tb.add((&recorder{}).HandleCompletions); again == first {
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
