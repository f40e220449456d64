//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/verbline/rdma/internal/cmsetup"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// hello is this side's half of the handshake (docs/protocol.md): its
// protocol version and features, its credits (the initial receive window;
// more are granted as it grows, window.go), its receive buffer size and
// the largest message it accepts (maxRecvMessage; those larger than a
// receive buffer come by rendezvous). Announcing fewer credits than the
// receives posted is safe, so a window beyond the 16-bit field would be
// announced as 65535.
func (c *engine) hello() []byte {
	h := wire.Hello{Version: wire.Version, Minor: wire.Minor, Features: c.announced(),
		Credits: uint16(min(c.win.size, math.MaxUint16)), RecvBufSize: uint32(c.cfg.BufferSize),
		MaxMsgSize: uint32(c.maxRecvMessage())}
	return h.AppendTo(nil)
}

// announced is the feature set this side's Hello announces: all it knows,
// less atomics where the device has none, and requiring trailers only
// where it has no immediate data.
func (c *engine) announced() wire.Features {
	f := wire.Supported
	if c.dev.Caps.Atomics == verbs.AtomicNone {
		f &^= wire.FeatureAtomics
	}
	if !c.needsTrailers() {
		f &^= wire.FeatureTrailersRequired
	}
	return f
}

// agreed is the peer's Hello as the connection uses it: its Features are
// those both sides support (wire.Negotiate), which is all either side may
// use on the connection, plus wire.FeatureTrailersRequired when the
// connection carries its headers in trailers (wire.ConnTrailers: either
// side's device lacks immediate data). A peer of a later minor version
// announces features this side does not know; they drop out here.
// ours is the Hello this side sent: its features are what it announced
// (in tests, a peer of another version announces fewer). The error is
// wire.ErrNoTrailers: the two sides cannot talk.
func agreed(ours []byte, peer wire.Hello) (wire.Hello, error) {
	announced := wire.Supported &^ wire.FeatureTrailersRequired
	if h, err := wire.ParseHello(ours); err == nil {
		announced = h.Features
	}
	trailers, err := wire.ConnTrailers(announced, peer.Features)
	if err != nil {
		return wire.Hello{}, err
	}
	peer.Features = wire.Negotiate(announced, peer.Features) &^ wire.FeatureTrailersRequired
	if trailers {
		peer.Features |= wire.FeatureTrailersRequired
	}
	return peer, nil
}

// helloFunc builds the private data a side sends in its half of the
// handshake: (*Conn).hello, or in tests a peer of another version.
type helloFunc func(*Conn) []byte

// awaitEstablished waits for the dialer's RTU (EventEstablished) after an
// accept. If the QP hears from the dialer first (heard is cancelled: a dialer
// with nothing of its own to send sends an empty message 50 ms after it
// established, see confirmEstablished), the RTU was lost or is late: the
// CM is told so (rdma_notify, the verbs remedy for a lost RTU, which
// applications call on the COMM_EST async event; the first receive
// completion says the same and needs no async-event plumbing) and raises
// EventEstablished at once.
// heard is a context derived from ctx.
func awaitEstablished(ctx context.Context, ch *rdmacm.Channel, id *rdmacm.ID, heard context.Context) error {
	wait := heard
	for {
		ev, err := cmsetup.WaitEvent(wait, ch)
		if err != nil && wait == heard && heard.Err() != nil && ctx.Err() == nil {
			wait = ctx
			// Usually the RTU came first and the CM is past this state:
			// it refuses (EINVAL, EISCONN) and its event is on its way.
			// On any failure the CM's own retries still apply.
			_ = id.NotifyEstablished()
			continue
		}
		if err != nil {
			return err
		}
		return cmsetup.CheckEvent(ev, rdmacm.EventEstablished, "waiting for the dialer to establish")
	}
}

// awaitFirstMessage waits, on the passive side of a device where the
// connecting side must send first (iWARP), for the dialer's first message
// (heard), ending early if the dialer disconnects instead: a dialer that
// refused this side's Hello can no longer reject once the CM connected the
// QPs, so it disconnects.
func (c *engine) awaitFirstMessage(ctx context.Context, ch *rdmacm.Channel, heard context.Context) error {
	for heard.Err() == nil {
		ev, err := cmsetup.WaitEvent(heard, ch)
		if err != nil {
			break // heard (or ctx, from which it derives) is done
		}
		if ev.Type == rdmacm.EventDisconnected {
			// The dialer's message may be in the CQ still: take the QP
			// down, and its flushes (behind that message) end the wait.
			c.mu.Lock()
			c.answerDisconnectLocked()
			c.qpDownLocked()
			c.mu.Unlock()
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%w: the dialer sent nothing after establishing, and on this device (%s) "+
			"the connecting side must send first: %w", ErrHandshake, c.dev.Caps.Transport, context.Cause(ctx))
	}
	c.mu.Lock()
	ended := c.firstEnded
	c.mu.Unlock()
	if ended {
		return fmt.Errorf("%w: the dialer disconnected before sending anything (it may have refused this "+
			"side's Hello: see its error)", ErrHandshake)
	}
	return nil
}

