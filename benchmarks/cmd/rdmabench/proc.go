//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a child process (a server or a client) with its output captured.
// Every child runs under a deadline and is killed, with its process group,
// when the deadline passes or the run is cancelled.
type proc struct {
	name   string
	cmd    *exec.Cmd
	cancel context.CancelFunc
	stdout *outBuf
	stderr *outBuf
	done   chan struct{}
	err    error // valid after done is closed
}

// startProc starts argv pinned to cpu (-1: not pinned), killed after timeout.
func startProc(ctx context.Context, timeout time.Duration, cpu int, argv ...string) (*proc, error) {
	if cpu >= 0 {
		argv = append([]string{"taskset", "-c", fmt.Sprint(cpu)}, argv...)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	p := &proc{name: strings.Join(argv, " "), cmd: cmd, cancel: cancel,
		stdout: newOutBuf(), stderr: newOutBuf(), done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
	// Its own process group, so that killing it also kills what it started;
	// and killed if this process dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, err
	}
	go func() {
		err := cmd.Wait()
		if ctx.Err() == context.DeadlineExceeded {
			err = fmt.Errorf("killed after the %v timeout (%w)", timeout, err)
		}
		p.err = err
		cancel()
		close(p.done)
	}()
	return p, nil
}

// wait waits for the process to exit, at most d; then it kills it.
func (p *proc) wait(d time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		p.kill()
		<-p.done
		return fmt.Errorf("did not exit within %v; killed", d)
	}
}

func (p *proc) kill() {
	p.cancel()
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitFor waits until the process has printed a line that starts with prefix
// and returns the rest of that line.
func (p *proc) waitFor(prefix string, d time.Duration) (string, error) {
	deadline := time.After(d)
	for {
		ch := p.stdout.changed()
		for _, l := range p.stdout.lines() {
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				return rest, nil
			}
		}
		select {
		case <-ch:
		case <-p.done:
			for _, l := range p.stdout.lines() {
				if rest, ok := strings.CutPrefix(l, prefix); ok {
					return rest, nil
				}
			}
			return "", fmt.Errorf("exited (%w) before printing %q", p.err, prefix)
		case <-deadline:
			return "", fmt.Errorf("did not print %q within %v", prefix, d)
		}
	}
}

// describe is the command, its status and the tail of its output, for errors.
func (p *proc) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  $ %s", p.name)
	if p.exited() && p.err != nil {
		fmt.Fprintf(&b, "\n  exit: %v", p.err)
	}
	for _, o := range []struct {
		name string
		buf  *outBuf
	}{{"stderr", p.stderr}, {"stdout", p.stdout}} {
		if s := strings.TrimSpace(tail(o.buf.String(), 25)); s != "" {
			fmt.Fprintf(&b, "\n  %s:\n    %s", o.name, strings.ReplaceAll(s, "\n", "\n    "))
		}
	}
	return b.String()
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = append([]string{"..."}, l[len(l)-lines:]...)
	}
	return strings.Join(l, "\n")
}

// outBuf collects a child's output and tells waiters when it grows.
type outBuf struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	wake chan struct{}
}

func newOutBuf() *outBuf { return &outBuf{wake: make(chan struct{})} }

func (o *outBuf) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.buf.Len() < 4<<20 { // a runaway child cannot eat the memory
		o.buf.Write(b)
	}
	close(o.wake)
	o.wake = make(chan struct{})
	return len(b), nil
}

func (o *outBuf) changed() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.wake
}

func (o *outBuf) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// lines are the complete lines written so far.
func (o *outBuf) lines() []string {
	s := o.String()
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return strings.Split(s[:i], "\n")
	}
	return nil
}

// errChild wraps a failure with the output of the processes involved.
type errChild struct {
	err   error
	procs []*proc
}

func (e *errChild) Error() string {
	var b strings.Builder
	b.WriteString(e.err.Error())
	for _, p := range e.procs {
		if p != nil {
			b.WriteString("\n")
			b.WriteString(p.describe())
		}
	}
	return b.String()
}

func childErr(err error, procs ...*proc) error {
	var ec *errChild
	if errors.As(err, &ec) {
		return err
	}
	return &errChild{err: err, procs: procs}
}
