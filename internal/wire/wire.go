// Package wire defines the bytes verbline peers exchange: the handshake carried
// in rdma_cm private data while connecting, the 32-bit immediate data on
// every SEND_WITH_IMM, and the descriptors sent in message payloads.
// docs/protocol.md at the module root is the complete protocol (version 1.4,
// Version and Minor) as a peer implementer needs it; this comment is the
// summary.
//
// What travels where:
//
//	CONNECT_REQUEST private data (<= 56 bytes)  dialer's Hello
//	accept (ESTABLISHED) private data (<= 196)  listener's Hello
//	reject private data (<= 148 bytes)          listener's Reject
//	immediate data of each message              Kind | credits (EncodeImm)
//	or its last 4 bytes (connections with trailers, for devices without
//	immediate data: ConnTrailers)
//
// Layouts (all integers big-endian):
//
//	Hello (HelloLen = 24 bytes, then an extension area)
//	  off  size  field
//	    0     4  magic "GRDM" (0x4752444d)
//	    4     1  major version (1): must match, else the handshake fails
//	    5     1  minor version (4; less from an older 1.x peer):
//	             informational
//	    6     2  credits: receive buffers posted for the peer (>= 1)
//	    8     4  receive buffer size (64 .. 1<<30)
//	   12     4  max message size the sender accepts: if above the
//	             receive buffer size, messages between the two come by
//	             rendezvous; if at most the buffer size, or 0, there is
//	             no rendezvous and the buffer size is the limit
//	   16     4  keepalive interval in ms (reserved: 0, ignored)
//	   20     4  features the sender supports (bitmask; 0 from a 1.0 peer)
//	   24     -  extension: ignored; a later minor may add fields here,
//	             each meaning "absent" when zero
//
//	Reject (8 + reason bytes, at most 148)
//	    0     4  magic
//	    4     1  code (RejectCode)
//	    5     1  the rejecting side's major version (0 from a 1.0 peer)
//	    6     2  reason length (<= MaxRejectReason)
//	    8     n  reason, UTF-8
//
//	Immediate data (32 bits)
//	  bits 31..24  Kind
//	  bits 23..0   credits returned to the receiver; for KindRendezvousDone,
//	               the id of the rendezvous that is done (no credits)
//
//	Rendezvous (payload of a KindRendezvous message, RendezvousLen = 20)
//	    0     4  id (the sender's, echoed in KindRendezvousDone)
//	    4    16  Region: where the receiver RDMA-READs the message from
//
//	Notify (payload of a KindNotify message, NotifyLen = 8; trailers only)
//	    0     4  the immediate value of the write it follows
//	    4     4  that write's length in bytes
//
// Versions: the major version (Version) must be equal on both sides; the
// minor version (Minor) and the feature bits (Features) never make a
// handshake fail. Each side announces the features it supports and both
// use only Negotiate's intersection, so a peer of a later minor, announcing
// features this side has never heard of, falls back to what both support.
//
// IB and RoCE pad private data with zeros to its maximum length, so the
// parsers ignore anything after the declared length. Every parser takes
// untrusted peer bytes: it never panics, allocates at most the declared
// (bounded) reason, and returns errors that match ErrNotOurs, ErrVersion or
// ErrMalformed under errors.Is.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Magic opens every handshake and reject; "GRDM" big-endian on the wire.
const Magic uint32 = 0x4752444d

// Version is the major version of the protocol this side speaks. Peers of
// different major versions cannot talk: the handshake fails with ErrVersion.
const Version uint8 = 1

// Minor is the minor version this side speaks. Minor versions of one major
// version interoperate: a later minor only adds what is negotiated through
// feature bits. 1.0 peers send 0 in its byte.
const Minor uint8 = 4

// Features is a set of optional protocol features, one bit each, announced
// in the Hello. A feature is used on a connection only if both sides
// announced it (Negotiate). Unknown bits are not an error: they are a
// later minor's features, which this side does not announce, so the
// intersection drops them.
type Features uint32

// FeatureControlReserve (bit 0, protocol 1.2): the sender keeps two
// receives posted beyond its credits for the peer's credit updates
// (KindCredit) and keepalive probes (KindKeepalive), which then spend no
// credit; the peer has at most one of them outstanding at a time.
const FeatureControlReserve Features = 1 << 0

