package rdma

// Access is what the peer may do to an exported buffer.
type Access int

const (
	RemoteWrite  Access = 1 << iota // the peer may write into the export
	RemoteRead                      // the peer may read from it
	RemoteAtomic                    // the peer may CompareAndSwap and FetchAdd its 8-byte words (atomics.go)
)

// OpCompletion reports the end of an asynchronous operation.
type OpCompletion struct {
	ID  uint64 // as given to PostSend, PostWriteRemote(Imm), PostReadRemote, PostCompareAndSwap or PostFetchAdd
	Err error
	// Value is the remote word's value before a PostCompareAndSwap or
	// PostFetchAdd, valid when Err is nil; 0 for the other operations.
	Value uint64
}
