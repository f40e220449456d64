package twoguest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"
)

// Client talks to an Agent on the other host.
type Client struct {
	Addr string // the agent's host:port
}

// call sends one request and decodes the response; ctx bounds both.
func (c *Client) call(ctx context.Context, req request) (response, error) {
	// A connect that gets no answer (the other host not up yet: its SYN
	// goes nowhere) would wait for TCP's SYN retries, minutes.
	d := net.Dialer{Timeout: 2 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", c.Addr)
	if err != nil {
		return response{}, fmt.Errorf("agent %s: %w", c.Addr, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return response{}, fmt.Errorf("agent %s: %s: %w", c.Addr, req.Op, err)
	}
	var resp response
	if err := json.NewDecoder(conn).Decode(&resp); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return response{}, fmt.Errorf("agent %s: %s: %w", c.Addr, req.Op, err)
	}
	if resp.Err != "" {
		return resp, fmt.Errorf("agent %s: %s", c.Addr, resp.Err)
	}
	return resp, nil
}

// Info reports the agent's environment: RDMA_TEST_ADDR, RDMA_TEST_DEVICE,
// RDMA_TEST_NETDEV, RDMA_TEST_PEER_ADDR, SOFTROCE_PAIR and hostname.
func (c *Client) Info(ctx context.Context) (map[string]string, error) {
	resp, err := c.call(ctx, request{Op: "info"})
	return resp.Info, err
}

// WaitReady retries Info until the agent answers or ctx ends (the other
// guest boots alongside this one). Its error names the last attempt that
// did not time out (a refusal says more than a dial cut short by ctx).
func (c *Client) WaitReady(ctx context.Context) (map[string]string, error) {
	var last error
	for {
		info, err := c.Info(ctx)
		if err == nil {
			return info, nil
		}
		var ne net.Error
		if cut := ctx.Err() != nil || errors.As(err, &ne) && ne.Timeout(); last == nil || !cut {
			last = err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("agent %s did not answer: %w (last: %w)", c.Addr, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Cmd is a process to start on the agent's host.
type Cmd struct {
	Args []string // program and arguments; the program is looked up in PATH
	Env  []string // KEY=value added to the agent's environment
	Dir  string   // working directory; "" is the agent's
}

// Start starts cmd on the agent's host.
func (c *Client) Start(ctx context.Context, cmd Cmd) (*Proc, error) {
	resp, err := c.call(ctx, request{Op: "start", Args: cmd.Args, Env: cmd.Env, Dir: cmd.Dir})
	if err != nil {
		return nil, err
	}
	return &Proc{c: c, ID: resp.ID, Args: cmd.Args}, nil
}

// Run runs cmd to its end and returns its output; a non-zero exit is an
// error that includes the output.
func (c *Client) Run(ctx context.Context, args ...string) (string, error) {
	p, err := c.Start(ctx, Cmd{Args: args})
	if err != nil {
		return "", err
	}
	st, err := p.Wait(ctx)
	if err != nil {
		p.Signal(context.Background(), syscall.SIGKILL)
		return st.Output, err
	}
	if st.Code != 0 || st.Signal != "" {
		return st.Output, fmt.Errorf("peer: %s: %v: %s", strings.Join(args, " "), st, strings.TrimSpace(st.Output))
	}
	return st.Output, nil
}

// PowerOff cuts the agent's machine's power (reboot(2), no sync). The
// agent answers first; the connection to it is gone after.
func (c *Client) PowerOff(ctx context.Context) error {
	_, err := c.call(ctx, request{Op: "poweroff"})
	return err
}

// Proc is a process started by an agent.
type Proc struct {
	c    *Client
	ID   int
	Args []string
}

func (p *Proc) String() string {
	return fmt.Sprintf("peer process %d (%s)", p.ID, strings.Join(p.Args, " "))
}

// Status returns the process's state now.
func (p *Proc) Status(ctx context.Context) (Status, error) {
	resp, err := p.c.call(ctx, request{Op: "wait", ID: p.ID})
	if err != nil {
		return Status{}, err
	}
	return *resp.Status, nil
}

// Wait waits for the process to end, or for ctx to end: then it returns the
// status so far (output included) and ctx's error.
func (p *Proc) Wait(ctx context.Context) (Status, error) {
	for {
		step := 5 * time.Second
		if dl, ok := ctx.Deadline(); ok {
			if left := time.Until(dl) - 100*time.Millisecond; left < step {
				step = max(left, 0)
			}
		}
		// The call itself may run a little past step: give it room.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), step+10*time.Second)
		resp, err := p.c.call(cctx, request{Op: "wait", ID: p.ID, Timeout: step})
		cancel()
		if err != nil {
			return Status{}, fmt.Errorf("wait for %v: %w", p, err)
		}
		if resp.Status.Exited {
			return *resp.Status, nil
		}
		if ctx.Err() != nil || step == 0 {
			err := ctx.Err()
			if err == nil {
				err = context.DeadlineExceeded
			}
			return *resp.Status, fmt.Errorf("%v still running: %w", p, err)
		}
	}
}

// Signal sends sig to the process. It fails if the process has ended.
func (p *Proc) Signal(ctx context.Context, sig syscall.Signal) error {
	_, err := p.c.call(ctx, request{Op: "signal", ID: p.ID, Signal: int(sig)})
	return err
}
