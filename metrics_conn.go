//go:build linux && cgo

package rdma

import (
	"sync/atomic"

	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/verbs"
	"github.com/verbline/rdma/internal/wire"
)

// The connections' and devices' side of metrics.go: the counts a
// connection keeps beyond its QP's post counters, and what a snapshot reads
// from a live connection or device. The hooks into the data path are single
// lines: Write and Send count what they posted, senders report whether they
// found credit (creditCheck), and the poller hands each batch of completions
// to countCompletions, which counts what arrived and passes the batch on.

// connCounters are a connection's payload, message and credit-stall
// counts: atomics, each added to once per call or per batch of
// completions, read by snapshots.
type connCounters struct {
	bytesSent, msgsSent         atomic.Uint64 // by Write, Send and PostSend
	bytesReceived, msgsReceived atomic.Uint64 // by countCompletions (the CQ's owner)
	creditStalls                atomic.Uint64
	// noCredit: the last sender to look found no credit (guarded by Conn.mu).
	noCredit bool
}

// wrote counts n stream bytes posted by Write.
func (k *connCounters) wrote(n int) {
	if n > 0 {
		k.bytesSent.Add(uint64(n))
	}
}

// sent counts a message of n bytes posted by Send or PostSend.
func (k *connCounters) sent(n int) {
	k.msgsSent.Add(1)
	k.bytesSent.Add(uint64(n))
}

// creditCheck is called, with Conn.mu held, each time a sender (Write,
// Send) looks for room to send, with whether the peer's window is closed
// (no credit a data message may use). A stall is counted when the window
// is found closed after it was last seen open: a sender spinning or
// waiting on a closed window counts once.
func (k *connCounters) creditCheck(noCredit bool) {
	if noCredit && !k.noCredit {
		k.creditStalls.Add(1)
	}
	k.noCredit = noCredit
}

// countCompletions is the connection's completion handler as the poller
// sees it: it counts the payload that arrived in wcs, then applies them
// (handleCompletions).
func (c *engine) countCompletions(wcs []verbs.WC) {
	bytes, msgs := countArrived(wcs)
	if bytes > 0 {
		c.counts.bytesReceived.Add(bytes)
	}
	if msgs > 0 {
		c.counts.msgsReceived.Add(msgs)
	}
	c.handleCompletions(wcs)
}

// countArrived counts the payload bytes and messages that arrived in wcs:
// stream data, messages, and large messages (one when announced, their
// bytes when their RDMA READ completed). Control messages, one-sided
// notifications and failed completions carry none.
func countArrived(wcs []verbs.WC) (bytes, msgs uint64) {
	for i := range wcs {
		wc := &wcs[i]
		if wc.Status != verbs.WCSuccess {
			continue
		}
		switch wc.WRID & wrKindMask {
		case wrRecv:
			if wc.Opcode == verbs.WCRecvRDMAWithImm || !wc.HasImm() {
				continue // a one-sided notification; or a protocol error that handleCompletions reports
			}
			switch kind, _, _ := wire.DecodeImm(wc.Imm); kind {
			case wire.KindData:
				bytes += uint64(wc.ByteLen)
			case wire.KindMessage:
				msgs++
				bytes += uint64(wc.ByteLen)
			case wire.KindRendezvous:
				msgs++ // its bytes when the READ completes
			}
		case wrReadRv:
			bytes += uint64(wc.ByteLen) // a large message read from the sender's buffer
		}
	}
	return bytes, msgs
}

// registerConn adds an established connection to the process's metrics;
// unregisterConn removes it once closed, keeping its counts in its
// device's totals.
func registerConn(c *engine)   { metricsReg.addConn(c, c.dev) }
func unregisterConn(c *engine) { metricsReg.removeConn(c) }

func (c *engine) metricsDevice() string { return c.dev.ctx.Name() }

// readCounters adds the connection's own counts: its QP's posts and its
// payload, messages and stalls (the poller counts are the device's).
func (c *engine) readCounters(k *Counters) {
	k.BytesSent += c.counts.bytesSent.Load()
	k.BytesReceived += c.counts.bytesReceived.Load()
	k.MessagesSent += c.counts.msgsSent.Load()
	k.MessagesReceived += c.counts.msgsReceived.Load()
	k.CreditStalls += c.counts.creditStalls.Load()
	st := postStats(c.ep.qp)
	st.KeepaliveProbes = c.keepaliveProbes()
	k.ConnStats.add(&st)
	k.BufferBytes += c.ringBytes()
}

func (d *device) metricsDevice() string { return d.ctx.Name() }

// readCounters adds the device's pollers' counts and its pool's.
func (d *device) readCounters(k *Counters) {
	for _, p := range d.pollers.Pollers() {
		k.ConnStats.add(pollerStats(p.Stats()))
	}
	k.DeviceEvents += d.events.Load()
	ps := d.pool.Stats()
	k.PoolMappedBytes += ps.ArenaBytes
	k.PoolInUseBytes += ps.InUseBytes
	k.PoolExhausted += ps.Exhausted
}

// metricsGone reports whether the device was torn down (or is being: its
// counts no longer matter).
func (d *device) metricsGone() bool {
	devices.mu.Lock()
	defer devices.mu.Unlock()
	return devices.m[d.key] != d
}

// postStats is the post counters of q, the part of a ConnStats a QP keeps.
func postStats(q *verbs.QP) ConnStats {
	calls, wrs := q.PostStats()
	pc := q.PostCounts()
	return ConnStats{PostCalls: calls, WorkRequests: wrs,
		SendPosts: pc.SendPosts, SendWRs: pc.SendWRs, Signaled: pc.Signaled, Inlined: pc.Inlined,
		RecvPosts: pc.RecvPosts, RecvWRs: pc.RecvWRs}
}

// pollerStats is the part of a ConnStats a poller keeps.
func pollerStats(ps poller.Stats) *ConnStats {
	return &ConnStats{PollCalls: ps.Polls, Completions: ps.Completions, PollerSleeps: ps.Sleeps, PollerWakeups: ps.Wakeups,
		InlinePolls: ps.InlinePolls, EmptyPolls: ps.EmptyPolls, Parks: ps.Parks, Arms: ps.Arms}
}

func (c *engine) keepaliveProbes() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.probes
}

// stats is Conn.Stats on the engine.
func (c *engine) stats() ConnStats {
	st := postStats(c.ep.qp)
	st.add(pollerStats(c.ep.poller.Stats()))
	st.KeepaliveProbes, st.DeviceEvents, st.BufferBytes = c.keepaliveProbes(), c.dev.events.Load(), c.ringBytes()
	return st
}