// dialConn runs the active side: resolve address and route, create the QP
// (INIT), send our hello in the connect request, and on the listener's answer
// validate its hello, move the QP to RTR and RTS and establish.
//
// Where the CM connects the QP (iWARP) the dial is a kernel TCP connection
// from the port rdma_cm gave the id, and rdma_cm picks ports without asking
// TCP: the port may be bound by a TCP socket (the connect fails with
// EADDRINUSE), or a live socket may connect the same two ports (a closed
// connection's, which TCP is still closing after rdma_cm freed its port:
// EADDRNOTAVAIL; a pair in TIME_WAIT is reused), and nothing has reached
// the listener. The dial is made again from a new id, so from
// another port, at most tcpPortAttempts times in all.
func dialConn(ctx context.Context, cfg *Config, laddr, raddr netip.AddrPort) (*Conn, error) {
	for attempt := 1; ; attempt++ {
		c, err := dialHello(ctx, cfg, laddr, raddr, (*Conn).hello)
		if err == nil || !errors.Is(err, errTCPPortTaken) || attempt == tcpPortAttempts || ctx.Err() != nil {
			return c, err
		}
	}
}

// tcpPortAttempts bounds dialConn's attempts when TCP holds the port
// rdma_cm chose: rdma_cm picks at random from the ephemeral range (and
// never its last port twice in a row), so three ports in a row taken
// means TCP holds much of the range.
const tcpPortAttempts = 3

// errTCPPortTaken marks an iWARP connect that TCP refused the local port
// rdma_cm chose.
var errTCPPortTaken = errors.New("the kernel's TCP holds the local port rdma_cm chose (iWARP connections " +
	"are TCP connections, and rdma_cm does not ask TCP): a TCP socket is bound to it, or one connects the " +
	"same two ports; the dial tried a new port each time (if TCP holds much of the ephemeral range, " +
	"net.ipv4.ip_local_port_range, widen it)")

