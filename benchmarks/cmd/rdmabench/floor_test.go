//go:build linux

package main

import (
	"strings"
	"testing"
)

// TestFloorCase: the floor is a latency case that runs at every latency size.
func TestFloorCase(t *testing.T) {
	c, ok := caseByName("go-floor")
	if !ok || !c.Floor || c.Metric != Latency || c.TCP || c.Packet {
		t.Fatalf("go-floor: %+v, registered %v", c, ok)
	}
	for _, size := range Latency.Sizes(modeLong) {
		if c.MaxSize != 0 && size > c.MaxSize {
			t.Errorf("go-floor does not run at %d bytes", size)
		}
	}
}

// TestFloorNetwork: a child runs the floor with -net verbs and nothing else
// with it; the mismatch fails before any device is opened.
func TestFloorNetwork(t *testing.T) {
	for _, c := range []struct{ name, network string }{
		{"go-floor", "rdma"},
		{"go-floor", "tcp"},
		{"conn-pingpong", "verbs"},
	} {
		err := runChild(true, "", childArgs{caseName: c.name, network: c.network, size: 64, iters: 1}, "127.0.0.1", 1, 0)
		if err == nil || !strings.Contains(err.Error(), "-net verbs") && !strings.Contains(err.Error(), "TCP") {
			t.Errorf("%s over %s: %v", c.name, c.network, err)
		}
	}
}