// FeatureAtomics (bit 1, protocol 1.3): the sender's QP accepts RDMA
// atomics (compare-and-swap, fetch-and-add) into memory it exports with
// atomic rights; it is announced only where the sender's device has
// atomics. A side calls the atomics only on a connection that negotiated
// it, so a peer without them is refused locally, not by its NIC (which
// would end the connection).
const FeatureAtomics Features = 1 << 1

// FeatureTrailers (bit 2, protocol 1.4): the sender can carry each
// send's header as a 4-byte trailer at the end of its payload (plain
// SEND, no immediate data) and take the peer's that way, and can replace
// a write with immediate by a write followed by a KindNotify message.
// Every 1.4 side announces it; a connection uses trailers only where a
// side requires them (FeatureTrailersRequired).
const FeatureTrailers Features = 1 << 2

// FeatureTrailersRequired (bit 3, protocol 1.4): the sender's device
// cannot send or receive immediate data (iWARP), so the connection must
// use trailers (ConnTrailers). Unlike the other bits it is not
// negotiated by intersection: one side's announcement decides.
const FeatureTrailersRequired Features = 1 << 3

// Supported is the set of features this implementation knows and may
// announce (FeatureAtomics only where the device has atomics,
// FeatureTrailersRequired only where it lacks immediate data).
// docs/protocol.md keeps the registry of feature bits.
const Supported Features = FeatureControlReserve | FeatureAtomics | FeatureTrailers | FeatureTrailersRequired

// featureNames names the defined feature bits, for String.
var featureNames = map[Features]string{FeatureControlReserve: "control-reserve", FeatureAtomics: "atomics",
	FeatureTrailers: "trailers", FeatureTrailersRequired: "trailers-required"}

// Negotiate returns the features a connection uses: those both sides
// announced. Both sides compute it from the two Hellos, so they agree
// without another message.
func Negotiate(ours, theirs Features) Features { return ours & theirs }

// ErrNoTrailers: one side requires trailers (its device has no immediate
// data) and the other does not announce them (a release older than
// protocol 1.4): the two cannot talk.
// Its text fits a Reject's reason (a test checks).
var ErrNoTrailers = errors.New("one side's device has no immediate data and the other side does not speak " +
	"wire protocol 1.4's trailers: upgrade it")

// ConnTrailers decides from both sides' announcements (not the
// intersection: FeatureTrailersRequired is one side's need) whether a
// connection carries its headers in trailers: yes if either side requires
// them, and then both must announce FeatureTrailers, else ErrNoTrailers.
func ConnTrailers(ours, theirs Features) (bool, error) {
	if (ours|theirs)&FeatureTrailersRequired == 0 {
		return false, nil
	}
	if ours&theirs&FeatureTrailers == 0 {
		return false, ErrNoTrailers
	}
	return true, nil
}

// String lists the bits of f by name; unknown bits are shown as
// "bit N", so a newer peer's announcement can be logged.
func (f Features) String() string {
	if f == 0 {
		return "none"
	}
	var names []string
	for f != 0 {
		bit := Features(1) << bits.TrailingZeros32(uint32(f))
		f &^= bit
		if name, ok := featureNames[bit]; ok {
			names = append(names, name)
		} else {
			names = append(names, fmt.Sprintf("bit %d", bits.TrailingZeros32(uint32(bit))))
		}
	}
	return strings.Join(names, "|")
}

// HelloLen is the encoded size of a Hello; it fits the 56-byte
// CONNECT_REQUEST private-data limit, leaving MaxHelloExtension bytes for
// fields a later minor version appends.
const HelloLen = 24

// MaxHelloExtension is how many bytes a Hello can carry after HelloLen in a
// connect request (the accept allows more, but both directions share one
// layout).
const MaxHelloExtension = maxConnectPrivateData - HelloLen

// Receive buffer size bounds: below 64 bytes the per-message overhead
// dominates; above 1 GiB a single buffer is surely a mistake or an attack.
const (
	MinBufSize = 64
	MaxBufSize = 1 << 30
)

// Private-data limits of rdma_cm (InfiniBand CM over IB and RoCE).
const (
	maxConnectPrivateData = 56
	maxAcceptPrivateData  = 196
	maxRejectPrivateData  = 148
)

