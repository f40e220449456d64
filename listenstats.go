package rdma

import (
	"sync"
	"sync/atomic"
	"time"
)

// ListenerStats counts what became of the connections dialers asked a
// Listener for. A handshake that fails never reaches Accept (its dialer
// gets the error), so Failed and LastFailure are how the listening side
// sees a dialer it cannot talk to: an incompatible protocol version, a
// dialer that stops answering, a device that loses messages. With
// ListenConfig.Fallback the counts are the sums of the RDMA and the TCP
// side's. Every count only grows.
type ListenerStats struct {
	// Accepted counts connections established (their handshake done)
	// for Accept: counted before Accept can return them, and one that
	// the listener's Close ended before Accept took it counts too.
	Accepted uint64
	// Refused counts connect requests answered with a refusal before
	// their handshake began: Accept's queue (Config.Backlog) was full,
	// ListenConfig.Admit refused or did not answer within
	// Config.HandshakeTimeout, or the listener was closing.
	Refused uint64
	// Dropped counts handshakes in progress ended to make room for a
	// newer connect request: the backlog was full of unfinished
	// handshakes.
	Dropped uint64
	// Failed counts handshakes that began and did not finish for another
	// reason: Config.HandshakeTimeout passed, the dialer went away or
	// broke the protocol, or this side ran out of a resource.
	Failed uint64
	// LastFailure is why the latest failed handshake failed, naming its
	// dialer (nil while none has), and LastFailureAt when.
	LastFailure   error
	LastFailureAt time.Time
}

// listenStats counts one listening side's outcomes (the RDMA acceptor's,
// or a fallback listener's TCP side's). Its counters are atomics: the
// accept loops and the handshakes' goroutines add to them without a lock.
type listenStats struct {
	accepted, refused, dropped, failed atomic.Uint64

	mu     sync.Mutex // guards the fields below
	last   error
	lastAt time.Time
}

// failure counts a failed handshake and keeps its error.
func (s *listenStats) failure(err error) {
	s.failed.Add(1)
	s.mu.Lock()
	s.last, s.lastAt = err, time.Now()
	s.mu.Unlock()
}

// addTo adds s's counts to st; its last failure replaces st's if later.
func (s *listenStats) addTo(st *ListenerStats) {
	st.Accepted += s.accepted.Load()
	st.Refused += s.refused.Load()
	st.Dropped += s.dropped.Load()
	st.Failed += s.failed.Load()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last != nil && s.lastAt.After(st.LastFailureAt) {
		st.LastFailure, st.LastFailureAt = s.last, s.lastAt
	}
}

// Stats returns what became of the connect requests the listener has
// received so far (see ListenerStats).
func (l *Listener) Stats() ListenerStats {
	var st ListenerStats
	if l.fb != nil {
		if l.fb.rdma != nil {
			l.fb.rdma.stats.addTo(&st)
		}
		l.fb.stats.addTo(&st)
		return st
	}
	l.stats.addTo(&st)
	return st
}
