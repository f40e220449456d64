//go:build linux

package main

// Capabilities a case or a baseline needs of the device: the plan leaves
// out what the device under test lacks (probeDevice), saying so, instead of
// failing it in every round.
type need int

const (
	needNothing need = iota
	needUD           // UD queue pairs (the PacketConn cases, perftest's -c UD)
	needAtomics      // RDMA atomics (the atomics cases, ib_atomic_*)
)

// needs is what the perftest tool needs of the device.
func (t perftestTool) needs() need {
	switch {
	case t.Conn == "UD":
		return needUD
	case t.Atomic != "":
		return needAtomics
	}
	return needNothing
}
