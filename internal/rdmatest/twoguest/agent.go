package twoguest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultPort is the TCP port the agent listens on and Require dials.
const DefaultPort = 7390

// The protocol: one JSON request per TCP connection, one JSON response back.
type request struct {
	Op      string        `json:"op"` // info, start, wait, signal, poweroff
	Args    []string      `json:"args,omitempty"`
	Env     []string      `json:"env,omitempty"`
	Dir     string        `json:"dir,omitempty"`
	ID      int           `json:"id,omitempty"`
	Signal  int           `json:"signal,omitempty"`
	Timeout time.Duration `json:"timeout,omitempty"` // wait: how long; 0 answers at once
}

type response struct {
	ID     int               `json:"id,omitempty"`
	Status *Status           `json:"status,omitempty"`
	Info   map[string]string `json:"info,omitempty"`
	Err    string            `json:"err,omitempty"`
}

// Status is a process's state as the agent saw it.
type Status struct {
	Exited bool   // the process has ended
	Code   int    // its exit code; -1 if a signal ended it
	Signal string // the signal that ended it ("killed"), if any
	Output string // stdout and stderr, interleaved (the last MaxOutput bytes)
}

func (s Status) String() string {
	switch {
	case !s.Exited:
		return "running"
	case s.Signal != "":
		return "signal: " + s.Signal
	default:
		return fmt.Sprintf("exit status %d", s.Code)
	}
}

// MaxOutput bounds the output the agent keeps per process.
const MaxOutput = 1 << 20

// infoVars are the environment variables the info request reports: the
// agent's guest as scripts/softroce set it up.
var infoVars = []string{"RDMA_TEST_ADDR", "RDMA_TEST_DEVICE", "RDMA_TEST_NETDEV", "RDMA_TEST_PEER_ADDR", "SOFTROCE_PAIR"}

// Agent serves requests from a test on the other host: start processes and
// report their status and output, signal them, power the machine off.
// The zero value is ready to use.
type Agent struct {
	// PowerOff cuts the machine's power; nil means the reboot(2) system call
	// (LINUX_REBOOT_CMD_POWER_OFF, no sync: as if the plug were pulled).
	PowerOff func() error
	// Log, if not nil, receives a line per process started and ended.
	Log *log.Logger

	mu     sync.Mutex
	nextID int
	procs  map[int]*proc
}

type proc struct {
	cmd  *exec.Cmd
	out  *tailBuffer
	done chan struct{} // closed when the process has ended and status is set
	st   Status
}

// Serve answers requests on ln until it fails; it returns ln's error.
func (a *Agent) Serve(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go a.handle(c)
	}
}

func (a *Agent) handle(c net.Conn) {
	defer c.Close()
	var req request
	if err := json.NewDecoder(bufio.NewReader(c)).Decode(&req); err != nil {
		json.NewEncoder(c).Encode(response{Err: "bad request: " + err.Error()})
		return
	}
	resp, after := a.do(req)
	json.NewEncoder(c).Encode(resp)
	if after != nil {
		c.Close()
		after()
	}
}

// do carries out req; after, if not nil, runs once the response is sent.
func (a *Agent) do(req request) (resp response, after func()) {
	fail := func(err error) (response, func()) { return response{Err: err.Error()}, nil }
	switch req.Op {
	case "info":
		info := map[string]string{}
		for _, k := range infoVars {
			info[k] = os.Getenv(k)
		}
		info["hostname"], _ = os.Hostname()
		return response{Info: info}, nil
	case "start":
		id, err := a.start(req)
		if err != nil {
			return fail(err)
		}
		return response{ID: id}, nil
	case "wait":
		p, err := a.proc(req.ID)
		if err != nil {
			return fail(err)
		}
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		select {
		case <-p.done:
		case <-t.C:
		}
		st := a.status(p)
		return response{ID: req.ID, Status: &st}, nil
	case "signal":
		p, err := a.proc(req.ID)
		if err != nil {
			return fail(err)
		}
		select {
		case <-p.done:
			return fail(fmt.Errorf("process %d (%s) has already ended: %v", req.ID, p.cmd.Path, p.st))
		default:
		}
		if err := p.cmd.Process.Signal(syscall.Signal(req.Signal)); err != nil {
			return fail(fmt.Errorf("signal %v to process %d: %w", syscall.Signal(req.Signal), req.ID, err))
		}
		return response{ID: req.ID}, nil
	case "poweroff":
		off := a.PowerOff
		if off == nil {
			off = powerOff
		}
		a.logf("powering off")
		return response{}, func() {
			time.Sleep(50 * time.Millisecond) // let the response leave
			if err := off(); err != nil {
				a.logf("power off: %v", err)
			}
		}
	}
	return fail(fmt.Errorf("unknown request %q", req.Op))
}

func (a *Agent) logf(format string, args ...any) {
	if a.Log != nil {
		a.Log.Printf(format, args...)
	}
}

func (a *Agent) start(req request) (int, error) {
	if len(req.Args) == 0 {
		return 0, errors.New("start: no command")
	}
	cmd := exec.Command(req.Args[0], req.Args[1:]...)
	cmd.Env = append(os.Environ(), req.Env...)
	cmd.Dir = req.Dir
	out := &tailBuffer{max: MaxOutput}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s: %w", req.Args[0], err)
	}
	p := &proc{cmd: cmd, out: out, done: make(chan struct{})}
	a.mu.Lock()
	if a.procs == nil {
		a.procs = map[int]*proc{}
	}
	a.nextID++
	id := a.nextID
	a.procs[id] = p
	a.mu.Unlock()
	a.logf("%d: started pid %d: %s", id, cmd.Process.Pid, strings.Join(req.Args, " "))
	go func() {
		err := cmd.Wait()
		st := Status{Exited: true, Code: -1}
		if ps := cmd.ProcessState; ps != nil {
			st.Code = ps.ExitCode()
			if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				st.Signal = ws.Signal().String()
			}
		} else if err != nil {
			st.Signal = err.Error() // no wait status: say why
		}
		a.mu.Lock()
		p.st = st
		a.mu.Unlock()
		close(p.done)
		a.logf("%d: %v", id, st)
	}()
	return id, nil
}

func (a *Agent) proc(id int) (*proc, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.procs[id]
	if p == nil {
		return nil, fmt.Errorf("no process %d", id)
	}
	return p, nil
}

func (a *Agent) status(p *proc) Status {
	a.mu.Lock()
	st := p.st
	a.mu.Unlock()
	st.Output = p.out.String()
	return st
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

var _ io.Writer = (*tailBuffer)(nil)
