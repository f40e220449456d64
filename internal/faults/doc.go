// Package faults holds the tests that need two hosts joined by a real wire:
// transfers over a lossy, reordering link, a peer process killed in
// mid-transfer, a partition, a peer host powered off, a handshake whose
// last datagram (the CM's RTU) never arrives. They run on host A of
// scripts/softroce pair (package internal/rdmatest/twoguest) with the same
// test binary playing the other end on host B; `make faults` builds and runs
// them and fails if any was skipped. Elsewhere they skip.
package faults
