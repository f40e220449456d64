//go:build linux && cgo

package faults

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"time"

	"github.com/verbline/rdma"
)

// Both hosts run the same exchanges at once, each with its own seed; what
// one side sends the other checks.

// streamResult is one side's account of a stream exchange.
type streamResult struct {
	Sent, Recv string  // sha256 (hex) of the bytes written and of those read
	Bytes      int64   // bytes read
	ReadSecs   float64 // from the first byte read to io.EOF
}

// exchangeStream writes n bytes of stream seed through c, then CloseWrite,
// while it reads until io.EOF. ctx bounds it (c is closed when ctx ends).
func exchangeStream(ctx context.Context, c *rdma.Conn, seed uint64, n int64) (streamResult, error) {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	var sent string
	werr := make(chan error, 1)
	go func() {
		h := sha256.New()
		buf := make([]byte, 1<<20)
		for i := int64(0); i < n; {
			k := min(int64(len(buf)), n-i)
			fill(buf[:k], seed, uint64(i>>20))
			h.Write(buf[:k])
			if _, err := c.Write(buf[:k]); err != nil {
				werr <- fmt.Errorf("write at byte %d of %d: %w", i, n, err)
				return
			}
			i += k
		}
		sent = hex.EncodeToString(h.Sum(nil))
		werr <- c.CloseWrite()
	}()
	h := sha256.New()
	buf := make([]byte, 1<<20)
	var got int64
	var start time.Time
	for {
		k, err := c.Read(buf)
		if k > 0 && start.IsZero() {
			start = time.Now()
		}
		h.Write(buf[:k])
		got += int64(k)
		if err == io.EOF {
			break
		}
		if err != nil {
			return streamResult{}, fmt.Errorf("read after %d bytes: %w", got, err)
		}
	}
	secs := time.Since(start).Seconds()
	if err := <-werr; err != nil {
		return streamResult{}, err
	}
	return streamResult{Sent: sent, Recv: hex.EncodeToString(h.Sum(nil)), Bytes: got, ReadSecs: secs}, nil
}

// The message exchange: msgSizes in turn, cycles times (up to the receive
// buffers' size eager, above it by rendezvous: the lossy Config's 4 KiB
// buffers are the boundary), with slots one-sided writes with immediate
// interleaved into the peer's export.
var msgSizes = []int{16, 200, 1500, 4096, 4097, 32 << 10, 100 << 10, 1 << 20}

// nWrites is how many of the slots the one-sided writes use.
var nWrites = slots

const (
	slots    = 32
	slotSize = 16 << 10
	hdrLen   = 9 // kind, sequence number, length
)

// writeLen is the length of one-sided write i (1 B to slotSize).
func writeLen(i int) int { return 1 + (i*5003)%slotSize }

// msgResult is one side's account of a message exchange.
type msgResult struct {
	Messages, Writes int
	Bytes            int64 // message bytes received
	Secs             float64
}

// exchangeMessages sends sendCycles*len(msgSizes) messages and nWrites
// one-sided writes with immediate (into the peer's export, whose
// descriptor is its first message; none if sendCycles is 0), then an end
// message and CloseWrite; meanwhile it checks that the peer's messages
// (recvCycles*len(msgSizes)) and notifications (nWrites, if recvCycles is
// not 0) arrive each once, in order and intact, and that nothing follows
// the end. ctx bounds it.
func exchangeMessages(ctx context.Context, c *rdma.Conn, mySeed, peerSeed uint64, sendCycles, recvCycles int) (msgResult, error) {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	start := time.Now()
	count, sendCount := recvCycles*len(msgSizes), sendCycles*len(msgSizes)
	recvWrites, sendWrites := nWrites, nWrites
	if recvCycles == 0 {
		recvWrites = 0
	}
	if sendCycles == 0 {
		sendWrites = 0
	}
	target, err := c.Alloc(slots * slotSize)
	if err != nil {
		return msgResult{}, err
	}
	defer target.Release()
	clear(target.Bytes())
	exp, err := c.Export(target, rdma.RemoteWrite)
	if err != nil {
		return msgResult{}, err
	}
	defer exp.Close()

	remote := make(chan rdma.RemoteBuf, 1)
	errs := make(chan error, 3)
	var got int64
	go func() { // the peer's messages
		errs <- func() error {
			m, err := c.Recv(ctx)
			if err != nil {
				return fmt.Errorf("receive the peer's export: %w", err)
			}
			b := m.Bytes()
			if len(b) < hdrLen || b[0] != 'D' {
				return fmt.Errorf("first message %q, want the peer's export", b[:min(len(b), 16)])
			}
			r, err := rdma.ParseRemoteBuf(b[hdrLen:])
			m.Release()
			if err != nil {
				return err
			}
			remote <- r
			want := make([]byte, 1<<20)
			for i := 0; i < count; i++ {
				m, err := c.Recv(ctx)
				if err != nil {
					return fmt.Errorf("message %d of %d: %w", i, count, err)
				}
				progress.Add(1)
				err = checkMessage(m.Bytes(), peerSeed, i, want)
				got += int64(m.Len())
				m.Release()
				if err != nil {
					return err
				}
			}
			m, err = c.Recv(ctx)
			if err != nil {
				return fmt.Errorf("end message: %w", err)
			}
			b = m.Bytes()
			if len(b) != hdrLen || b[0] != 'E' || binary.LittleEndian.Uint32(b[1:]) != uint32(count) {
				return fmt.Errorf("after %d messages: %q, want the end message", count, b[:min(len(b), 16)])
			}
			m.Release()
			if m, err := c.Recv(ctx); err != io.EOF {
				if err == nil {
					err = fmt.Errorf("%w: a %d-byte message after the end", errExtra, m.Len())
					m.Release()
				}
				return fmt.Errorf("after the end message: %w, want io.EOF", err)
			}
			return nil
		}()
	}()
	go func() { // the peer's writes into the export
		errs <- func() error {
			want := make([]byte, slotSize)
			for i := 0; i < recvWrites; i++ {
				n, err := c.RecvNotification(ctx)
				if err != nil {
					return fmt.Errorf("notification %d of %d: %w", i, recvWrites, err)
				}
				progress.Add(1)
				n.Release()
				if n.Imm != uint32(i) || n.Len != writeLen(i) {
					return fmt.Errorf("notification %d: imm %d, %d bytes; want imm %d, %d bytes", i, n.Imm, n.Len, i, writeLen(i))
				}
				w := want[:writeLen(i)]
				fill(w, peerSeed*1000+2, uint64(i))
				if !bytes.Equal(target.Bytes()[i*slotSize:][:len(w)], w) {
					return fmt.Errorf("one-sided write %d (%d bytes): the bytes in the export differ", i, len(w))
				}
			}
			return nil
		}()
	}()
	go func() { errs <- sendAll(ctx, c, exp, mySeed, sendCount, sendWrites, remote) }()
	for range 3 {
		if err := <-errs; err != nil {
			st := c.Stats()
			return msgResult{}, fmt.Errorf("%w (connection stats: %+v)", err, st)
		}
	}
	return msgResult{Messages: count, Writes: recvWrites, Bytes: got, Secs: time.Since(start).Seconds()}, nil
}

