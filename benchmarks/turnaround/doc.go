// Package turnaround holds tools for timing a ping-pong side's turnaround
// (benchmarks/README.md, "Profiling and tracing"):
// stamps.patch (clock stamps along the path, applied to a worktree),
// split.sh (the round trip split at the kernel's events), and the
// benchmarks of callcost_test.go, which price the Go operations the data
// path is made of, the emulated guest against the host it runs on:
//
//	go test -c -o .build/callcost.test ./benchmarks/turnaround
//	scripts/softroce run -- taskset -c 1 .build/callcost.test -test.bench . -test.benchtime 200000x
//	taskset -c 1 .build/callcost.test -test.bench . -test.benchtime 2000000x   # the host
package turnaround
