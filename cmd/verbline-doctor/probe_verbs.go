//go:build linux && cgo

package main

import (
	"github.com/verbline/rdma/internal/device"
	"github.com/verbline/rdma/internal/verbs"
)

// verbsProbe is Env.Verbs on a machine: the devices and ports as libibverbs
// (and so the library) sees them.
var verbsProbe = func() ([]VerbsDevice, error) {
	names, err := verbs.DeviceNames()
	if err != nil {
		return nil, err
	}
	out := make([]VerbsDevice, 0, len(names))
	for _, name := range names {
		out = append(out, probeDevice(name))
	}
	return out, nil
}

func probeDevice(name string) VerbsDevice {
	d := VerbsDevice{Name: name}
	ctx, err := verbs.OpenDevice(name)
	if err != nil {
		d.Err = err
		return d
	}
	defer ctx.Close()
	attr, err := ctx.QueryDevice()
	if err != nil {
		d.Err = err
		return d
	}
	c := device.CapsOf(attr)
	d.Caps = &DeviceCaps{Summary: c.String(), MemoryWindows: c.MemoryWindows, Immediates: c.Immediates,
		Atomics: c.Atomics != verbs.AtomicNone, UD: c.UD,
		ReadsIgnoreRights: device.ReadsIgnoreRights(c, name)}
	for n := 1; n <= int(attr.PhysPorts); n++ {
		p, err := ctx.QueryPort(uint8(n))
		if err != nil {
			d.Err = err
			return d
		}
		d.Ports = append(d.Ports, VerbsPort{Num: n, State: p.State.String(), ActiveMTU: p.ActiveMTU.Bytes(), Ethernet: p.Ethernet})
	}
	return d
}
