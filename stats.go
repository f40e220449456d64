package rdma

// ConnStats counts the work behind a connection, to check batching: cgo
// crossings per message should fall below one under load.
type ConnStats struct {
	// PostCalls is how many ibv_post_send / ibv_post_recv calls (cgo
	// crossings) this connection made; WorkRequests how many work requests
	// they carried.
	PostCalls, WorkRequests uint64
	// From the device poller that serves this connection (shared with the
	// other connections it serves): cgo poll calls (each spins inside C for up
	// to the spin budget), completions they returned, and times it slept.
	PollCalls, Completions, PollerSleeps uint64
	// InlinePolls counts polls made by callers waiting in Read, Recv and the
	// like instead of waking the poller (they share the poller's CQ).
	InlinePolls uint64
}

// Stats returns the connection's counters.
func (c *Conn) Stats() ConnStats {
	calls, wrs := c.ep.qp.PostStats()
	ps := c.ep.poller.Stats()
	return ConnStats{PostCalls: calls, WorkRequests: wrs, PollCalls: ps.Polls, Completions: ps.Completions, PollerSleeps: ps.Sleeps, InlinePolls: ps.InlinePolls}
}
