//go:build linux && cgo

package rdma

import "testing"

// CheckLeaksAtEnd is checkLeaksAtEnd for the external test package
// (example_rdma_test.go runs the examples under the same leak checks as
// the package's own tests).
func CheckLeaksAtEnd(t testing.TB) { checkLeaksAtEnd(t) }