// dialHello is dialConn announcing hello's private data.
func dialHello(ctx context.Context, cfg *Config, laddr, raddr netip.AddrPort, hello helloFunc) (_ *Conn, err error) {
	st := cmsetup.StartSteps("dial")
	ch, id, err := cmsetup.NewChannelID()
	if err != nil {
		return nil, err
	}
	st.Step("create channel+id")
	var c *Conn
	abandoned := false // a blocking connect outlived ctx: its goroutine undoes the set-up
	defer func() {
		if err != nil && !abandoned {
			undo(c, id, ch)
		}
	}()
	if err = id.ResolveAddr(laddr, raddr, cmsetup.MsUntil(ctx)); err != nil {
		return nil, cmsetup.ClassifyResolve(err, raddr.Addr())
	}
	if _, err = cmsetup.Expect(ctx, ch, rdmacm.EventAddrResolved, "resolving the address"); err != nil {
		return nil, err
	}
	st.Step("resolve addr")
	if err = id.ResolveRoute(cmsetup.MsUntil(ctx)); err != nil {
		return nil, cmsetup.ClassifyResolve(err, raddr.Addr()) // e.g. loopback: no RDMA device routes there
	}
	// While the kernel resolves the route: the address gave the device and
	// port, which is all the QP, the rings and the INIT transition need.
	if c, err = newConn(cfg, ch, id); err != nil {
		return nil, err
	}
	st.Step("new conn (endpoint, rings)")
	ep := c.ep
	if err = ep.moveQP(id, verbs.StateInit); err != nil {
		return nil, err
	}
	st.Step("QP INIT")
	if err = ep.postInitialRecvs(); err != nil {
		return nil, err
	}
	st.Step("post receives")
	if _, err = cmsetup.Expect(ctx, ch, rdmacm.EventRouteResolved, "resolving the route"); err != nil {
		return nil, err
	}
	st.Step("resolve route (rest)")
	// The READ/atomic depths this side offers; the listener answers with
	// its own, no larger, and rdma_cm gives this side's QP the agreed ones
	// at RTR and RTS (the REP's initiator depth and responder resources).
	resp := uint8(min(cfg.ReadDepth, int(ep.lim.MaxQPRdAtom)))
	init := uint8(min(cfg.ReadDepth, int(ep.lim.MaxQPInitRdAtom)))
	ours := hello(c)
	// Where the CM connects the QP itself (iWARP), rdma_connect makes a
	// TCP connection (Blocking), and the listener's answer comes with
	// ESTABLISHED: the QP is in RTS already, and a bad answer can only be
	// refused by disconnecting (undo).
	cmQP := c.dev.Caps.CMConnectsQP
	param := rdmacm.ConnParam{PrivateData: ours, ResponderResources: resp, InitiatorDepth: init,
		RetryCount: uint8(cfg.RetryCount), RNRRetryCount: rnrRetry, QPNum: ep.qp.Num, Blocking: cmQP}
	if cmQP {
		if abandoned, err = connectBlocking(ctx, c, id, ch, param); err != nil {
			if errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.EADDRINUSE) {
				err = fmt.Errorf("%w (local port %d): %w", errTCPPortTaken, id.LocalAddr().Port(), err)
			}
			return nil, err
		}
	} else if err = id.Connect(param); err != nil {
		return nil, err
	}
	answer := rdmacm.EventConnectResponse
	if cmQP {
		answer = rdmacm.EventEstablished
	}
	ev, err := cmsetup.Expect(ctx, ch, answer, "waiting for the listener")
	if err != nil {
		return nil, err
	}
	st.Step("connect -> response")
	peer, err := wire.ParseHello(ev.PrivateData)
	if err != nil {
		code, reason := refusal(err, "listener", "dialer")
		if !cmQP {
			cmsetup.SendReject(id, code, reason)
		}
		return nil, fmt.Errorf("%w: listener's answer: %w", ErrHandshake, err)
	}
	if peer, err = agreed(ours, peer); err != nil {
		if !cmQP {
			cmsetup.SendReject(id, wire.RejectIncompatible, err.Error())
		}
		return nil, fmt.Errorf("%w: listener's answer: %w", ErrHandshake, err)
	}
	if err = c.setPeer(peer); err != nil {
		return nil, err
	}
	if cmQP {
		ep.connectedByCM()
	} else {
		if err = ep.moveQP(id, verbs.StateRTR, verbs.StateRTS); err != nil {
			return nil, err
		}
		st.Step("QP RTR+RTS")
		if err = id.Establish(); err != nil {
			return nil, err
		}
	}
	st.Step("establish")
	ep.established = true // its QP may go to the pool when it closes
	c.start()
	c.confirmEstablished()
	st.Step("start")
	return c, nil
}

// connectBlocking runs a connect that may block in the kernel (iWARP's
// rdma_connect makes its TCP connection inside the call on siw: a peer
// that does not answer holds it for TCP's connect timeout, minutes) so
// that ctx still bounds the dial: the call runs on a goroutine of its own,
// and if ctx ends first the dial fails with os.ErrDeadlineExceeded (or
// ctx's error) while that goroutine, once the call returns, tears down
// what the dial set up (abandoned: the caller must not).
func connectBlocking(ctx context.Context, c *Conn, id *rdmacm.ID, ch *rdmacm.Channel, p rdmacm.ConnParam) (abandoned bool, err error) {
	done := make(chan error, 1)
	go func() { done <- id.Connect(p) }()
	select {
	case err := <-done:
		return false, err
	case <-ctx.Done():
		go func() {
			<-done
			undo(c, id, ch)
		}()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return true, fmt.Errorf("connecting: %w", os.ErrDeadlineExceeded)
		}
		return true, fmt.Errorf("connecting: %w", ctx.Err())
	}
}

// confirmAfter is how long a new connection's dialer may send nothing
// before confirmEstablished sends its empty message: far below the CM's
// REP retransmission (about 4 s) and HandshakeTimeout, and long enough
// that most dialers' own first message goes out first (no cost to them).
// Where the connecting side must send first (iWARP) it goes at once: the
// listener's accept waits for it.
const confirmAfter = 50 * time.Millisecond

