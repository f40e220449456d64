package rdma

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/verbline/rdma/internal/wire"
)

// A RemoteBuf is encoded as docs/protocol.md (section 8) lays out a Region:
// address, length and rkey, big-endian, 16 bytes; the encoding is
// wire.Region's byte for byte, and ParseRemoteBuf undoes AppendTo.
func TestRemoteBufRoundTrip(t *testing.T) {
	golden := RemoteBuf{Addr: 0x0102030405060708, Len: 0x090a0b0c, RKey: 0x0d0e0f10}
	want := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	if got := golden.AppendTo(nil); !bytes.Equal(got, want) {
		t.Errorf("AppendTo = % x, want % x", got, want)
	}
	if RemoteBufLen != len(want) {
		t.Errorf("RemoteBufLen = %d, want %d", RemoteBufLen, len(want))
	}
	if RemoteBufLen != wire.RegionLen {
		t.Errorf("RemoteBufLen = %d, wire.RegionLen %d", RemoteBufLen, wire.RegionLen)
	}
	for _, r := range []RemoteBuf{
		{},
		golden,
		{Addr: 0x7f00_1234_5000, Len: 4096, RKey: 0xdeadbeef},
		{Addr: math.MaxUint64 - math.MaxUint32, Len: math.MaxUint32, RKey: math.MaxUint32}, // ends at 2^64-1
	} {
		prefix := []byte("head")
		enc := r.AppendTo(prefix)
		if !bytes.Equal(enc[:len(prefix)], prefix) || len(enc) != len(prefix)+RemoteBufLen {
			t.Errorf("%+v: AppendTo(%q) = % x: want the prefix and %d bytes", r, prefix, enc, RemoteBufLen)
			continue
		}
		enc = enc[len(prefix):]
		if w := (wire.Region{Addr: r.Addr, Len: r.Len, RKey: r.RKey}).AppendTo(nil); !bytes.Equal(enc, w) {
			t.Errorf("%+v: AppendTo = % x, wire.Region encodes % x", r, enc, w)
		}
		got, err := ParseRemoteBuf(append(enc, "trailing bytes are ignored"...))
		if err != nil || got != r {
			t.Errorf("ParseRemoteBuf(AppendTo(%+v)) = %+v, %v", r, got, err)
		}
	}
}

func TestParseRemoteBufErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"short", make([]byte, RemoteBufLen-1), "truncated"},
		{"wraps", RemoteBuf{Addr: math.MaxUint64 - 10, Len: 11}.AppendTo(nil), "wraps"},
	} {
		r, err := ParseRemoteBuf(c.b)
		if err == nil || !strings.Contains(err.Error(), c.want) || r != (RemoteBuf{}) {
			t.Errorf("%s: ParseRemoteBuf(% x) = %+v, %v; want the zero RemoteBuf and an error saying %q", c.name, c.b, r, err, c.want)
		}
	}
}