// Compile-time checks that our messages fit the transport limits.
var (
	_ [maxConnectPrivateData - HelloLen]struct{}
	_ [maxAcceptPrivateData - HelloLen]struct{}
	_ [maxRejectPrivateData - rejectHeaderLen - MaxRejectReason]struct{}
)

// Sentinel errors; match with errors.Is. The returned errors carry a
// specific message and unwrap to one of these.
var (
	// ErrNotOurs: the bytes are not a verbline message (too short for the
	// magic, or wrong magic) — e.g. a foreign peer or the kernel's empty
	// reject.
	ErrNotOurs = errors.New("not a verbline message")
	// ErrVersion: the peer speaks another major version of the protocol
	// (the error is a *VersionError, which names both versions).
	ErrVersion = errors.New("wire protocol major version mismatch")
	// ErrMalformed: our magic, but a field is truncated or out of range.
	ErrMalformed = errors.New("malformed verbline message")
)

// wireError gives each failure a precise message while keeping errors.Is
// against the sentinels working.
type wireError struct {
	kind error
	msg  string
}

func (e *wireError) Error() string { return e.msg }
func (e *wireError) Unwrap() error { return e.kind }

func errorf(kind error, format string, args ...any) error {
	return &wireError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// checkMagic reports ErrNotOurs unless b starts with Magic.
func checkMagic(b []byte, what string) error {
	if len(b) < 4 {
		return errorf(ErrNotOurs, "not a verbline %s (%d bytes, too short for magic)", what, len(b))
	}
	if m := binary.BigEndian.Uint32(b); m != Magic {
		return errorf(ErrNotOurs, "not a verbline %s (magic 0x%08x)", what, m)
	}
	return nil
}

// Hello is each side's half of the handshake (dialer in the connect
// request, listener in the accept).
type Hello struct {
	Version     uint8    // major version: must equal the receiver's
	Minor       uint8    // minor version; a receiver accepts any
	Credits     uint16   // receive buffers the sender has posted for its peer (>= 1)
	RecvBufSize uint32   // size of each of those buffers in bytes (>= MinBufSize, <= MaxBufSize)
	MaxMsgSize  uint32   // largest message the sender accepts; above RecvBufSize it is read by rendezvous
	KeepaliveMS uint32   // reserved: sent as 0, ignored on receipt (the keepalive feature does not use it)
	Features    Features // features the sender supports; unknown bits are ignored on receipt
}

// AppendTo appends the HelloLen-byte encoding of h to b. Fields are written
// as given; set Version, Minor and Features to this package's Version, Minor
// and Supported.
func (h *Hello) AppendTo(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, Magic)
	b = append(b, h.Version, h.Minor)
	b = binary.BigEndian.AppendUint16(b, h.Credits)
	b = binary.BigEndian.AppendUint32(b, h.RecvBufSize)
	b = binary.BigEndian.AppendUint32(b, h.MaxMsgSize)
	b = binary.BigEndian.AppendUint32(b, h.KeepaliveMS)
	return binary.BigEndian.AppendUint32(b, uint32(h.Features))
}

// VersionError is the error ParseHello returns for a peer of another major
// version; it matches ErrVersion under errors.Is.
type VersionError struct {
	Major, Minor uint8 // the peer's version
	MinorKnown   bool  // the Hello was long enough to carry the minor
}

// PeerVersion is the peer's version as "major.minor" ("major" alone if the
// minor was cut off).
func (e *VersionError) PeerVersion() string {
	if !e.MinorKnown {
		return fmt.Sprint(e.Major)
	}
	return fmt.Sprintf("%d.%d", e.Major, e.Minor)
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("peer speaks verbline wire protocol %s, this side %d.%d: the major versions must match "+
		"(run releases of one major version on both sides)", e.PeerVersion(), Version, Minor)
}

func (e *VersionError) Unwrap() error { return ErrVersion }

