package rdma

// A TCP fallback listener's reject reason reaches the dialer's error
// sanitized, as the RDMA path's does (wire.Sanitize): no control
// character, terminal escape or bidi override of the peer's choosing
// reaches a log or a terminal.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/verbline/rdma/internal/rdmatest"
)

// hostileReason carries control characters, a terminal escape sequence, a
// bidi override and invalid UTF-8.
const hostileReason = "go away\r\n\x1b[2J\x1b]0;owned\x07\x00 \u202egnp.exe \xff end"

// hostileReasonClean is hostileReason as the dialer may show it.
const hostileReasonClean = "go away???[2J?]0;owned?? ?gnp.exe ? end"

// checkClean fails t if s holds a character that is not printable.
func checkClean(t *testing.T, what, s string) {
	t.Helper()
	if !utf8.ValidString(s) {
		t.Errorf("%s is not valid UTF-8: %q", what, s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			t.Errorf("%s holds %U: %q", what, r, s)
			return
		}
	}
}

func TestTCPHelloRejectSanitized(t *testing.T) {
	b := binary.BigEndian.AppendUint32(nil, tcpMagic)
	b = append(b, tcpMajor, tcpMinor, tcpKindReject, 0)
	b = append(b, make([]byte, 8)...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(hostileReason)))
	b = append(b, hostileReason...)
	h, err := readTCPHello(bytes.NewReader(b))
	if err != nil || !h.Reject {
		t.Fatalf("reject: %+v, %v", h, err)
	}
	if h.Reason != hostileReasonClean {
		t.Errorf("reason %q, want %q", h.Reason, hostileReasonClean)
	}
}

// A raw listener refuses with a hostile reason: the dial's error carries
// the reason cleaned.
func TestFallbackRejectReasonSanitized(t *testing.T) {
	g0 := rdmatest.Goroutines()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := readTCPHello(c); err != nil {
			return
		}
		c.Write((&tcpHello{Major: tcpMajor, Minor: tcpMinor, Reject: true, Reason: hostileReason}).appendTo(nil))
	}()
	d := Dialer{Fallback: &Fallback{RDMATimeout: rdmatest.Scale(2 * time.Second)}}
	_, err = d.DialContext(context.Background(), "rdma", l.Addr().String())
	if !errors.Is(err, ErrHandshake) {
		t.Fatalf("dial refused by the listener: %v, want ErrHandshake", err)
	}
	if !strings.Contains(err.Error(), hostileReasonClean) {
		t.Errorf("dial error %q does not carry the cleaned reason %q", err, hostileReasonClean)
	}
	checkClean(t, "the dial's error", err.Error())
	l.Close()
	checkFallbackClean(t, g0)
}

// Admit's error on a fallback listener reaches a TCP dialer cleaned too.
func TestFallbackAdmitReasonSanitized(t *testing.T) {
	g0 := rdmatest.Goroutines()
	ln := fallbackListen(t, ListenConfig{Admit: func(netip.AddrPort) error {
		return errors.New(hostileReason)
	}})
	defer ln.Close()
	d := Dialer{Fallback: &Fallback{RDMATimeout: rdmatest.Scale(2 * time.Second)}}
	_, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	if !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), hostileReasonClean) {
		t.Fatalf("dial refused by Admit: %v, want ErrHandshake with %q", err, hostileReasonClean)
	}
	checkClean(t, "the dial's error", err.Error())
	ln.Close()
	checkFallbackClean(t, g0)
}

// A reason longer than maxRejectReason is cut on a character's start, so
// the dialer sees no '?' for half a character.
func TestTCPHelloRejectCutOnRune(t *testing.T) {
	long := strings.Repeat("é", maxRejectReason) // 2 bytes each; maxRejectReason is even, so start at 1
	h := tcpHello{Major: tcpMajor, Reject: true, Reason: "x" + long}
	got, err := readTCPHello(bytes.NewReader(h.appendTo(nil)))
	if err != nil || len(got.Reason) > maxRejectReason || len(got.Reason) < maxRejectReason-1 ||
		strings.Contains(got.Reason, "?") || !utf8.ValidString(got.Reason) {
		t.Fatalf("cut reason: %d bytes %q..., %v", len(got.Reason), got.Reason[max(0, len(got.Reason)-8):], err)
	}
}
