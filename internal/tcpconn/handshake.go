package tcpconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/verbline/rdma/internal/errs"
	"github.com/verbline/rdma/internal/tcpframe"
)

// Dial runs the dialer's half of the hello exchange on nc, bounded by ctx,
// and starts the connection. completion makes a PostSend's end.
func Dial[C, N any](ctx context.Context, nc *net.TCPConn, o *Options, completion func(id uint64, err error) C) (*Conn[C, N], error) {
	lim := o.limits()
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Now()) })
	defer stop()
	if d, ok := ctx.Deadline(); ok {
		nc.SetDeadline(d)
	}
	h := lim.Hello()
	if _, err := nc.Write(h.AppendTo(nil)); err != nil {
		return nil, ctxErr(ctx, err)
	}
	peer, err := tcpframe.ReadHello(nc)
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	if peer.Reject {
		return nil, fmt.Errorf("%w: listener refused the connection: %s", errs.ErrHandshake, peer.Reason)
	}
	if !stop() {
		return nil, ctxErr(ctx, os.ErrDeadlineExceeded)
	}
	nc.SetDeadline(time.Time{})
	return newConn[C, N](nc, o, lim, completion, peer), nil
}

// Accept runs the listener's half on nc: read the dialer's hello, ask
// admit, answer (or refuse) within o.HandshakeTimeout, and start the
// connection. completion makes a PostSend's end.
func Accept[C, N any](nc *net.TCPConn, o *Options, completion func(id uint64, err error) C,
	admit func(*net.TCPConn) error) (*Conn[C, N], error) {
	lim := o.limits()
	nc.SetDeadline(time.Now().Add(o.HandshakeTimeout))
	peer, err := tcpframe.ReadHello(nc)
	if err != nil {
		if errors.Is(err, errs.ErrHandshake) && !errors.Is(err, tcpframe.ErrNotFallbackPeer) {
			// A fallback dialer of another version: tell it why.
			tcpframe.WriteReject(nc, err.Error())
		}
		return nil, err
	}
	if peer.Reject {
		return nil, fmt.Errorf("%w: a dialer sent a reject", errs.ErrHandshake)
	}
	if admit != nil {
		if aerr := admit(nc); aerr != nil {
			tcpframe.WriteReject(nc, aerr.Error())
			return nil, aerr
		}
	}
	h := lim.Hello()
	if _, err := nc.Write(h.AppendTo(nil)); err != nil {
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	return newConn[C, N](nc, o, lim, completion, peer), nil
}

// ctxErr is err, or the context's reason if ctx ended (its AfterFunc set
// the deadline that caused err).
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		return err
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return os.ErrDeadlineExceeded
	}
	return ctx.Err()
}
