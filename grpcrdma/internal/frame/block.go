package frame

import (
	"encoding/binary"
	"strings"
	"time"

	"google.golang.org/grpc/metadata"
)

// Kinds of header block entries. Each entry is kind (1 byte), length
// (uvarint), value; a receiver skips kinds it does not know, so a later
// minor version may add some.
const (
	KindPath           = 1 // request: "/service/method"
	KindTimeout        = 2 // request: 8 bytes, nanoseconds left of the caller's deadline
	KindContentSubtype = 3 // request: the codec's name ("proto" if absent)
	KindHeader         = 4 // a header metadata pair: uvarint key length, key, value
	KindTrailer        = 5 // a trailer metadata pair, as KindHeader
	KindStatusCode     = 6 // status: 4 bytes, the gRPC code
	KindStatusMessage  = 7 // status: the message, UTF-8
	KindStatusDetails  = 8 // status: a google.rpc.Status message with details
)

// Block is a decoded header block. Fields absent from the block are zero.
type Block struct {
	Path           string
	Timeout        time.Duration // > 0 when the caller has a deadline
	ContentSubtype string
	Header         metadata.MD
	Trailer        metadata.MD
	HasCode        bool
	Code           uint32
	Message        string
	Details        []byte // aliases the input
}

// AppendEntry appends one entry of kind k.
func AppendEntry(b []byte, k byte, v []byte) []byte {
	b = append(b, k)
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// AppendString appends one entry of kind k whose value is s.
func AppendString(b []byte, k byte, s string) []byte {
	b = append(b, k)
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// AppendTimeout appends a KindTimeout entry.
func AppendTimeout(b []byte, d time.Duration) []byte {
	if d < 1 {
		d = 1 // a deadline already past still travels as one
	}
	b = append(b, KindTimeout, 8)
	return binary.BigEndian.AppendUint64(b, uint64(d))
}

// AppendCode appends a KindStatusCode entry.
func AppendCode(b []byte, code uint32) []byte {
	b = append(b, KindStatusCode, 4)
	return binary.BigEndian.AppendUint32(b, code)
}

// AppendMD appends md's pairs as entries of kind k (KindHeader or
// KindTrailer). Keys are lower-cased, as gRPC's are; a key that is still
// not a valid one (empty, or with characters gRPC does not allow, as in
// HTTP/2's pseudo-headers) is left out rather than sent for the peer to
// refuse.
func AppendMD(b []byte, k byte, md metadata.MD) []byte {
	for key, vals := range md {
		if !ValidKey(key) {
			key = strings.ToLower(key)
			if !ValidKey(key) {
				continue
			}
		}
		for _, v := range vals {
			b = append(b, k)
			b = binary.AppendUvarint(b, uint64(uvarintLen(uint64(len(key)))+len(key)+len(v)))
			b = binary.AppendUvarint(b, uint64(len(key)))
			b = append(b, key...)
			b = append(b, v...)
		}
	}
	return b
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// ParseBlock decodes a header block.
func ParseBlock(b []byte) (Block, error) {
	var blk Block
	for len(b) > 0 {
		k := b[0]
		n, w := binary.Uvarint(b[1:])
		if w <= 0 {
			return Block{}, malformed("header block: entry of kind %d with a bad length", k)
		}
		b = b[1+w:]
		if n > uint64(len(b)) {
			return Block{}, malformed("header block: entry of kind %d of %d bytes, %d left", k, n, len(b))
		}
		v := b[:n]
		b = b[n:]
		switch k {
		case KindPath:
			blk.Path = string(v)
		case KindTimeout:
			if len(v) != 8 {
				return Block{}, malformed("header block: timeout of %d bytes, want 8", len(v))
			}
			t := binary.BigEndian.Uint64(v)
			if t == 0 || t > 1<<62 {
				return Block{}, malformed("header block: timeout %d ns out of range", t)
			}
			blk.Timeout = time.Duration(t)
		case KindContentSubtype:
			blk.ContentSubtype = string(v)
		case KindHeader, KindTrailer:
			key, val, err := parsePair(v)
			if err != nil {
				return Block{}, err
			}
			md := &blk.Header
			if k == KindTrailer {
				md = &blk.Trailer
			}
			if *md == nil {
				*md = metadata.MD{}
			}
			(*md)[key] = append((*md)[key], val)
		case KindStatusCode:
			if len(v) != 4 {
				return Block{}, malformed("header block: status code of %d bytes, want 4", len(v))
			}
			blk.HasCode = true
			blk.Code = binary.BigEndian.Uint32(v)
		case KindStatusMessage:
			blk.Message = string(v)
		case KindStatusDetails:
			blk.Details = v
		}
	}
	return blk, nil
}

func parsePair(v []byte) (string, string, error) {
	n, w := binary.Uvarint(v)
	if w <= 0 || n > uint64(len(v)-w) {
		return "", "", malformed("header block: metadata pair with a bad key length")
	}
	key := v[w : w+int(n)]
	if !validKey(key) {
		return "", "", malformed("header block: metadata key %q is not lower-case letters, digits, '-', '_' or '.'", key)
	}
	return string(key), string(v[w+int(n):]), nil
}

// validKey is gRPC's rule for metadata keys (gRPC over HTTP/2's
// Header-Name, lower case).
func validKey(k []byte) bool {
	if len(k) == 0 {
		return false
	}
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// ValidKey reports whether k may be sent as a metadata key.
func ValidKey(k string) bool {
	if len(k) == 0 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}
