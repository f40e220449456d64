//go:build !linux

package main

import "errors"

// realMemlock is Env.Memlock on a machine; RDMA through this library needs Linux.
func realMemlock() (uint64, bool, error) {
	return 0, false, errors.New("RLIMIT_MEMLOCK is only checked on Linux (the library needs Linux for RDMA)")
}
