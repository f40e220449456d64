package frame

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
)

func streamFrame(flags uint8, id uint32, block, msg []byte) []byte {
	b := make([]byte, HeaderLen, HeaderLen+len(block)+len(msg))
	Header{Type: TypeStream, Flags: flags, Stream: id, Value: uint32(len(block))}.Put(b)
	return append(append(b, block...), msg...)
}

func TestStreamFrameRoundTrip(t *testing.T) {
	var blk []byte
	blk = AppendString(blk, KindPath, "/pkg.Svc/Method")
	blk = AppendTimeout(blk, 1500*time.Millisecond)
	blk = AppendString(blk, KindContentSubtype, "json")
	blk = AppendMD(blk, KindHeader, metadata.Pairs("a", "1", "a", "2", "b-bin", "\x00\xff"))
	blk = AppendMD(blk, KindTrailer, metadata.Pairs("t", "x"))
	blk = AppendCode(blk, 5)
	blk = AppendString(blk, KindStatusMessage, "not found")
	blk = AppendEntry(blk, KindStatusDetails, []byte{1, 2, 3})
	blk = AppendEntry(blk, 200, []byte("a kind from a later version")) // skipped
	msg := []byte("the message")
	f, err := Parse(streamFrame(FlagHeaders|FlagMessage|FlagEnd, 7, blk, msg), Limits{MaxBlock: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	if f.Type != TypeStream || f.Stream != 7 || f.Flags != FlagHeaders|FlagMessage|FlagEnd || !bytes.Equal(f.Message, msg) {
		t.Fatalf("frame %+v", f)
	}
	got, err := ParseBlock(f.Block)
	if err != nil {
		t.Fatal(err)
	}
	want := Block{
		Path: "/pkg.Svc/Method", Timeout: 1500 * time.Millisecond, ContentSubtype: "json",
		Header:  metadata.MD{"a": {"1", "2"}, "b-bin": {"\x00\xff"}},
		Trailer: metadata.MD{"t": {"x"}},
		HasCode: true, Code: 5, Message: "not found", Details: []byte{1, 2, 3},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("block\n got %+v\nwant %+v", got, want)
	}
}

func TestParseRefuses(t *testing.T) {
	lim := Limits{MaxBlock: 64}
	ctl := func(ty Type, flags uint8, id, v uint32, payload []byte) []byte {
		b := make([]byte, HeaderLen)
		Header{Type: ty, Flags: flags, Stream: id, Value: v}.Put(b)
		return append(b, payload...)
	}
	reserved := streamFrame(FlagMessage, 1, nil, nil)
	reserved[2] = 1
	cases := map[string][]byte{
		"short":                  {2, 0, 0},
		"reserved":               reserved,
		"stream 0":               streamFrame(FlagMessage, 0, nil, nil),
		"no flags":               streamFrame(0, 1, nil, nil),
		"unknown flag":           streamFrame(0x80|FlagMessage, 1, nil, nil),
		"block beyond payload":   ctl(TypeStream, FlagHeaders, 1, 10, []byte{1, 2}),
		"block above limit":      streamFrame(FlagHeaders, 1, make([]byte, 65), nil),
		"block without flag":     streamFrame(FlagMessage, 1, []byte{1, 0}, nil),
		"bytes without message":  streamFrame(FlagHeaders, 1, nil, []byte{1}),
		"settings on stream":     ctl(TypeSettings, 0, 1, 0, nil),
		"goaway on stream":       ctl(TypeGoAway, 0, 1, 0, nil),
		"cancel on 0":            ctl(TypeCancel, 0, 0, 1, nil),
		"connection window of 0": ctl(TypeWindow, 0, 0, 0, nil),
		"window of 0":            ctl(TypeWindow, 0, 1, 0, nil),
		"window payload":         ctl(TypeWindow, 0, 1, 1, []byte{1}),
		"cancel flags":           ctl(TypeCancel, 1, 1, 1, nil),
		"unknown type":           ctl(9, 0, 1, 1, nil),
	}
	for name, b := range cases {
		if _, err := Parse(b, lim); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: Parse = %v, want ErrMalformed", name, err)
		}
	}
}

func TestParseBlockRefuses(t *testing.T) {
	cases := map[string][]byte{
		"truncated length": {KindPath, 0x80},
		"value too long":   {KindPath, 5, 'a'},
		"timeout size":     {KindTimeout, 1, 1},
		"timeout zero":     append([]byte{KindTimeout, 8}, make([]byte, 8)...),
		"code size":        {KindStatusCode, 2, 0, 0},
		"pair key length":  {KindHeader, 2, 9, 'a'},
		"pair empty key":   {KindHeader, 1, 0},
		"pair upper key":   {KindHeader, 3, 1, 'A', 'v'},
		"pair space key":   {KindTrailer, 3, 1, ' ', 'v'},
	}
	for name, b := range cases {
		if _, err := ParseBlock(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: ParseBlock = %v, want ErrMalformed", name, err)
		}
	}
}

func TestSettings(t *testing.T) {
	s := Settings{Major: Major, Minor: Minor, Features: 0x5, StreamWindow: 1 << 18, MaxStreams: 100, MaxBlock: 1 << 16, MaxRecvMessage: 4 << 20, ConnWindow: 1 << 24}
	b := append(s.Append(nil), 9, 9, 9) // a later minor's extension is ignored
	got, err := ParseSettings(b)
	if err != nil || got != s {
		t.Fatalf("ParseSettings = %+v, %v; want %+v", got, err, s)
	}
	bad := s
	bad.Major = Major + 1
	if _, err := ParseSettings(bad.Append(nil)); !errors.Is(err, ErrMalformed) {
		t.Errorf("another major: %v", err)
	}
	bad = s
	bad.StreamWindow = MinStreamWindow - 1
	if _, err := ParseSettings(bad.Append(nil)); !errors.Is(err, ErrMalformed) {
		t.Errorf("tiny window: %v", err)
	}
	bad = s
	bad.ConnWindow = MinConnWindow - 1
	if _, err := ParseSettings(bad.Append(nil)); !errors.Is(err, ErrMalformed) {
		t.Errorf("tiny connection window: %v", err)
	}
	if _, err := ParseSettings(b[:SettingsLen-1]); !errors.Is(err, ErrMalformed) {
		t.Errorf("short: %v", err)
	}
}

// FuzzParse drives every decoder of peer bytes in the package: a frame,
// its header block and a SETTINGS payload. None may panic, and what
// decodes must encode back to an equivalent block.
func FuzzParse(f *testing.F) {
	var blk []byte
	blk = AppendString(blk, KindPath, "/a/b")
	blk = AppendTimeout(blk, time.Second)
	blk = AppendMD(blk, KindHeader, metadata.Pairs("k", "v"))
	blk = AppendCode(blk, 3)
	f.Add(streamFrame(FlagHeaders|FlagMessage, 1, blk, []byte("m")))
	f.Add(streamFrame(FlagStatus, 3, AppendString(nil, KindStatusMessage, "x"), nil))
	f.Add(append(func() []byte { b := make([]byte, HeaderLen); Header{Type: TypeSettings}.Put(b); return b }(),
		Settings{Major: Major, StreamWindow: 4096, ConnWindow: 4096, MaxBlock: 4096}.Append(nil)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := Parse(b, Limits{MaxBlock: 1 << 12})
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not ErrMalformed: %v", err)
			}
			return
		}
		switch fr.Type {
		case TypeSettings:
			if _, err := ParseSettings(fr.Message); err != nil && !errors.Is(err, ErrMalformed) {
				t.Fatal(err)
			}
		case TypeStream:
			got, err := ParseBlock(fr.Block)
			if err != nil {
				if !errors.Is(err, ErrMalformed) {
					t.Fatal(err)
				}
				return
			}
			var re []byte
			if got.Path != "" {
				re = AppendString(re, KindPath, got.Path)
			}
			if got.Timeout > 0 {
				re = AppendTimeout(re, got.Timeout)
			}
			re = AppendMD(re, KindHeader, got.Header)
			if got.HasCode {
				re = AppendCode(re, got.Code)
			}
			again, err := ParseBlock(re)
			if err != nil || again.Path != got.Path || again.Timeout != got.Timeout || again.Code != got.Code || !reflect.DeepEqual(again.Header, got.Header) {
				t.Fatalf("re-encoded block differs: %+v, %v; was %+v", again, err, got)
			}
		}
	})
}

func TestAppendMDKeys(t *testing.T) {
	md := metadata.MD{"Upper-Case": {"1"}, ":authority": {"x"}, "with space": {"y"}, "": {"z"}, "ok": {"2"}}
	blk, err := ParseBlock(AppendMD(nil, KindHeader, md))
	if err != nil {
		t.Fatal(err)
	}
	want := metadata.MD{"upper-case": {"1"}, "ok": {"2"}}
	if !reflect.DeepEqual(blk.Header, want) {
		t.Fatalf("sent %v, want %v", blk.Header, want)
	}
}
