// Package lendq is the queue in which a connection lends what it received
// (messages, notifications, ends of operations) to the user in order, with
// a ring under the connection's lock until the user takes the delivery
// channel. Every method but ViaChan is called with the owner's lock held.
package lendq

import "sync/atomic"

// Queue holds what the poller lends to the user in order (received
// messages, notifications) until Recv or RecvNotification takes it. While
// no one took the delivery channel (Messages(), Notifications()) the
// values wait in a ring guarded by Conn.mu, which Recv pops in the same
// critical section that checks the connection's state: a buffered
// channel's send and receive would take two more locks per message on
// each side of a ping-pong, and the Conn's Read pays nothing of the kind.
// Once the user takes the channel, the ring's contents move into it (in
// order, under Conn.mu, before any later delivery) and every later value
// goes through the channel. The channel and the ring have room for every
// receive buffer, each value holds one (or its credit), so a push never
// blocks the poller.
type Queue[T any] struct {
	ch      chan T // what Messages() / Notifications() return; made at its first use (chanLocked)
	size    int    // ch's room: every value that can be out at once
	ring    []T
	head, n int
	viaChan atomic.Bool // the user took ch (written under Conn.mu, read without it by the getter)
	ended   bool        // no more values will come (Conn.msgsClosed)
	chDone  bool        // ch is closed
}

// New makes a queue with room for n values; its ring is made at
// the first push, its channel when the user takes it or the connection
// ends (a connection that never uses the view pays for neither).
func New[T any](n int) Queue[T] {
	return Queue[T]{size: n}
}

// ChanLocked returns ch, made now if this is its first use. Called with
// Conn.mu held.
func (q *Queue[T]) ChanLocked() chan T {
	if q.ch == nil {
		q.ch = make(chan T, q.size)
	}
	return q.ch
}

// Push appends v. Called with Conn.mu held.
func (q *Queue[T]) Push(v T) {
	if q.viaChan.Load() {
		q.ch <- v
		return
	}
	if q.n == len(q.ring) { // the first push; or full, which cannot happen (as a full channel could not), but never lose a value
		q.ring = append(q.ring[q.head:], q.ring[:q.head]...)
		q.head = 0
		q.ring = append(q.ring, make([]T, max(len(q.ring), q.size))...)
	}
	q.ring[(q.head+q.n)%len(q.ring)] = v
	q.n++
}

// Pop takes the oldest value from the ring. Called with Conn.mu held.
func (q *Queue[T]) Pop() (T, bool) {
	var zero T
	if q.n == 0 {
		return zero, false
	}
	v := q.ring[q.head]
	q.ring[q.head] = zero
	q.head = (q.head + 1) % len(q.ring)
	q.n--
	return v, true
}

// Queued is how many values wait for the user. Called with Conn.mu held.
func (q *Queue[T]) Queued() int { return q.n + len(q.ch) }

// ToChan makes every value from now on go through ch, the ring's first.
// Called with Conn.mu held.
func (q *Queue[T]) ToChan() {
	if q.viaChan.Load() {
		return
	}
	q.ChanLocked()
	q.Flush()
	q.viaChan.Store(true) // after ch is set: userChan reads it without Conn.mu once it sees this
}

// Flush moves the ring into ch, and closes ch if the end came. Called
// with Conn.mu held.
func (q *Queue[T]) Flush() {
	if !q.chDone {
		for v, ok := q.Pop(); ok; v, ok = q.Pop() {
			q.ChanLocked() <- v
		}
	}
	if q.ended && !q.chDone {
		q.chDone = true
		if q.ch == nil {
			q.ch = make(chan T) // closed before any value: it needs no room
		}
		close(q.ch)
	}
}

// End records that no value follows. ch closes now if nothing waits in
// the ring (else when the user takes ch, or at release, which drains it).
// Called with Conn.mu held.
func (q *Queue[T]) End() {
	q.ended = true
	if q.viaChan.Load() || q.n == 0 {
		q.Flush()
	}
}

// Chan is the delivery channel: nil until ChanLocked or the end made it.
func (q *Queue[T]) Chan() chan T { return q.ch }

// Size is the room of the channel: every value that can be out at once.
func (q *Queue[T]) Size() int { return q.size }

// ViaChan reports whether the user took the channel; safe without the
// owner's lock.
func (q *Queue[T]) ViaChan() bool { return q.viaChan.Load() }

// Ended reports whether End was called.
func (q *Queue[T]) Ended() bool { return q.ended }
