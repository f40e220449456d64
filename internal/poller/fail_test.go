//go:build linux && cgo

package poller

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"

	cerrors "github.com/cockroachdb/errors"
)

// TestFail: the first failure wins and is what Err reports (wrapped, the
// cause still matching); OnFail hears of it once, later failures are
// dropped; a poller that never failed reports nil.
func TestFail(t *testing.T) {
	var mu sync.Mutex
	var heard []error
	done := make(chan struct{})
	p := &Poller{g: &Group{cfg: Config{OnFail: func(q *Poller, err error) {
		mu.Lock()
		heard = append(heard, err)
		mu.Unlock()
		close(done) // a second call would panic
	}}}}
	if err := p.Err(); err != nil {
		t.Fatalf("Err before any failure: %v", err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Fail(fmt.Errorf("poll %d: %w", i, syscall.EIO))
		}()
	}
	wg.Wait()
	<-done
	err := p.Err()
	if err == nil || !errors.Is(err, syscall.EIO) || !strings.HasPrefix(err.Error(), "completion queue poller failed: poll ") {
		t.Fatalf("Err after Fail: %v", err)
	}
	p.Fail(errors.New("later"))
	if got := p.Err(); got != err {
		t.Errorf("Err after a second Fail: %v, want the first %v", got, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(heard) != 1 || heard[0] != err {
		t.Errorf("OnFail heard %v, want once %v", heard, err)
	}
}

// TestAttachClosedGroup: attaching to a closed group is a bug of the
// caller's reference counting: an assertion failure with a stack.
func TestAttachClosedGroup(t *testing.T) {
	_, _, err := (&Group{closed: true}).Attach(nil, 1)
	if err == nil || !cerrors.IsAssertionFailure(err) {
		t.Fatalf("Attach on a closed group: %v, want an assertion failure", err)
	}
	if v := fmt.Sprintf("%v", err); !strings.Contains(v, "closed poller group") || strings.Contains(v, "\n") {
		t.Errorf("%%v: %q, want one line naming the closed group", v)
	}
	if v := fmt.Sprintf("%+v", err); !strings.Contains(v, "TestAttachClosedGroup") || !strings.Contains(v, "poller.(*Group).Attach") {
		t.Errorf("%%+v has no stack through Attach and the test:\n%s", v)
	}
}
