//go:build !linux || !cgo

package main

// verbsProbe is nil without cgo: libibverbs cannot be asked.
var verbsProbe func() ([]VerbsDevice, error)