// confirmEstablished makes sure the listener receives something on the QP
// soon after the dialer established: if this side has posted no send
// within confirmAfter, an empty control message (a keepalive probe, which
// the peer's completion handler just reposts). The RTU that tells the
// listener's CM the dialer is established is one unacknowledged datagram;
// if a lossy wire drops it the CM resends its REP only after its response
// timeout, close to HandshakeTimeout, and the accept fails while this side
// thinks it is connected. A message on the QP is reliable (RC retransmits
// it), and its arrival lets the listener establish at once
// (awaitEstablished). Peers without the control-message reserve are left
// to the CM's retries.
func (c *engine) confirmEstablished() {
	if c.features&wire.FeatureControlReserve == 0 {
		return
	}
	if c.activeSendsFirst() {
		c.mu.Lock()
		c.sendCtlLocked(wire.KindKeepalive)
		c.mu.Unlock()
		c.reprobe(confirmAfter, time.Now().Add(c.cfg.HandshakeTimeout))
		return
	}
	sent := c.ep.qp.PostCounts().SendWRs // a pooled QP's counts run on
	time.AfterFunc(confirmAfter, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.closed || c.qpDown || c.released || c.ep.qp.PostCounts().SendWRs != sent {
			return // gone, or the listener has had (or will have) a message
		}
		c.sendCtlLocked(wire.KindKeepalive)
	})
}

// reprobe sends the dialer's first message again after the delay, and
// again at doubling delays until the listener's answer arrives (a listener
// that heard the first message sends one back, acceptHello) or the dialer's
// HandshakeTimeout has passed. Soft-iWARP can leave a message unread that
// reaches the listener during its accept: siw_accept sends the MPA reply
// before it gives the socket's data-ready upcall to the QP, and the upcall
// it replaces ignores data once the endpoint is in RDMA mode (Linux 6.1 and
// 6.12, siw_cm.c). Such a message is read only when the next one arrives;
// without another, the listener would give up at its HandshakeTimeout and
// reset a connection its dialer believes established.
func (c *engine) reprobe(after time.Duration, until time.Time) {
	time.AfterFunc(after, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.closed || c.qpDown || c.released || c.peerHeard {
			return
		}
		c.sendCtlLocked(wire.KindKeepalive) // refused only while the previous probe is in flight
		if next := 2 * after; time.Now().Add(next).Before(until) {
			c.reprobe(next, until)
		}
	})
}

// activeSendsFirst reports whether this connection follows the rule of
// devices where the connecting side must send first (iWARP), or a test
// made it follow the rule on another device.
func (c *engine) activeSendsFirst() bool {
	return c.dev.Caps.ActiveSendsFirst || forceActiveSendsFirst.Load()
}

// forceActiveSendsFirst, set by tests, makes new connections follow the
// rule of devices where the connecting side must send first, so that the
// rule's handshake runs on Soft-RoCE too.
var forceActiveSendsFirst atomic.Bool

// missFirstMessages, set by tests, is how many dialers' first messages
// listeners fail to notice (their handshakes wait on for the next message),
// as Soft-iWARP does when the message arrives during its accept (reprobe).
var missFirstMessages atomic.Int32

// missFirst reports whether the first receive completion of an accept in
// progress goes unnoticed (missFirstMessages); heard: it was a message.
func missFirst(heard bool) bool {
	return heard && missFirstMessages.Load() > 0 && missFirstMessages.Add(-1) >= 0
}

// acceptConn runs the passive side for one connection request: validate the
// dialer's hello (refusing it with a reason the dialer sees), move the id to
// its own event channel, bring the QP to RTS, accept with our hello and wait
// until the dialer establishes.
func acceptConn(ctx context.Context, cfg *Config, ev rdmacm.Event) (*Conn, error) {
	return acceptHello(ctx, cfg, ev, (*Conn).hello)
}

