//go:build linux && cgo

package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// Host tests: no rdma_cm device needed.

// TestDestroyedID: using an id after Destroy is the library's bug; the
// error says which call did it, matches errDestroyed, and %+v shows where.
func TestDestroyedID(t *testing.T) {
	err := (&ID{}).Disconnect()
	if !errors.Is(err, errDestroyed) || err.Error() != "rdma_disconnect: rdma_cm id already destroyed" {
		t.Fatalf("Disconnect after Destroy: %v", err)
	}
	if v := fmt.Sprintf("%+v", err); !strings.Contains(v, "rdmacm.(*ID).Disconnect") || !strings.Contains(v, "TestDestroyedID") {
		t.Errorf("%%+v has no stack through Disconnect:\n%s", v)
	}
}

// TestChannelErr: the first failure to read a channel is its terminal
// error: later failures do not replace it, and every Next returns it
// without reading.
func TestChannelErr(t *testing.T) {
	var c Channel
	first := errors.New("rdma_get_cm_event: bad file descriptor")
	if got := c.failed(first); got != first {
		t.Fatalf("failed = %v, want %v", got, first)
	}
	if got := c.failed(errors.New("a later failure")); got != first {
		t.Fatalf("a second failure replaced the first: %v", got)
	}
	done := make(chan error)
	go func() {
		_, err := c.Next(context.Background())
		done <- err
	}()
	if got := <-done; got != first {
		t.Errorf("Next = %v, want %v", got, first)
	}
}
