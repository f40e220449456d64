//go:build linux && cgo

package rdma

import (
	"bytes"
	"errors"
	"io"
	"math/rand"
	"net"
	"os"
	"testing"
	"time"

	"github.com/verbline/rdma/internal/rdmatest"
)

// TestWriteTo: io.Copy from a Conn goes through WriteTo (receive buffers
// handed to the writer, no buffer of io.Copy's), delivers every byte in
// order and ends at the peer's end of stream without an error.
func TestWriteTo(t *testing.T) {
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	defer s.Close()
	data := make([]byte, 1<<20+123)
	rand.New(rand.NewSource(7)).Read(data)
	go func() {
		c.Write(data)
		c.CloseWrite()
	}()
	var got bytes.Buffer
	if _, ok := any(s).(io.WriterTo); !ok {
		t.Fatal("*Conn is not an io.WriterTo")
	}
	n, err := io.Copy(struct{ io.Writer }{&got}, s) // no ReadFrom: io.Copy must take WriteTo
	if err != nil || n != int64(len(data)) {
		t.Fatalf("io.Copy: %d, %v; want %d, nil", n, err, len(data))
	}
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatal("copied bytes differ from those written")
	}
	if n, err := s.WriteTo(&got); n != 0 || err != nil {
		t.Fatalf("WriteTo after end of stream: %d, %v; want 0, nil", n, err)
	}
	c.Close()
}

// limitWriter takes up to room bytes, then fails with err (or, with err
// nil, reports a short write).
type limitWriter struct {
	buf  bytes.Buffer
	room int
	err  error
}

func (l *limitWriter) Write(b []byte) (int, error) {
	if len(b) <= l.room {
		l.room -= len(b)
		return l.buf.Write(b)
	}
	n, _ := l.buf.Write(b[:l.room])
	l.room = 0
	return n, l.err
}

// TestWriteToWriterFails: when the writer fails or writes short, WriteTo
// returns that (the writer's own error, unwrapped) and loses nothing:
// what the writer did not take is still there for the next Read.
func TestWriteToWriterFails(t *testing.T) {
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	defer s.Close()
	defer c.Close()
	data := make([]byte, 300<<10)
	rand.New(rand.NewSource(8)).Read(data)
	go func() {
		c.Write(data)
		c.CloseWrite()
	}()
	full := errors.New("writer full")
	var got []byte
	for _, lw := range []*limitWriter{{room: 40<<10 + 17, err: full}, {room: 1000}} {
		n, err := s.WriteTo(lw)
		want := full
		if lw.err == nil {
			want = io.ErrShortWrite
		}
		if err != want || n != int64(lw.buf.Len()) {
			t.Fatalf("WriteTo into a writer with room %d: %d, %v; want %d, %v", lw.buf.Len(), n, err, lw.buf.Len(), want)
		}
		got = append(got, lw.buf.Bytes()...)
	}
	rest, err := io.ReadAll(s)
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, rest...)
	if !bytes.Equal(got, data) {
		t.Fatalf("got %d bytes across the failed WriteTo calls and Read, want %d (or contents differ)", len(got), len(data))
	}
}

// TestWriteToDeadlineAndClose: the read deadline ends a WriteTo waiting for
// data; Close while the writer holds a receive buffer ends it with
// net.ErrClosed once the writer returns, and the buffer goes back to the
// pool (checkLeaksAtEnd).
func TestWriteToDeadlineAndClose(t *testing.T) {
	c, s, ln := connPair(t, nil)
	defer ln.Close()
	defer c.Close()
	s.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := s.WriteTo(io.Discard); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) || !isTimeout(err) {
		t.Fatalf("WriteTo past the read deadline: %d, %v; want a timeout", n, err)
	}
	s.SetReadDeadline(time.Time{})

	entered, release := make(chan struct{}), make(chan struct{})
	blocking := writerFunc(func(b []byte) (int, error) {
		close(entered)
		<-release
		return len(b), nil
	})
	done := make(chan error, 1)
	go func() {
		_, err := s.WriteTo(blocking)
		done <- err
	}()
	if _, err := c.Write([]byte("held by the writer")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(rdmatest.Scale(5 * time.Second)):
		t.Fatal("WriteTo did not hand the data to its writer")
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed: // Close does not wait for the writer
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(rdmatest.Scale(10 * time.Second)):
		t.Fatal("Close waited for WriteTo's writer")
	}
	close(release)
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("WriteTo across Close: %v; want net.ErrClosed", err)
		}
	case <-time.After(rdmatest.Scale(5 * time.Second)):
		t.Fatal("WriteTo did not return after its writer did")
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
