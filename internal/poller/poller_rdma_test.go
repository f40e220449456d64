//go:build linux && cgo

package poller

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/verbs"
)

func openDevice(t *testing.T) *verbs.Context {
	env := rdmatest.Require(t)
	ctx, err := verbs.OpenDevice(env.Device)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	return ctx
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestPinnedThread: a poller given a core runs on its own OS thread whose
// affinity is exactly that core.
func TestPinnedThread(t *testing.T) {
	ctx := openDevice(t)
	g, err := NewGroup(ctx, Config{Mode: Event, CPUs: PickCPUs(1)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, p := range g.Pollers() {
		if err := p.PinError(); err != nil {
			t.Fatal(err)
		}
		if p.CPU() < 0 {
			t.Fatal("poller not pinned")
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/status", p.ThreadID()))
		if err != nil {
			t.Fatal(err)
		}
		var allowed string
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
				allowed = strings.TrimSpace(v)
			}
		}
		if allowed != fmt.Sprint(p.CPU()) {
			t.Fatalf("poller thread %d may run on CPUs %q, want only %d", p.ThreadID(), allowed, p.CPU())
		}
		t.Logf("poller on thread %d pinned to CPU %d", p.ThreadID(), p.CPU())
	}
}

// TestBusyKeepsPolling: with nothing to do, a busy poller never sleeps.
func TestBusyKeepsPolling(t *testing.T) {
	ctx := openDevice(t)
	g, err := NewGroup(ctx, Config{Mode: Busy})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	p := g.Pollers()[0]
	before := p.Stats()
	time.Sleep(300 * time.Millisecond)
	after := p.Stats()
	if after.Polls <= before.Polls || after.Sleeps != 0 {
		t.Fatalf("busy poller: polls %d -> %d, sleeps %d; want polling and no sleep", before.Polls, after.Polls, after.Sleeps)
	}
}

// TestAdaptiveIdleSleeps: an idle adaptive poller arms its CQ and sleeps,
// so an idle process uses next to no CPU.
func TestAdaptiveIdleSleeps(t *testing.T) {
	ctx := openDevice(t)
	g, err := NewGroup(ctx, Config{Mode: Adaptive, Spin: 50 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	p := g.Pollers()[0]
	time.Sleep(100 * time.Millisecond)
	polls, c0 := p.Stats().Polls, cpuTime()
	time.Sleep(time.Second)
	used := cpuTime() - c0
	st := p.Stats()
	if st.Sleeps == 0 || st.Polls-polls > 2 {
		t.Fatalf("idle adaptive poller: %d sleeps, %d polls in the idle second", st.Sleeps, st.Polls-polls)
	}
	// A busy poller would use the whole second; allow generous slack for an emulated guest.
	if used > 200*time.Millisecond {
		t.Fatalf("idle process used %v of CPU in one second", used)
	}
	t.Logf("idle second: %v CPU, %d polls", used, st.Polls-polls)
}

// TestCQsWithinMaxCQE: connections are attached to CQs within the
// device's (here: a configured) limit of entries per CQ; when every CQ is
// full a poller with a CQ of its own is added, and a connection that could
// never fit is refused with a clear error.
func TestCQsWithinMaxCQE(t *testing.T) {
	ctx := openDevice(t)
	attr, err := ctx.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("device max_cqe %d", attr.MaxCQE)
	g, err := NewGroup(ctx, Config{Mode: Event, CQSize: 64, MaxCQE: 300})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	nop := Handler(func([]verbs.WC) {})
	var got []*Poller
	for i := 0; i < 4; i++ {
		p, _, err := g.Attach(nop, 100)
		if err != nil {
			t.Fatalf("attach %d: %v", i, err)
		}
		got = append(got, p)
	}
	// A device that cannot resize a CQ (Soft-iWARP) keeps its first CQs at
	// 64 entries and makes new ones at 300: which connections share then
	// depends on the order the group found that out; every CQ still holds
	// what was attached to it, within the limit.
	if !g.fixedCQ && (got[0] != got[1] || got[1] != got[2] || got[3] == got[0] || len(g.Pollers()) != 2) {
		t.Fatalf("3 x 100 entries should share one CQ of at most 300 and the 4th get a new one; pollers %d", len(g.Pollers()))
	}
	for _, p := range g.Pollers() {
		if p.reserved > min(p.cq.Size, 300) { // a device may round a CQ's size up
			t.Fatalf("a CQ of %d entries holding %d, limit 300", p.cq.Size, p.reserved)
		}
	}
	if g.fixedCQ {
		t.Logf("the device cannot resize a CQ: %d pollers", len(g.Pollers()))
	}
	if _, _, err := g.Attach(nop, 400); err == nil || !strings.Contains(err.Error(), "allows 300 per CQ") {
		t.Fatalf("attach of 400 entries: %v", err)
	}
	// The device's own limit is the default.
	g2, err := NewGroup(ctx, Config{Mode: Event})
	if err != nil {
		t.Fatal(err)
	}
	defer g2.Close()
	if g2.cfg.MaxCQE != attr.MaxCQE {
		t.Fatalf("default MaxCQE %d, device %d", g2.cfg.MaxCQE, attr.MaxCQE)
	}
}
