//go:build linux && cgo

package rdma

import "sync/atomic"

// lendQueue holds what the poller lends to the user in order (received
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
type lendQueue[T any] struct {
	ch      chan T // what Messages() / Notifications() return; made at its first use (chanLocked)
	size    int    // ch's room: every value that can be out at once
	ring    []T
	head, n int
	viaChan atomic.Bool // the user took ch (written under Conn.mu, read without it by the getter)
	ended   bool        // no more values will come (Conn.msgsClosed)
	chDone  bool        // ch is closed
}

// newLendQueue makes a queue with room for n values; its ring is made at
// the first push, its channel when the user takes it or the connection
// ends (a connection that never uses the view pays for neither).
func newLendQueue[T any](n int) lendQueue[T] {
	return lendQueue[T]{size: n}
}

// chanLocked returns ch, made now if this is its first use. Called with
// Conn.mu held.
func (q *lendQueue[T]) chanLocked() chan T {
	if q.ch == nil {
		q.ch = make(chan T, q.size)
	}
	return q.ch
}

// userChan hands q's channel to the user (Messages, Notifications,
// Completions): the poller keeps delivering for a user who may wait on it
// without calling into the library, and what waits in the ring goes first.
func userChan[T any](c *engine, q *lendQueue[T]) <-chan T {
	c.channelUser()
	if !q.viaChan.Load() {
		c.mu.Lock()
		q.toChan()
		if any(q) == any(&c.oq) {
			// Ends of operations posted unsignaled before the channel was
			// taken must not wait for a later completion: from now on
			// every asynchronous request is signaled (asyncForceLocked).
			c.flushAsyncLocked()
		}
		c.mu.Unlock()
	}
	return q.ch
}

// push appends v. Called with Conn.mu held.
func (q *lendQueue[T]) push(v T) {
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

// pop takes the oldest value from the ring. Called with Conn.mu held.
func (q *lendQueue[T]) pop() (T, bool) {
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

// queued is how many values wait for the user. Called with Conn.mu held.
func (q *lendQueue[T]) queued() int { return q.n + len(q.ch) }

// toChan makes every value from now on go through ch, the ring's first.
// Called with Conn.mu held.
func (q *lendQueue[T]) toChan() {
	if q.viaChan.Load() {
		return
	}
	q.chanLocked()
	q.flush()
	q.viaChan.Store(true) // after ch is set: userChan reads it without Conn.mu once it sees this
}

// flush moves the ring into ch, and closes ch if the end came. Called
// with Conn.mu held.
func (q *lendQueue[T]) flush() {
	if !q.chDone {
		for v, ok := q.pop(); ok; v, ok = q.pop() {
			q.chanLocked() <- v
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

// end records that no value follows. ch closes now if nothing waits in
// the ring (else when the user takes ch, or at release, which drains it).
// Called with Conn.mu held.
func (q *lendQueue[T]) end() {
	q.ended = true
	if q.viaChan.Load() || q.n == 0 {
		q.flush()
	}
}
