//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
)

// admitListen listens with the Admit hook admit and accepts every
// connection in the background until the listener closes; the accepted
// connections are closed when the test ends.
func admitListen(t *testing.T, cfg Config, admit func(netip.AddrPort) error) *Listener {
	t.Helper()
	env := rdmatest.Require(t)
	lc := ListenConfig{Config: cfg, Admit: admit}
	ln, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(env.Addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	acc := acceptAll(ln)
	t.Cleanup(acc.closeAll)
	return ln
}

// TestAdmitSlowHookBlocksNoOne: an Admit hook that takes 2 s for one
// dialer does not delay another dialer's connect: the other dial
// completes while the slow hook is still running, and the slow dialer is
// let in once its hook answers.
func TestAdmitSlowHookBlocksNoOne(t *testing.T) {
	checkLeaksAtEnd(t)
	const hold = 2 * time.Second
	var slowPort atomic.Uint32 // the dialer whose hook is slow (first asked)
	entered := make(chan struct{})
	var slowDone atomic.Bool
	admit := func(remote netip.AddrPort) error {
		if slowPort.CompareAndSwap(0, uint32(remote.Port())) {
			close(entered)
			time.Sleep(hold)
			slowDone.Store(true)
		}
		return nil
	}
	ln := admitListen(t, Config{HandshakeTimeout: rdmatest.Scale(10 * time.Second)}, admit)
	defer ln.Close()
	d := Dialer{Timeout: rdmatest.Scale(10 * time.Second)}
	slow := make(chan error, 1)
	go func() {
		c, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
		if err == nil {
			c.Close()
		}
		slow <- err
	}()
	select {
	case <-entered:
	case <-time.After(rdmatest.Scale(10 * time.Second)):
		t.Fatal("the slow dialer's connect request never reached the Admit hook")
	}
	start := time.Now()
	c, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	took := time.Since(start)
	if err != nil {
		t.Fatalf("dial while another dialer's Admit hook runs: %v", err)
	}
	c.Close()
	t.Logf("dial while another dialer's hook sleeps %v: %v", hold, took)
	if slowDone.Load() {
		t.Fatalf("the dial took %v and completed only after the other dialer's %v hook returned: the hook held up the listener", took, hold)
	}
	if err := <-slow; err != nil {
		t.Fatalf("the slow-hook dialer: %v, want it let in once its hook answered", err)
	}
}

// TestAdmitHookNeverReturns: a connect request whose Admit hook never
// answers is refused at the listener's HandshakeTimeout with a reason that
// says so, and leaves nothing behind on the listener (no id, no waiting
// request); at most Backlog hooks run at once, a dialer beyond them is
// refused at once; once the hooks return, the listener admits again, and
// Close does not wait for a hook.
func TestAdmitHookNeverReturns(t *testing.T) {
	checkLeaksAtEnd(t)
	const backlog = 2
	hsTimeout := rdmatest.Scale(500 * time.Millisecond)
	release := make(chan struct{})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	var block atomic.Bool
	var running atomic.Int32
	admit := func(netip.AddrPort) error {
		if !block.Load() {
			return nil
		}
		running.Add(1)
		defer running.Add(-1)
		<-release // the test's "never": until it lets go at the end
		return nil
	}
	ln := admitListen(t, Config{Backlog: backlog, HandshakeTimeout: hsTimeout}, admit)
	defer letGo() // before the listener's Close: a failure must not leave the hooks blocked
	// Keep the device set up, so the counts below see only the dialers.
	keep, err := (&Dialer{Timeout: rdmatest.Scale(10 * time.Second)}).DialContext(context.Background(), "rdma", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	time.Sleep(rdmatest.Scale(100 * time.Millisecond)) // the accepting goroutine closes its end
	ids := rdmatest.Resources(t)["cm_id"]
	g0 := rdmatest.Goroutines()
	block.Store(true)

	d := Dialer{Timeout: 4 * hsTimeout} // the refusal comes at hsTimeout
	var wg sync.WaitGroup
	errs := make([]error, backlog)
	took := make([]time.Duration, backlog)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, errs[i] = d.DialContext(context.Background(), "rdma", ln.Addr().String())
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), "did not answer within") {
			t.Fatalf("dial %d with a hook that never answers: %v, want ErrHandshake saying the hook did not answer", i, err)
		}
		if took[i] < hsTimeout {
			t.Fatalf("dial %d refused after %v, before the HandshakeTimeout %v", i, took[i], hsTimeout)
		}
		t.Logf("refused after %v: %v", took[i], err)
	}
	// Backlog hooks are running now: the next dialer is refused at once.
	start := time.Now()
	_, err = d.DialContext(context.Background(), "rdma", ln.Addr().String())
	if !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), "has not returned") {
		t.Fatalf("dial beyond %d running hooks: %v, want ErrHandshake saying the hooks have not returned", backlog, err)
	}
	if el := time.Since(start); el >= hsTimeout {
		t.Fatalf("dial beyond the running hooks refused after %v, not at once", el)
	}
	if n := running.Load(); n != backlog {
		t.Fatalf("%d hooks running, want %d (Backlog)", n, backlog)
	}
	// Nothing is left of the refused requests but the hooks themselves.
	ln.mu.Lock()
	waiting, hooks := len(ln.admitting), ln.hooks
	ln.mu.Unlock()
	if waiting != 0 || hooks != backlog {
		t.Fatalf("listener holds %d requests waiting for their hook, counts %d hooks; want 0 and %d", waiting, hooks, backlog)
	}
	if got := rdmatest.Resources(t)["cm_id"]; got != ids {
		t.Fatalf("cm_ids %d after the refusals, %d before", got, ids)
	}
	for deadline := time.Now().Add(rdmatest.Scale(3 * time.Second)); ; time.Sleep(10 * time.Millisecond) {
		g := rdmatest.Goroutines()
		if g <= g0+backlog {
			t.Logf("goroutines %d after the refusals, %d before: the %d hooks", g, g0, backlog)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines %d after the refusals, %d before: more than the %d hooks", g, g0, backlog)
		}
	}
	// The hooks return: the listener admits again.
	letGo()
	for deadline := time.Now().Add(rdmatest.Scale(5 * time.Second)); ; time.Sleep(10 * time.Millisecond) {
		ln.mu.Lock()
		hooks = ln.hooks
		ln.mu.Unlock()
		if hooks == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d hooks still counted after they returned", hooks)
		}
	}
	c, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial once the hooks returned: %v", err)
	}
	c.Close()
}

// TestAdmitCloseDoesNotWait: Close refuses the requests still waiting for
// their Admit hook and returns without waiting for the hook.
func TestAdmitCloseDoesNotWait(t *testing.T) {
	checkLeaksAtEnd(t)
	release := make(chan struct{})
	defer close(release)
	entered := make(chan struct{}, 1)
	admit := func(netip.AddrPort) error {
		entered <- struct{}{}
		<-release
		return nil
	}
	ln := admitListen(t, Config{HandshakeTimeout: time.Minute}, admit)
	d := Dialer{Timeout: rdmatest.Scale(10 * time.Second)}
	dialed := make(chan error, 1)
	go func() {
		c, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
		if err == nil {
			c.Close()
		}
		dialed <- err
	}()
	<-entered
	closed := make(chan error, 1)
	go func() { closed <- ln.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(rdmatest.Scale(5 * time.Second)):
		t.Fatal("Close waits for an Admit hook that has not returned")
	}
	if err := <-dialed; !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), "closing") {
		t.Fatalf("dial waiting for its hook when the listener closed: %v, want ErrHandshake saying the listener is closing", err)
	}
}
