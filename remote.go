package rdma

import "github.com/verbline/rdma/internal/wire"

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

// RemoteBuf describes memory a peer exported with [Conn.Export]: where it
// is in the exporter's address space, how long it is, and the key the
// exporter's NIC checks. [Export.Remote] returns it; the exporter sends its
// encoding ([RemoteBuf.AppendTo]) to the peer in a message of its own
// choosing, and the peer decodes it with [ParseRemoteBuf] and passes it to
// [Conn.WriteRemote], [Conn.ReadRemote] and their variants, with an offset
// into it.
//
// The descriptor is all a peer needs to reach the export over the
// connection it was exported on (on devices without type 2 memory windows,
// over any connection of the device): send it only to the peer meant to
// use it.
type RemoteBuf struct {
	Addr uint64 // the export's first byte, as the exporter's NIC addresses it
	Len  uint32 // the export's length in bytes
	RKey uint32 // the remote key: a memory window's, or a registration's
}

// RemoteBufLen is the size of an encoded RemoteBuf.
const RemoteBufLen = 16

// AppendTo appends the encoded descriptor to b and returns the extended
// slice: RemoteBufLen bytes, Addr, Len and RKey in that order, big-endian
// (the Region of docs/protocol.md, section 8).
func (r RemoteBuf) AppendTo(b []byte) []byte { return wire.Region(r).AppendTo(b) }

// ParseRemoteBuf decodes a descriptor encoded by [RemoteBuf.AppendTo]:
// the first RemoteBufLen bytes of b (bytes after them are ignored, so a
// descriptor may lead a longer message). It fails if b is shorter, or if
// the described range would wrap the 64-bit address space. A descriptor
// that decodes may still be refused by the exporter's NIC (see
// ErrRemoteAccess).
func ParseRemoteBuf(b []byte) (RemoteBuf, error) {
	r, err := wire.ParseRegion(b)
	if err != nil {
		return RemoteBuf{}, err
	}
	return RemoteBuf(r), nil
}
