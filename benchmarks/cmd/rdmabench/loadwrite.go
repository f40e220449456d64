//go:build linux

package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/buffer"
)

// The workloads over one-sided writes (-load-view write): each side exports
// a region of slots; a request is an RDMA write with immediate of the
// header and payload into the server's slot (the immediate names the slot),
// the response one of the response bytes into the client's slot of the same
// number. Slot i%S serves request i: responses come back in order, so when
// request i may start, request i-S has been answered.

// writeSlotsOpenLoop is the number of slots (requests outstanding) per
// connection in open loop over writes: each slot holds a request and a
// response of the largest sizes.
const writeSlotsOpenLoop = 64

// writeClient is the client's end of a connection over writes.
type writeClient struct {
	c                 *rdma.Conn
	slots             int
	slotReq, slotResp int
	reqBufs           []buffer.Buf
	respRegion        buffer.Buf
	exp               *rdma.Export
	remote            rdma.RemoteBuf // the server's request slots
}

func newWriteClient(c *rdma.Conn, slots, maxReq, maxResp int) (*writeClient, error) {
	w := &writeClient{c: c, slots: slots, slotReq: 8 + maxReq, slotResp: max(maxResp, 1)}
	setup, err := c.Alloc(12)
	if err != nil {
		return nil, err
	}
	b := setup.Bytes()
	binary.BigEndian.PutUint32(b[0:4], uint32(slots))
	binary.BigEndian.PutUint32(b[4:8], uint32(w.slotReq))
	binary.BigEndian.PutUint32(b[8:12], uint32(w.slotResp))
	if err := c.Send(context.Background(), setup); err != nil {
		return nil, fmt.Errorf("send setup: %w", err)
	}
	w.respRegion, w.exp, w.remote, err = exchange(c, slots*w.slotResp, rdma.RemoteWrite)
	if err != nil {
		return nil, fmt.Errorf("exchange regions: %w", err)
	}
	for range slots {
		rb, err := c.Alloc(w.slotReq)
		if err != nil {
			w.close()
			return nil, err
		}
		w.reqBufs = append(w.reqBufs, rb)
	}
	return w, nil
}

// send writes request i (header and payload in msg) into its slot.
func (w *writeClient) send(ctx context.Context, i int, msg []byte) error {
	slot := i % w.slots
	b := w.reqBufs[slot]
	if err := b.SetLen(len(msg)); err != nil {
		return err
	}
	copy(b.Bytes(), msg)
	return w.c.WriteRemoteImm(ctx, b, w.remote, uint64(slot*w.slotReq), uint32(slot))
}

// recv waits for response i's notification.
func (w *writeClient) recv(ctx context.Context, i int) error {
	n, err := w.c.RecvNotification(ctx)
	if err != nil {
		return err
	}
	defer n.Release()
	if want := uint32(i % w.slots); n.Imm != want {
		return fmt.Errorf("response for slot %d, want %d", n.Imm, want)
	}
	return nil
}

func (w *writeClient) close() {
	if w.exp != nil {
		w.exp.Close()
	}
	w.respRegion.Release()
	for _, b := range w.reqBufs {
		b.Release()
	}
}

// serveLoadWrite is serveLoad over one-sided writes.
func serveLoadWrite(c *rdma.Conn) error {
	ctx := context.Background()
	m, err := c.Recv(ctx)
	if err != nil {
		return fmt.Errorf("recv setup: %w", err)
	}
	b := m.Bytes()
	if len(b) != 12 {
		m.Release()
		return fmt.Errorf("setup of %d bytes, want 12: not an rdmabench -load-view write client", len(b))
	}
	slots, slotReq, slotResp := int(binary.BigEndian.Uint32(b[0:4])), int(binary.BigEndian.Uint32(b[4:8])), int(binary.BigEndian.Uint32(b[8:12]))
	m.Release()
	if slots < 1 || slots > 1<<16 || slotReq < 8 || slotResp < 1 || int64(slots)*int64(max(slotReq, slotResp)) > 1<<30 {
		return fmt.Errorf("setup asks for %d slots of %d and %d bytes", slots, slotReq, slotResp)
	}
	region, exp, remote, err := exchange(c, slots*slotReq, rdma.RemoteWrite)
	if err != nil {
		return fmt.Errorf("exchange regions: %w", err)
	}
	defer region.Release()
	defer exp.Close()
	resp, err := c.Alloc(slotResp)
	if err != nil {
		return err
	}
	defer resp.Release()
	for {
		n, err := c.RecvNotification(ctx)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("recv request: %w", err)
		}
		slot := int(n.Imm)
		n.Release()
		if slot >= slots {
			return fmt.Errorf("request in slot %d of %d", slot, slots)
		}
		hdr := region.Bytes()[slot*slotReq:]
		req, rl := int(binary.BigEndian.Uint32(hdr[0:4])), int(binary.BigEndian.Uint32(hdr[4:8]))
		if req > slotReq-8 || rl > slotResp {
			return fmt.Errorf("request of %d bytes asks for %d: beyond the slots (%d, %d)", req, rl, slotReq, slotResp)
		}
		if err := resp.SetLen(rl); err != nil {
			return err
		}
		if err := c.WriteRemoteImm(ctx, resp, remote, uint64(slot*slotResp), uint32(slot)); err != nil {
			return fmt.Errorf("write response: %w", err)
		}
	}
}
