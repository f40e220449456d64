// Package benchmarks holds the library's testing.B benchmarks
// (conn_bench_test.go) and, in cmd/rdmabench, the harness that measures the
// library side by side with perftest and TCP. See README.md in this folder;
// the figures measured with them are in docs/performance.md.
package benchmarks
