//go:build linux && !cgo

package main

import "errors"

// runFloorChild: the Go floor calls verbs through cgo (floor.go).
func runFloorChild(serve bool, connect string, a childArgs, addr string) error {
	return errors.New("the Go floor (case go-floor) needs a build with cgo")
}