// ParseHello decodes a peer's Hello. It accepts any minor version and any
// feature bits; bytes after HelloLen (zero padding, or a later minor's
// extension) are ignored.
func ParseHello(b []byte) (Hello, error) {
	if err := checkMagic(b, "handshake"); err != nil {
		return Hello{}, err
	}
	// Check the version before the length: a peer of another major version
	// may use another layout, and deserves a version error, not "truncated".
	if len(b) > 4 && b[4] != Version {
		e := &VersionError{Major: b[4]}
		if len(b) > 5 {
			e.Minor, e.MinorKnown = b[5], true
		}
		return Hello{}, e
	}
	if len(b) < HelloLen {
		return Hello{}, errorf(ErrMalformed, "handshake truncated: %d bytes, need %d", len(b), HelloLen)
	}
	h := Hello{
		Version:     b[4],
		Minor:       b[5],
		Credits:     binary.BigEndian.Uint16(b[6:]),
		RecvBufSize: binary.BigEndian.Uint32(b[8:]),
		MaxMsgSize:  binary.BigEndian.Uint32(b[12:]),
		KeepaliveMS: binary.BigEndian.Uint32(b[16:]),
		Features:    Features(binary.BigEndian.Uint32(b[20:])),
	}
	if h.Credits == 0 {
		return Hello{}, errorf(ErrMalformed, "handshake credits 0: must be at least 1")
	}
	if h.RecvBufSize < MinBufSize || h.RecvBufSize > MaxBufSize {
		return Hello{}, errorf(ErrMalformed, "handshake receive buffer size %d out of range [64, 1<<30]", h.RecvBufSize)
	}
	return h, nil
}

// RejectCode says why a listener refused a connection.
type RejectCode uint8

const (
	RejectMalformed  RejectCode = 1 // the dialer's Hello did not parse
	RejectVersion    RejectCode = 2 // the major versions differ
	RejectOverloaded RejectCode = 3 // too many connections or pending accepts
	RejectShutdown   RejectCode = 4 // the listener is closing
	RejectResources  RejectCode = 5 // could not allocate QP, CQ or buffers
	RejectPolicy     RejectCode = 6 // the listener's admission hook refused the dialer
	// RejectIncompatible: the dialer lacks a feature the listener's
	// device needs (ErrNoTrailers), or the other way round.
	RejectIncompatible RejectCode = 7
)

func (c RejectCode) String() string {
	switch c {
	case RejectMalformed:
		return "malformed"
	case RejectVersion:
		return "version"
	case RejectOverloaded:
		return "overloaded"
	case RejectShutdown:
		return "shutdown"
	case RejectResources:
		return "resources"
	case RejectPolicy:
		return "policy"
	case RejectIncompatible:
		return "incompatible"
	}
	return fmt.Sprintf("RejectCode(%d)", uint8(c))
}

// Reject is what a listener sends back when it refuses a connection.
// Unknown codes parse fine, so newer peers can add codes.
type Reject struct {
	Code RejectCode
	// Version is the rejecting side's major version (set it to Version);
	// 0 in a reject from a 1.0 peer, which left the byte reserved. With
	// RejectVersion it tells a dialer that speaks several major versions
	// which one to retry with.
	Version uint8
	Reason  string
}

const rejectHeaderLen = 8

// MaxRejectReason is the longest reason that fits the 148-byte reject
// private data after the 8-byte header.
const MaxRejectReason = maxRejectPrivateData - rejectHeaderLen

// AppendTo appends the encoding of r to b. A reason longer than
// MaxRejectReason bytes is cut on a UTF-8 boundary.
func (r *Reject) AppendTo(b []byte) []byte {
	reason := r.Reason
	if len(reason) > MaxRejectReason {
		n := MaxRejectReason
		// Back up over at most UTFMax-1 continuation bytes so a rune is not
		// split (bounded, so invalid UTF-8 cannot eat the whole reason).
		for i := 0; i < utf8.UTFMax-1 && n > 0 && !utf8.RuneStart(reason[n]); i++ {
			n--
		}
		reason = reason[:n]
	}
	b = binary.BigEndian.AppendUint32(b, Magic)
	b = append(b, byte(r.Code), r.Version)
	b = binary.BigEndian.AppendUint16(b, uint16(len(reason)))
	return append(b, reason...)
}

