//go:build linux && cgo

package main

import (
	"fmt"
	"net/netip"

	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/rdmacm"
	"github.com/verbline/rdma/internal/verbs"
)

// probeDevice finds the RDMA device that rdma_cm binds addr to and reads
// its capabilities: it returns the device's name and what the device lacks
// of each need ("" where it has it).
func probeDevice(addr string) (string, func(need) string, error) {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return "", nil, fmt.Errorf("-addr %q: %w", addr, err)
	}
	ch, err := rdmacm.NewChannel()
	if err != nil {
		return "", nil, err
	}
	defer ch.Close()
	id, err := ch.CreateID()
	if err != nil {
		return "", nil, err
	}
	defer id.Destroy()
	if err := id.BindAddr(netip.AddrPortFrom(ip, 0)); err != nil {
		return "", nil, fmt.Errorf("binding rdma_cm to %s: %w", ip, err)
	}
	ctx, err := id.Context()
	if err != nil {
		return "", nil, err
	}
	attr, err := ctx.QueryDevice()
	if err != nil {
		return "", nil, err
	}
	caps := device.CapsOf(attr)
	return ctx.Name(), func(n need) string { return capsLack(caps, n) }, nil
}

// capsLack says why a device with caps cannot run what needs n ("" if it
// can).
func capsLack(caps device.Caps, n need) string {
	switch n {
	case needUD:
		if !caps.UD {
			return "no UD queue pairs (" + caps.Transport.String() + ")"
		}
	case needAtomics:
		if caps.Atomics == verbs.AtomicNone {
			return "no RDMA atomics (" + caps.Transport.String() + ")"
		}
	}
	return ""
}
