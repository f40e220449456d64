package rdma

// A TCP fallback listener's reject reason reaches the dialer's error
// sanitized, as the RDMA path's does (wire.Sanitize): no control
// character, terminal escape or bidi override of the peer's choosing
// reaches a log or a terminal.

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/tcpframe"
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
		if _, err := tcpframe.ReadHello(c); err != nil {
			return
		}
		c.Write((&tcpframe.Hello{Major: tcpframe.Major, Minor: tcpframe.Minor, Reject: true, Reason: hostileReason}).AppendTo(nil))
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