// ParseReject decodes a peer's Reject. Bytes after the reason (zero
// padding) are ignored. The reason is sanitized — invalid UTF-8 and
// non-printable characters become '?' — so it is safe to log.
func ParseReject(b []byte) (Reject, error) {
	if err := checkMagic(b, "reject"); err != nil {
		return Reject{}, err
	}
	if len(b) < rejectHeaderLen {
		return Reject{}, errorf(ErrMalformed, "reject truncated: %d bytes, need %d", len(b), rejectHeaderLen)
	}
	n := int(binary.BigEndian.Uint16(b[6:]))
	if n > MaxRejectReason {
		return Reject{}, errorf(ErrMalformed, "reject reason length %d exceeds %d", n, MaxRejectReason)
	}
	if rest := len(b) - rejectHeaderLen; n > rest {
		return Reject{}, errorf(ErrMalformed, "reject reason length %d beyond the %d bytes present", n, rest)
	}
	return Reject{Code: RejectCode(b[4]), Version: b[5], Reason: Sanitize(b[rejectHeaderLen : rejectHeaderLen+n])}, nil
}

// Sanitize replaces invalid UTF-8 bytes and non-printable runes (control,
// format such as bidi overrides, non-ASCII spaces) with '?', so that text
// a peer chose (a reject's reason) is safe to log. The result is never
// longer than p.
func Sanitize(p []byte) string {
	out := make([]byte, 0, len(p))
	for len(p) > 0 {
		r, size := utf8.DecodeRune(p)
		if (r == utf8.RuneError && size == 1) || !unicode.IsPrint(r) {
			out = append(out, '?')
		} else {
			out = append(out, p[:size]...)
		}
		p = p[size:]
	}
	return string(out)
}

// Kind is the type of a message, carried in the top 8 bits of its
// immediate data. A kind above the last one defined here is a protocol
// error: a later minor version sends a new kind only on connections where
// the feature that defines it was negotiated.
type Kind uint8

const (
	KindData   Kind = 0 // payload bytes of the stream
	KindCredit Kind = 1 // no payload; only returns credits
	KindFIN    Kind = 2 // the sender will send no more data
	// KindKeepalive is a probe with no payload, sent only on connections
	// that negotiated FeatureControlReserve: by an idle connection with
	// Config.KeepAlive set (keepalive.go), and by a dialer that has sent
	// nothing shortly after establishing (confirmEstablished). Receivers
	// accept it as a control message (its credits count).
	KindKeepalive Kind = 3
	KindMessage   Kind = 4 // one whole message of the message view (boundaries kept)
	// KindRendezvous announces a message larger than a receive buffer; its
	// payload (a Rendezvous) says where the receiver reads it from.
	KindRendezvous Kind = 5
	// KindRendezvousDone tells the sender the receiver has read the message
	// of rendezvous id (imm bits 23..0), so it may revoke access and reuse
	// the buffer. It carries no credits and needs none: the sender keeps a
	// receive posted for each rendezvous it has outstanding.
	KindRendezvousDone Kind = 6
	// KindNotify stands for the peer's write with immediate data on a
	// connection with trailers: the sender WRITEs, then sends this, whose
	// payload (a Notify) carries the immediate value and the write's
	// length. It spends a credit like a message; RC's ordering makes the
	// write's bytes visible before the notify is received.
	KindNotify Kind = 7

	maxKind = KindNotify
)

