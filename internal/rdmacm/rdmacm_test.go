//go:build linux && cgo

package rdmacm

import (
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

// TestChannelErr: a channel's terminal error is nil until its reader
// stops on a failure, and readable from any goroutine.
func TestChannelErr(t *testing.T) {
	var c Channel
	if err := c.Err(); err != nil {
		t.Fatalf("Err of a working channel: %v", err)
	}
	want := errors.New("rdma_cm event channel: read failed")
	c.err.Store(want)
	done := make(chan error)
	go func() { done <- c.Err() }()
	if got := <-done; got != want {
		t.Errorf("Err = %v, want %v", got, want)
	}
}
