//go:build linux && cgo

// Package poller runs the completion pollers: a few goroutines, each owning
// one completion queue that many connections share, and each locked to an
// OS thread pinned to its own core when the process has cores to spare
// (MinPinCPUs). Waiting callers drive a poller's CQ themselves (Waiter);
// the poller's goroutine covers what no caller waits for. Whoever polls
// does so in batches, hands each run of completions to the connection
// named in the work-request id, and never blocks on a connection.
//
// Work-request ids carry the connection's token in their top 24 bits
// (TokenShift); the rest is the connection's own business.
package poller

import (
	"sync"
	"sync/atomic"

	"github.com/verbline/rdma/internal/verbs"
)

// TokenShift is where a connection's token sits in a work-request id.
const TokenShift = 40

// Token extracts the connection token from a work-request id.
func Token(wrid uint64) uint32 { return uint32(wrid >> TokenShift) }

// Handler consumes completions. It runs on the poller's goroutine and must
// not block (no waiting on users; a short mutex is fine).
// It is a function, not an interface, so the connection's hook stays
// unexported.
type Handler func(wcs []verbs.WC)

// table maps tokens to handlers. Readers (the poller, per batch) take an
// immutable snapshot with one atomic load; writers copy under a mutex.
type table struct {
	mu    sync.Mutex
	snap  atomic.Pointer[[]Handler]
	free  []uint32     // released tokens, reused oldest first
	count atomic.Int32 // handlers in the table: Attach reads it under the group's lock, not the table's
}

func newTable() *table {
	t := &table{}
	empty := make([]Handler, 1) // token 0 is never handed out
	t.snap.Store(&empty)
	return t
}

func (t *table) add(h Handler) uint32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.snap.Load()
	var tok uint32
	// Reuse a token only when many are free, so a late completion for a
	// detached connection is unlikely to find a new owner under its token.
	if len(t.free) > 64 {
		tok = t.free[0]
		t.free = t.free[1:]
	} else {
		tok = uint32(len(old))
	}
	n := max(len(old), int(tok)+1)
	next := make([]Handler, n)
	copy(next, old)
	next[tok] = h
	t.snap.Store(&next)
	t.count.Add(1)
	return tok
}

func (t *table) remove(tok uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.snap.Load()
	if int(tok) >= len(old) || old[tok] == nil {
		return
	}
	next := make([]Handler, len(old))
	copy(next, old)
	next[tok] = nil
	t.snap.Store(&next)
	t.free = append(t.free, tok)
	t.count.Add(-1)
}

// dispatch hands each run of consecutive completions with the same token to
// its handler; completions for unknown tokens (a connection that already
// left) are dropped. It returns how many were dropped.
func (t *table) dispatch(wcs []verbs.WC) (dropped int) {
	handlers := *t.snap.Load()
	for i := 0; i < len(wcs); {
		tok := Token(wcs[i].WRID)
		j := i + 1
		for j < len(wcs) && Token(wcs[j].WRID) == tok {
			j++
		}
		if int(tok) < len(handlers) && handlers[tok] != nil {
			handlers[tok](wcs[i:j])
		} else {
			dropped += j - i
		}
		i = j
	}
	return dropped
}
