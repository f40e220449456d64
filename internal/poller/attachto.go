//go:build linux && cgo

package poller

import "fmt"

// AttachTo is Attach onto a given poller of the group: for a connection
// whose QP already completes into p's CQ (a QP taken from a device's pool
// of reset QPs keeps the CQs it was created with). It fails if p failed or
// its CQ cannot take entries more.
func (g *Group) AttachTo(p *Poller, h Handler, entries int) (uint32, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return 0, fmt.Errorf("attaching a connection to a closed poller group")
	}
	if err := p.Err(); err != nil {
		return 0, err
	}
	if p.reserved+entries > g.cqRoom(p) {
		return 0, fmt.Errorf("%w: a connection needs %d more completion queue entries; this CQ has %d of %d reserved",
			errCQFull, entries, p.reserved, g.cqRoom(p))
	}
	if err := g.growCQ(p, p.reserved+entries); err != nil {
		return 0, fmt.Errorf("growing the shared CQ for a new connection: %w", err)
	}
	p.reserved += entries
	return p.handlers.add(h), nil
}
