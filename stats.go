package rdma

// ConnStats counts the work behind a connection, to check batching and who
// makes progress: doorbells and signaled completions per message should fall
// below one under load, and a waiting caller should find its completion
// itself (InlinePolls) rather than wait for the poller to wake (PollerWakeups)
// and then wake it (Parks).
type ConnStats struct {
	// PostCalls is how many ibv_post_send / ibv_post_recv calls (cgo
	// crossings, doorbells) this connection made; WorkRequests how many work
	// requests they carried.
	PostCalls, WorkRequests uint64
	// The same by queue: send-queue doorbells and work requests, of which
	// Signaled asked for a completion and Inlined carried their payload in
	// the work request; receive-queue doorbells and work requests.
	SendPosts, SendWRs, Signaled, Inlined, RecvPosts, RecvWRs uint64

	// The eight counters below come from the device poller that serves
	// this connection (shared with the other connections it serves). They
	// are diagnostics of how completions are driven (see the package
	// documentation): what each counts follows the implementation and may
	// change with it, so compare them between runs of one version only.
	// PollCalls: cgo polls by the poller's own goroutine; Completions:
	// completions dispatched by anyone; PollerSleeps: times the poller armed
	// the CQ and slept; PollerWakeups: times a completion event woke it.
	PollCalls, Completions, PollerSleeps, PollerWakeups uint64
	// InlinePolls counts cgo polls made by callers waiting in Read, Write,
	// Recv and the like (EmptyPolls of them found nothing); Parks counts
	// waits that spent their spin budget and slept; Arms counts requests
	// for a completion event.
	InlinePolls, EmptyPolls, Parks, Arms uint64
	// KeepaliveProbes counts the keepalive probes this side sent
	// (Config.KeepAlive): none while the peer is heard from.
	KeepaliveProbes uint64
	// DeviceEvents counts the asynchronous events (port down and up,
	// queue pair and CQ errors, device fatal) the connection's device
	// reported since it was opened.
	DeviceEvents uint64
	// BufferBytes is the registered memory the connection's send and
	// receive rings hold now (they grow with traffic: see Config.RecvBuffers).
	BufferBytes uint64
}
