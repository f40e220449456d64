package rdma

import "net"

// Listener accepts RDMA connections. It implements net.Listener.
//
// Each method is written once here: it defers to the fallback listener
// where ListenConfig.Fallback is set (fallback.go), else to the RDMA
// acceptor (acceptor.go; engine_stub.go in builds without RDMA), whose
// documentation says how handshakes, the backlog and ListenConfig.Admit
// are handled.
type Listener struct {
	fb *fallbackListener // non-nil: ListenConfig.Fallback; every method defers to it
	acceptor
}

var _ net.Listener = (*Listener)(nil)

// Accept waits for and returns the next connection (a *Conn).
func (l *Listener) Accept() (net.Conn, error) {
	if l.fb != nil {
		return l.fb.acceptConn()
	}
	c, err := l.accept()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// AcceptRDMA is Accept returning the concrete type.
func (l *Listener) AcceptRDMA() (*Conn, error) {
	if l.fb != nil {
		return l.fb.accept()
	}
	return l.accept()
}

// Close stops listening. Connections already accepted stay open; those
// established but not yet accepted are closed, and blocked Accept calls
// return net.ErrClosed.
func (l *Listener) Close() error {
	if l.fb != nil {
		return l.fb.close()
	}
	return l.close()
}

// Addr returns the listener's address; with port 0 requested, the port chosen.
func (l *Listener) Addr() net.Addr {
	if l.fb != nil {
		return l.fb.addr
	}
	return l.localAddr()
}
