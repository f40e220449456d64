//go:build !linux

package twoguest

import "errors"

func powerOff() error { return errors.New("power off: only on Linux") }