// sendAll is exchangeMessages' sending side.
func sendAll(ctx context.Context, c *rdma.Conn, exp *rdma.Export, seed uint64, count, writes int, remote <-chan rdma.RemoteBuf) error {
	desc := exp.Remote().AppendTo(nil)
	if err := sendMsg(ctx, c, 'D', 0, hdrLen+len(desc), func(b []byte) { copy(b, desc) }); err != nil {
		return fmt.Errorf("send the export: %w", err)
	}
	var r rdma.RemoteBuf
	select {
	case r = <-remote:
		setKick(c, r)
	case <-ctx.Done():
		return fmt.Errorf("waiting for the peer's export: %w", ctx.Err())
	}
	w := 0
	write := func() error {
		b, err := c.Alloc(writeLen(w))
		if err != nil {
			return err
		}
		defer b.Release()
		fill(b.Bytes(), seed*1000+2, uint64(w))
		if err := c.WriteRemoteImm(ctx, b, r, uint64(w*slotSize), uint32(w)); err != nil {
			return fmt.Errorf("one-sided write %d: %w", w, err)
		}
		progress.Add(1)
		w++
		return nil
	}
	for i := 0; i < count; i++ {
		size := msgSizes[i%len(msgSizes)]
		if err := sendMsg(ctx, c, 'M', i, size, func(b []byte) { fill(b, seed*1000+1, uint64(i)) }); err != nil {
			return fmt.Errorf("message %d (%d bytes): %w", i, size, err)
		}
		if w < writes && i%2 == 1 {
			if err := write(); err != nil {
				return err
			}
		}
	}
	for w < writes {
		if err := write(); err != nil {
			return err
		}
	}
	if err := sendMsg(ctx, c, 'E', count, hdrLen, func([]byte) {}); err != nil {
		return fmt.Errorf("end message: %w", err)
	}
	return c.CloseWrite()
}

// sendMsg sends a size-byte message: kind, seq, size, then payload's bytes.
func sendMsg(ctx context.Context, c *rdma.Conn, kind byte, seq, size int, payload func([]byte)) error {
	b, err := c.Alloc(size)
	if err != nil {
		return err
	}
	p := b.Bytes()
	p[0] = kind
	binary.LittleEndian.PutUint32(p[1:], uint32(seq))
	binary.LittleEndian.PutUint32(p[5:], uint32(size))
	payload(p[hdrLen:])
	if err := c.Send(ctx, b); err != nil { // takes b over
		return err
	}
	progress.Add(1)
	return nil
}

// checkMessage checks that b is data message i of the peer's (seed).
func checkMessage(b []byte, seed uint64, i int, scratch []byte) error {
	size := msgSizes[i%len(msgSizes)]
	if len(b) != size {
		return fmt.Errorf("message %d: %d bytes, want %d", i, len(b), size)
	}
	if b[0] != 'M' || binary.LittleEndian.Uint32(b[1:]) != uint32(i) || binary.LittleEndian.Uint32(b[5:]) != uint32(size) {
		return fmt.Errorf("message %d: header kind %q seq %d size %d (lost, duplicated or reordered?)",
			i, b[0], binary.LittleEndian.Uint32(b[1:]), binary.LittleEndian.Uint32(b[5:]))
	}
	want := scratch[:size-hdrLen]
	fill(want, seed*1000+1, uint64(i))
	if !bytes.Equal(b[hdrLen:], want) {
		return fmt.Errorf("message %d (%d bytes): payload differs", i, size)
	}
	return nil
}