func (k Kind) String() string {
	switch k {
	case KindData:
		return "data"
	case KindCredit:
		return "credit"
	case KindFIN:
		return "fin"
	case KindKeepalive:
		return "keepalive"
	case KindMessage:
		return "message"
	case KindRendezvous:
		return "rendezvous"
	case KindRendezvousDone:
		return "rendezvous-done"
	case KindNotify:
		return "notify"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// MaxImmCredits is the most credits one message can return (24 bits).
const MaxImmCredits = 1<<24 - 1

// EncodeImm packs a kind and returned credits into immediate data. The
// caller must not return more than MaxImmCredits at once; larger values
// are clamped (this is local input, so no panic, but the excess is lost).
func EncodeImm(k Kind, credits uint32) uint32 {
	return uint32(k)<<24 | min(credits, MaxImmCredits)
}

// TrailerLen is the size of a trailer: the immediate data's 32 bits,
// big-endian, as the last bytes of a send's payload (FeatureTrailers).
const TrailerLen = 4

// PutTrailer writes the header imm (EncodeImm's) as a trailer into b,
// which must be TrailerLen bytes long.
func PutTrailer(b []byte, imm uint32) { binary.BigEndian.PutUint32(b, imm) }

// SplitTrailer separates a received payload from its trailer: the
// payload's length and the header (for DecodeImm). A payload shorter
// than a trailer is malformed.
func SplitTrailer(b []byte) (int, uint32, error) {
	n := len(b) - TrailerLen
	if n < 0 {
		return 0, 0, errorf(ErrMalformed, "message of %d bytes has no room for its %d-byte trailer", len(b), TrailerLen)
	}
	return n, binary.BigEndian.Uint32(b[n:]), nil
}

// DecodeImm unpacks a peer's immediate data.
func DecodeImm(imm uint32) (Kind, uint32, error) {
	k := Kind(imm >> 24)
	if k > maxKind {
		return 0, 0, errorf(ErrMalformed, "unknown message kind %d", uint8(k))
	}
	return k, imm & MaxImmCredits, nil
}

// Region describes a buffer a peer exported for one-sided access.
//
//	addr(8) len(4) rkey(4), big-endian
type Region struct {
	Addr uint64
	Len  uint32
	RKey uint32
}

// RegionLen is the encoded size of a Region.
const RegionLen = 16

// AppendTo appends the encoded region to b.
func (r Region) AppendTo(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, r.Addr)
	b = binary.BigEndian.AppendUint32(b, r.Len)
	return binary.BigEndian.AppendUint32(b, r.RKey)
}

// ParseRegion decodes a region from a peer; trailing bytes are ignored.
func ParseRegion(b []byte) (Region, error) {
	if len(b) < RegionLen {
		return Region{}, errorf(ErrMalformed, "region descriptor truncated: %d bytes, need %d", len(b), RegionLen)
	}
	r := Region{Addr: binary.BigEndian.Uint64(b), Len: binary.BigEndian.Uint32(b[8:]), RKey: binary.BigEndian.Uint32(b[12:])}
	if r.Addr+uint64(r.Len) < r.Addr {
		return Region{}, errorf(ErrMalformed, "region descriptor wraps the address space (addr 0x%x, len %d)", r.Addr, r.Len)
	}
	return r, nil
}

// Notify is the payload of a KindNotify message: the immediate value of
// the write it stands for and that write's length in bytes.
type Notify struct {
	Imm uint32
	Len uint32
}

// NotifyLen is the encoded size of a Notify.
const NotifyLen = 8

// AppendTo appends the encoded notify to b.
func (n Notify) AppendTo(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, n.Imm)
	return binary.BigEndian.AppendUint32(b, n.Len)
}

// ParseNotify decodes a peer's notify; it must be exactly NotifyLen bytes.
func ParseNotify(b []byte) (Notify, error) {
	if len(b) != NotifyLen {
		return Notify{}, errorf(ErrMalformed, "notify of %d bytes, want %d", len(b), NotifyLen)
	}
	return Notify{Imm: binary.BigEndian.Uint32(b), Len: binary.BigEndian.Uint32(b[4:])}, nil
}

// Rendezvous announces a message that moves by RDMA READ: the sender bound
// Region for remote read on this connection until the receiver answers
// KindRendezvousDone with ID.
type Rendezvous struct {
	ID     uint32 // < 1<<24: it returns in immediate data
	Region Region
}

// RendezvousLen is the encoded size of a Rendezvous.
const RendezvousLen = 4 + RegionLen

// AppendTo appends the encoded rendezvous to b.
func (r Rendezvous) AppendTo(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, r.ID)
	return r.Region.AppendTo(b)
}

// ParseRendezvous decodes a peer's rendezvous; trailing bytes are ignored.
func ParseRendezvous(b []byte) (Rendezvous, error) {
	if len(b) < RendezvousLen {
		return Rendezvous{}, errorf(ErrMalformed, "rendezvous truncated: %d bytes, need %d", len(b), RendezvousLen)
	}
	r := Rendezvous{ID: binary.BigEndian.Uint32(b)}
	if r.ID > MaxImmCredits {
		return Rendezvous{}, errorf(ErrMalformed, "rendezvous id %d does not fit 24 bits", r.ID)
	}
	var err error
	if r.Region, err = ParseRegion(b[4:]); err != nil {
		return Rendezvous{}, err
	}
	if r.Region.Len == 0 {
		return Rendezvous{}, errorf(ErrMalformed, "rendezvous of an empty message")
	}
	return r, nil
}
