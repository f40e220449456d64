//go:build linux && cgo

package rdma

import (
	"errors"
	"net"
	"sync/atomic"

	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/poller"
	"github.com/verbline/rdma/internal/verbs"
)

// The connections' and devices' side of metrics.go: the counts a
// connection keeps beyond its QP's post counters, and what a snapshot reads
// from a live connection or device (its ConnStats, and the QP's attributes
// Conn.QPInfo reports). The hooks into the data path are single
// lines: Write and Send count what they posted, senders report whether they
// found credit (creditCheck), and the completion dispatch counts what
// arrived (arrivedCounts) and adds it once per batch.

// connCounters are a connection's payload, message and credit-stall
// counts: atomics, each added to once per call or per batch of
// completions, read by snapshots.
type connCounters struct {
	bytesSent, msgsSent         atomic.Uint64 // by Write, Send and PostSend
	bytesReceived, msgsReceived atomic.Uint64 // once per batch of completions (addArrived)
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

// arrivedCounts is what one batch of completions brought: payload bytes
// (stream data, messages, large messages once their READ completed) and
// messages (large ones when announced), counted as recvLocked dispatches
// them under Conn.mu. Control messages, one-sided notifications and failed
// or refused completions carry none.
type arrivedCounts struct{ bytes, msgs uint64 }

// addArrived adds a batch's counts to the atomics and clears them: one add
// per counter per batch, not per completion.
func (k *connCounters) addArrived(a *arrivedCounts) {
	if a.bytes > 0 {
		k.bytesReceived.Add(a.bytes)
	}
	if a.msgs > 0 {
		k.msgsReceived.Add(a.msgs)
	}
	*a = arrivedCounts{}
}

// registerConn adds an established connection to the process's metrics;
// unregisterConn removes it once closed, keeping its counts in its
// device's totals.
func registerConn(c *engine)   { metricsReg.addConn(c, deviceCounts{c.dev}) }
func unregisterConn(c *engine) { metricsReg.removeConn(c) }

func (c *engine) metricsDevice() string { return c.dev.Name() }

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

// deviceCounts is a device as the metrics read it (a deviceSource).
type deviceCounts struct{ d *device.Device }

func (m deviceCounts) metricsDevice() string { return m.d.Name() }

// readCounters adds the device's pollers' counts and its pool's.
func (m deviceCounts) readCounters(k *Counters) {
	for _, p := range m.d.Pollers.Pollers() {
		k.ConnStats.add(pollerStats(p.Stats()))
	}
	k.DeviceEvents += m.d.Events()
	ps := m.d.Pool.Stats()
	k.PoolMappedBytes += ps.ArenaBytes
	k.PoolInUseBytes += ps.InUseBytes
	k.PoolExhausted += ps.Exhausted
}

// metricsGone reports whether the device was torn down (or is being: its
// counts no longer matter).
func (m deviceCounts) metricsGone() bool { return !m.d.Registered() }

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
	return c.ka.probes
}

// stats is Conn.Stats on the engine.
func (c *engine) stats() ConnStats {
	st := postStats(c.ep.qp)
	st.add(pollerStats(c.ep.poller.Stats()))
	st.KeepaliveProbes, st.DeviceEvents, st.BufferBytes = c.keepaliveProbes(), c.dev.Events(), c.ringBytes()
	return st
}

func qpInfoOf(qpn uint32, a *verbs.QPAttr, cp verbs.QPCap) QPInfo {
	info := QPInfo{QPN: qpn, DestQPN: a.DestQPN, State: a.State.String(), PathMTU: a.PathMTU.Bytes(),
		TimeoutExp: a.Timeout, RetryCount: int(a.RetryCnt), RNRRetry: int(a.RNRRetry),
		MinRNRTimer: rnrTimerOf(a.MinRNRTimer), MinRNRTimerCode: a.MinRNRTimer,
		SendPSN: a.SQPSN, RecvPSN: a.RQPSN, ServiceLevel: int(a.AH.SL),
		MaxInline: cp.MaxInline, MaxSendWR: cp.MaxSendWR, MaxRecvWR: cp.MaxRecvWR,
		MaxRdAtomic: int(a.MaxRdAtomic), MaxDestRdAtomic: int(a.MaxDestRdAtomic),
		RemoteAtomic: a.AccessFlags&verbs.AccessRemoteAtomic != 0}
	if a.Timeout != 0 {
		info.AckTimeout = ackTimeoutOf(a.Timeout)
	}
	if a.AH.IsGlobal {
		info.TrafficClass, info.HopLimit, info.SGIDIndex = int(a.AH.TrafficClass), int(a.AH.HopLimit), int(a.AH.SGIDIndex)
	}
	return info
}

// qpInfo is Conn.QPInfo on the engine.
func (c *engine) qpInfo() (QPInfo, error) {
	if c.isClosed() {
		return QPInfo{}, net.ErrClosed
	}
	a, cp, err := c.ep.qp.QueryAttr()
	if errors.Is(err, verbs.ErrClosed) {
		err = net.ErrClosed
	}
	if err != nil {
		return QPInfo{}, err
	}
	info := qpInfoOf(c.ep.qp.Num, &a, cp)
	if c.dev.Caps.CMConnectsQP {
		info.MinRNRTimer = 0 // code 0 would read as InfiniBand's 655.36 ms: iWARP has no RNR timer
	}
	return info, nil
}

// deviceInfo is the public form of the connection's device capabilities.
func (c *engine) deviceInfo() (DeviceInfo, error) {
	if c.isClosed() {
		return DeviceInfo{}, net.ErrClosed
	}
	d, cp := c.dev, c.dev.Caps
	return DeviceInfo{
		Name: d.Name(), Transport: cp.Transport.String(),
		MemoryWindows: cp.MemoryWindows, Immediates: cp.Immediates, Atomics: cp.Atomics != verbs.AtomicNone,
		Datagrams: cp.UD, MaxInline: c.ep.maxInline,
		MaxSendSGE: cp.MaxSendSGE, MaxReadSGE: cp.MaxReadSGE, ReadDepth: cp.ReadDepth,
		PrivateDataConnect: cp.PrivateDataConnect, PrivateDataAccept: cp.PrivateDataAccept,
		ActiveSendsFirst: cp.ActiveSendsFirst, SendsCompleteLocally: cp.SendsCompleteLocally,
	}, nil
}
