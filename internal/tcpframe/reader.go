package tcpframe

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/verbline/rdma/buffer"
	"github.com/verbline/rdma/internal/errs"
)

// CommitFirst is the most a frame's header alone makes the Reader take
// from the pool: a larger payload's buffer grows as its bytes arrive
// (Reader.Next).
const CommitFirst = 64 << 10

// Conn is what a Reader reads from: a connection with a read deadline (a
// *net.TCPConn).
type Conn interface {
	io.Reader
	SetReadDeadline(time.Time) error
}

// Reader reads frames from a connection, with two bounds on what a peer
// can make this side hold:
//
//   - Memory follows the payload: a frame's buffer starts at CommitFirst
//     bytes at most and is replaced by one four times as large (the pool's
//     next size class) each time the payload received fills it, so a
//     frame holds at most four times what arrived of it (and CommitFirst
//     for its header alone).
//   - Time: once a frame's first byte has arrived, each read until its end
//     must bring bytes within Stall; a peer that pauses longer inside a
//     frame is in violation (errs.ErrProtocol, matching
//     os.ErrDeadlineExceeded). Between frames there is no bound
//     (keepalive watches an idle peer).
//
// The exported fields are set before the first Next and not changed after.
type Reader struct {
	Conn  Conn
	Lim   Limits                          // what this side accepts
	Stall time.Duration                   // the longest pause inside a frame
	Get   func(n int) (buffer.Buf, error) // a buffer of n bytes, waiting for room

	armed bool // a read deadline is set
	hdr   [HeaderLen]byte
}

// arm sets the read deadline Stall from now.
func (fr *Reader) arm() {
	fr.Conn.SetReadDeadline(time.Now().Add(fr.Stall))
	fr.armed = true
}

// stalled is the error of a peer that paused inside a frame of n bytes
// after got of them (n < 0: inside its header).
func (fr *Reader) stalled(n, got int) error {
	what := "a frame header"
	if n >= 0 {
		what = fmt.Sprintf("a %d-byte frame after %d bytes of it", n, got)
	}
	return fmt.Errorf("%w: the peer stopped sending inside %s for %v (Config.HandshakeTimeout): %w",
		errs.ErrProtocol, what, fr.Stall, os.ErrDeadlineExceeded)
}

// Next reads the next frame: its type and its payload in a buffer from
// Get, the caller's to release. At a frame boundary the end of the
// connection is io.EOF.
func (fr *Reader) Next() (typ byte, b buffer.Buf, err error) {
	// The header's first bytes, without deadline (a deadline left armed by
	// the frame before is dropped when it passes with nothing read).
	got := 0
	for got == 0 {
		got, err = fr.Conn.Read(fr.hdr[:])
		if got == 0 && err != nil {
			if fr.armed && errors.Is(err, os.ErrDeadlineExceeded) {
				fr.Conn.SetReadDeadline(time.Time{})
				fr.armed = false
				continue
			}
			return 0, buffer.Buf{}, err
		}
	}
	if got < HeaderLen {
		fr.arm()
		if _, err := io.ReadFull(fr.Conn, fr.hdr[got:]); err != nil {
			switch {
			case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
				err = fmt.Errorf("%w: the connection ended inside a frame header", errs.ErrProtocol)
			case errors.Is(err, os.ErrDeadlineExceeded):
				err = fr.stalled(-1, 0)
			}
			return 0, buffer.Buf{}, err
		}
	}
	typ, n, err := ParseHeader(&fr.hdr, fr.Lim)
	if err != nil {
		return typ, buffer.Buf{}, err
	}
	b, err = fr.Get(min(n, CommitFirst))
	if err != nil {
		return typ, buffer.Buf{}, err
	}
	got = 0
	for got < n {
		if got == b.Len() { // full: move to a buffer four times as large
			nb, err := fr.Get(min(n, 4*got))
			if err != nil {
				b.Release()
				return typ, buffer.Buf{}, err
			}
			copy(nb.Bytes(), b.Bytes())
			b.Release()
			b = nb
		}
		fr.arm() // after Get, which may have waited
		k, err := fr.Conn.Read(b.Bytes()[got:])
		got += k
		if err != nil && got < n {
			b.Release()
			switch {
			case err == io.EOF:
				err = fmt.Errorf("%w: the connection ended inside a %d-byte frame", errs.ErrProtocol, n)
			case errors.Is(err, os.ErrDeadlineExceeded):
				err = fr.stalled(n, got)
			}
			return typ, buffer.Buf{}, err
		}
	}
	return typ, b, nil
}
