package rdma

import (
	"context"
	"fmt"
	"net"
	"sync"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/tcpconn"
)

// What a TCP-backed Conn's connection (internal/tcpconn) takes from this
// package, which it cannot import: its options from the Config, the
// process's fallback pool, and this package's completion and notification
// types.

// tcpPool holds the TCP-backed connections' buffers: Alloc, received
// messages and stream chunks. It is not registered with any device. There
// is one per process, and the first fallback user's Config.PoolMaxBytes
// (0: 1 GiB) caps it for good: a fallback listener at Listen, a fallback
// dialer at its first TCP connection, whichever comes first. Later Configs
// neither raise nor lower it. This is the device pools' rule (a device's
// first connection sets its pool's cap), and a bound that any later
// caller could raise would bound nothing.
var tcpPool struct {
	mu sync.Mutex
	p  *buffer.Pool
}

// fallbackPoolFor returns the fallback pool, made with maxBytes (0: 1 GiB)
// as its cap if this is the first use.
func fallbackPoolFor(maxBytes int64) (*buffer.Pool, error) {
	tcpPool.mu.Lock()
	defer tcpPool.mu.Unlock()
	if tcpPool.p == nil {
		p, err := buffer.NewPool(nil, buffer.Options{MaxBytes: maxBytes})
		if err != nil {
			return nil, fmt.Errorf("the TCP fallback's buffer pool (Config.PoolMaxBytes %d): %w", maxBytes, err)
		}
		tcpPool.p = p
	}
	return tcpPool.p, nil
}

// fallbackPool returns the fallback pool (made with the default cap if
// this is the first use).
func fallbackPool() (*buffer.Pool, error) { return fallbackPoolFor(0) }

// tcpOptions is what a TCP-backed connection takes from cfg (defaults
// applied), with its buffers from pool.
func tcpOptions(cfg *Config, pool *buffer.Pool) *tcpconn.Options {
	return &tcpconn.Options{
		RecvBuffers: cfg.RecvBuffers, SendBuffers: cfg.SendBuffers, BufferSize: cfg.BufferSize,
		MaxMessageSize:   cfg.MaxMessageSize,
		KeepAlive:        cfg.KeepAlive,
		HandshakeTimeout: cfg.HandshakeTimeout,
		CloseTimeout:     cfg.CloseTimeout,
		Pool:             pool,
	}
}

// tcpCompletion is a PostSend's end over TCP, as Completions() delivers it.
func tcpCompletion(id uint64, err error) OpCompletion { return OpCompletion{ID: id, Err: err} }

// tcpHandshakeDial runs the dialer's half of the hello exchange on nc,
// bounded by ctx.
func tcpHandshakeDial(ctx context.Context, nc *net.TCPConn, cfg *Config) (*tcpconn.Conn[OpCompletion, Notification], error) {
	pool, err := fallbackPoolFor(cfg.PoolMaxBytes)
	if err != nil {
		return nil, err
	}
	return tcpconn.Dial[OpCompletion, Notification](ctx, nc, tcpOptions(cfg, pool), tcpCompletion)
}

// tcpHandshakeAccept runs the listener's half on nc: read the dialer's
// hello, ask admit, answer (or refuse) within cfg.HandshakeTimeout.
func tcpHandshakeAccept(nc *net.TCPConn, cfg *Config, admit func(*net.TCPConn) error) (*tcpconn.Conn[OpCompletion, Notification], error) {
	pool, err := fallbackPoolFor(cfg.PoolMaxBytes)
	if err != nil {
		return nil, err
	}
	return tcpconn.Accept[OpCompletion, Notification](nc, tcpOptions(cfg, pool), tcpCompletion, admit)
}