// acceptHello is acceptConn answering with hello's private data.
func acceptHello(ctx context.Context, cfg *Config, ev rdmacm.Event, hello helloFunc) (_ *Conn, err error) {
	child := ev.ID
	st := cmsetup.StartSteps("accept")
	peer, err := wire.ParseHello(ev.PrivateData)
	if err != nil {
		code, reason := refusal(err, "dialer", "listener")
		cmsetup.Reject(child, code, reason)
		return nil, err
	}
	ch, err := cmsetup.NewChannel()
	if err != nil {
		cmsetup.Reject(child, wire.RejectResources, err.Error())
		return nil, err
	}
	if err := child.Migrate(ch); err != nil {
		cmsetup.Reject(child, wire.RejectResources, err.Error())
		ch.Close()
		return nil, err
	}
	st.Step("channel+migrate")
	var c *Conn
	defer func() {
		if err != nil {
			undo(c, child, ch)
		}
	}()
	fail := func(e error) error {
		cmsetup.SendReject(child, wire.RejectResources, e.Error())
		return e
	}
	if c, err = newConn(cfg, ch, child); err != nil {
		return nil, fail(err)
	}
	st.Step("new conn (endpoint, rings)")
	ours := hello(c)
	if peer, err = agreed(ours, peer); err != nil {
		cmsetup.SendReject(child, wire.RejectIncompatible, err.Error())
		return nil, fmt.Errorf("%w: dialer's request: %w", ErrHandshake, err)
	}
	if err = c.setPeer(peer); err != nil {
		return nil, fail(err)
	}
	ep := c.ep
	// The depths: rdma_cm reports the dialer's initiator depth as the
	// responder resources asked of this side, and the dialer's responder
	// resources as the initiator depth this side may use (it swaps them).
	// This side's QP reaches RTS before the accept, so it sets them itself
	// (rdma_cm would give it the dialer's), and the accept tells the dialer.
	ep.destRdAtomic = uint8(min(cfg.ReadDepth, int(ep.lim.MaxQPRdAtom), int(ev.ResponderResources)))
	ep.rdAtomic = uint8(min(cfg.ReadDepth, int(ep.lim.MaxQPInitRdAtom), int(ev.InitiatorDepth)))
	// Where the CM connects the QP itself (iWARP), INIT is all this side
	// does: rdma_accept takes it to RTS.
	cmQP := c.dev.Caps.CMConnectsQP
	states := []verbs.QPState{verbs.StateInit, verbs.StateRTR, verbs.StateRTS}
	if cmQP {
		states = states[:1]
	}
	if err = ep.moveQP(child, states...); err != nil {
		return nil, fail(err)
	}
	st.Step("QP INIT+RTR+RTS")
	heard, hear := context.WithCancel(ctx)
	defer hear()
	c.mu.Lock()
	c.firstHeard = hear // before a receive is posted: nothing can complete yet
	c.mu.Unlock()
	if err = ep.postInitialRecvs(); err != nil {
		return nil, fail(err)
	}
	st.Step("post receives")
	if err = child.Accept(rdmacm.ConnParam{PrivateData: ours, ResponderResources: ep.destRdAtomic, InitiatorDepth: ep.rdAtomic,
		RNRRetryCount: rnrRetry, QPNum: ep.qp.Num, Blocking: cmQP}); err != nil {
		return nil, err
	}
	if err = awaitEstablished(ctx, ch, child, heard); err != nil {
		return nil, err
	}
	if cmQP {
		ep.connectedByCM()
	}
	awaitFirst := c.activeSendsFirst() && c.features&wire.FeatureControlReserve != 0
	if awaitFirst {
		// This side may send only once the dialer has (iWARP's MPA): the
		// dialer's first message, a probe that uses the control-message
		// reserve, comes at once (confirmEstablished).
		if err = c.awaitFirstMessage(ctx, ch, heard); err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	c.firstHeard = nil
	c.mu.Unlock()
	st.Step("accept -> established")
	ep.established = true // its QP may go to the pool when it closes
	c.start()
	if awaitFirst {
		// The answer that ends the dialer's repeated probes (reprobe).
		c.mu.Lock()
		c.sendCtlLocked(wire.KindKeepalive)
		c.mu.Unlock()
	}
	st.Step("start")
	return c, nil
}

// refusal is the reject code and reason for a peer's Hello that did not
// parse (err from wire.ParseHello), worded for the peer, who reads it:
// roles name the peer and this side, as "peer" would be the reader itself.
func refusal(err error, peerRole, selfRole string) (wire.RejectCode, string) {
	if ve := (*wire.VersionError)(nil); errors.As(err, &ve) {
		return wire.RejectVersion, fmt.Sprintf("%s speaks verbline wire protocol %s, this %s %d.%d: "+
			"the major versions must match; use one major version on both sides",
			peerRole, ve.PeerVersion(), selfRole, wire.Version, wire.Minor)
	}
	return wire.RejectMalformed, err.Error()
}

// undo frees what a dial or accept that failed half-way had set up, in
// reverse order: the connection's verbs objects, its cm id, its channel.
func undo(c *Conn, id *rdmacm.ID, ch *rdmacm.Channel) {
	if c != nil {
		c.abort()
	}
	id.Destroy()
	ch.Close()
}

// rnrRetry is how often the peer's NIC retries a send that found no posted
// receive here. Credit-based flow control means it never happens with a
// well-behaved peer; 7 would mean "retry forever", so a peer that sends
// beyond its credits would stall instead of failing: 6 bounds it.
const rnrRetry = 6
