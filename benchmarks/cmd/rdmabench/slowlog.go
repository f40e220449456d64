//go:build linux

package main

import (
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/verbline/rdma"
)

// slowLog logs the round trips of a latency client slower than a threshold,
// each with what happened during it in its process (context switches, CPU
// time) and on its connection (posts, polls, parks, poller wake-ups,
// registered bytes): to find what makes the tail. On with
// RDMABENCH_SLOW_LOG=path (lines appended; RDMABENCH_SLOW_RT=duration, 1ms
// by default). The counters are read around every round trip, so the
// figures of a run with the log on are not comparable with others.
type slowLog struct {
	min  time.Duration
	f    *os.File
	name string
	c    *rdma.Conn // nil over TCP
	st   rdma.ConnStats
	ru   unix.Rusage
}

// newSlowLog returns the log of a latency client, or nil when it is off.
func newSlowLog(name string, size int, conn net.Conn) (*slowLog, error) {
	path := os.Getenv("RDMABENCH_SLOW_LOG")
	if path == "" {
		return nil, nil
	}
	l := &slowLog{min: time.Millisecond, name: fmt.Sprintf("%s %s", name, sizeString(size))}
	if v := os.Getenv("RDMABENCH_SLOW_RT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, fmt.Errorf("RDMABENCH_SLOW_RT: %w", err)
		}
		l.min = d
	}
	l.c, _ = conn.(*rdma.Conn)
	var err error
	if l.f, err = os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err != nil {
		return nil, err
	}
	fmt.Fprintf(l.f, "# %s: round trips over %v (pid %d)\n", l.name, l.min, os.Getpid())
	return l, nil
}

// begin is called before round trip i.
func (l *slowLog) begin() {
	if l == nil {
		return
	}
	if l.c != nil {
		l.st = l.c.Stats()
	}
	unix.Getrusage(unix.RUSAGE_SELF, &l.ru)
}

// end is called after round trip i, which took d.
func (l *slowLog) end(i int, d time.Duration) {
	if l == nil || d < l.min {
		return
	}
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	line := fmt.Sprintf("%s round trip %d: %v; process: %d voluntary, %d involuntary context switches, user %v, system %v",
		l.name, i, d.Round(time.Microsecond), ru.Nvcsw-l.ru.Nvcsw, ru.Nivcsw-l.ru.Nivcsw,
		time.Duration(ru.Utime.Nano()-l.ru.Utime.Nano()), time.Duration(ru.Stime.Nano()-l.ru.Stime.Nano()))
	if l.c != nil {
		s, b := l.c.Stats(), l.st
		line += fmt.Sprintf("; connection: %d posts, %d poller polls, %d inline polls (%d empty), %d parks, %d arms, %d poller wake-ups, registered bytes %+d",
			s.PostCalls-b.PostCalls, s.PollCalls-b.PollCalls, s.InlinePolls-b.InlinePolls, s.EmptyPolls-b.EmptyPolls,
			s.Parks-b.Parks, s.Arms-b.Arms, s.PollerWakeups-b.PollerWakeups, int64(s.BufferBytes)-int64(b.BufferBytes))
	}
	fmt.Fprintln(l.f, line)
}

func (l *slowLog) close() {
	if l != nil {
		l.f.Close()
	}
}
