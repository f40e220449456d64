package main

import "golang.org/x/sys/unix"

// realMemlock is Env.Memlock on a machine: the RLIMIT_MEMLOCK soft limit.
func realMemlock() (uint64, bool, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		return 0, false, err
	}
	return rl.Cur, rl.Cur == unix.RLIM_INFINITY, nil
}
