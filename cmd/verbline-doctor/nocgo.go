//go:build !cgo

package main

// cgoEnabled says whether this binary was built with cgo.
const cgoEnabled = false
