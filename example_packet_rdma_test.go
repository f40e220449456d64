//go:build linux && cgo

package rdma_test

import (
	"errors"
	"maps"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
)

// packetExamples are the Example functions of example_packet_test.go,
// run by TestPacketExamples as TestExamples runs example_test.go's.
var packetExamples = map[string]func(){
	"ExampleListenPacket":    ExampleListenPacket,
	"ExamplePacketConn_Recv": ExamplePacketConn_Recv,
}

// TestPacketExamplesDocumented needs no device: every example says what it
// prints and is in packetExamples.
func TestPacketExamplesDocumented(t *testing.T) {
	want := documentedOutputs(t, "example_packet_test.go")
	if !slices.Equal(slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(packetExamples))) {
		t.Fatalf("example_packet_test.go's examples %v, packetExamples %v", slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(packetExamples)))
	}
}

// TestPacketExamples runs every datagram example for real: it must print
// what its "Prints:" comment says, end in time and leave nothing behind.
// On a device without UD queue pairs (iWARP) the examples cannot run: there
// ListenPacket must refuse with errors.ErrUnsupported (the examples' own
// log.Fatal would end the test binary).
func TestPacketExamples(t *testing.T) {
	env := rdmatest.Require(t)
	p, err := rdma.ListenPacket("rdma", net.JoinHostPort(env.Addr, "0"))
	if err != nil {
		if !errors.Is(err, errors.ErrUnsupported) || !rdma.OnIWARPDevice(t) {
			t.Fatalf("ListenPacket: %v", err)
		}
		t.Logf("the test device has no UD queue pairs, and ListenPacket refuses: %v", err)
		return
	}
	p.Close()
	want := documentedOutputs(t, "example_packet_test.go")
	for _, name := range slices.Sorted(maps.Keys(packetExamples)) {
		t.Run(name, func(t *testing.T) {
			rdma.CheckLeaksAtEnd(t)
			got := runExample(t, name, packetExamples[name], rdmatest.Scale(10*time.Second))
			if strings.TrimSpace(got) != want[name] {
				t.Errorf("%s printed:\n%s\nits Prints: comment says:\n%s", name, got, want[name])
			}
		})
	}
}
