package lendq

import "testing"

// drain takes what ch holds now, and reports whether it is closed.
func drain(ch chan int) (got []int, closed bool) {
	for {
		select {
		case v, ok := <-ch:
			if !ok {
				return got, true
			}
			got = append(got, v)
		default:
			return got, false
		}
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Values pushed before the user takes the channel come out of it first,
// in order, then the later ones; the end closes it after them.
func TestLendQueueOrderAcrossTheSwitch(t *testing.T) {
	q := New[int](4)
	q.Push(1)
	q.Push(2)
	q.Push(3)
	if v, ok := q.Pop(); !ok || v != 1 {
		t.Fatalf("pop = %d, %v; want 1, true", v, ok)
	}
	if got, _ := drain(q.ch); len(got) != 0 {
		t.Fatalf("the channel got %v before the user took it", got)
	}
	q.ToChan()
	q.Push(4)
	if q.Queued() != 3 {
		t.Fatalf("queued = %d, want 3", q.Queued())
	}
	if _, ok := q.Pop(); ok {
		t.Fatal("the ring still gave a value after the switch")
	}
	q.End()
	got, closed := drain(q.ch)
	if !equal(got, []int{2, 3, 4}) || !closed {
		t.Fatalf("channel gave %v (closed %v), want [2 3 4] and closed", got, closed)
	}
}

// The end leaves the channel open while the ring holds values Recv has
// not taken; taking the channel then hands them over and closes it.
func TestLendQueueEndWithValuesQueued(t *testing.T) {
	q := New[int](2)
	q.Push(7)
	q.End()
	if got, closed := drain(q.ch); len(got) != 0 || closed {
		t.Fatalf("after the end with a value in the ring the channel gave %v (closed %v)", got, closed)
	}
	q.ToChan() // Messages() after the end, or release
	got, closed := drain(q.ch)
	if !equal(got, []int{7}) || !closed {
		t.Fatalf("channel gave %v (closed %v), want [7] and closed", got, closed)
	}
	q.ToChan() // again: nothing to do, no double close
	q.Flush()

	e := New[int](2)
	e.End() // nothing queued: closed at once
	if _, closed := drain(e.ch); !closed {
		t.Fatal("the end with an empty ring left the channel open")
	}
}

// A ring fuller than its size (which the credits forbid) grows rather
// than losing or overwriting a value.
func TestLendQueueGrows(t *testing.T) {
	q := New[int](2)
	for i := 0; i < 5; i++ {
		q.Push(i)
		if i == 1 {
			q.Pop() // wrap the head around
			q.Push(100)
		}
	}
	var got []int
	for v, ok := q.Pop(); ok; v, ok = q.Pop() {
		got = append(got, v)
	}
	if !equal(got, []int{1, 100, 2, 3, 4}) {
		t.Fatalf("popped %v, want [1 100 2 3 4]", got)
	}
}

// The channel is made only when it is needed: a queue whose user never
// takes it and that ends empty gets a closed channel with no room; one
// that ends with values waiting gets its full room when they move into it.
func TestLendQueueChannelMadeLazily(t *testing.T) {
	q := New[int](4)
	q.Push(1)
	if v, ok := q.Pop(); !ok || v != 1 || q.ch != nil {
		t.Fatalf("pop = %d, %v, channel made %v; want 1, true and no channel", v, ok, q.ch != nil)
	}
	q.End()
	if got, closed := drain(q.ch); q.ch == nil || cap(q.ch) != 0 || len(got) != 0 || !closed {
		t.Fatalf("after an empty end: channel %v (room %d) gave %v, closed %v; want an empty closed channel", q.ch != nil, cap(q.ch), got, closed)
	}

	q = New[int](4)
	q.Push(1)
	q.Push(2)
	q.End()
	if q.ch != nil {
		t.Fatal("the end made the channel while values wait in the ring")
	}
	q.ToChan() // release, or the user taking it
	if got, closed := drain(q.ch); cap(q.ch) != 4 || !equal(got, []int{1, 2}) || !closed {
		t.Fatalf("channel (room %d) gave %v, closed %v; want room 4, [1 2], closed", cap(q.ch), got, closed)
	}
}
