//go:build linux

package main

import (
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
)

// Packets per message. Soft-RoCE's cost is per packet and per byte (its
// kernel work per packet, cpu.go measures it), so the packets a case puts
// on the wire per message, ACKs and
// control messages included, bound its ratio to a perftest tool that moves
// the same bytes in fewer: these counters say how much of a gap the
// protocol itself explains before any microsecond of software is counted.
// The harness reads the devices' sent_pkts (sysfs hw_counters, which rxe
// and most RoCE drivers keep) around each run on one host, where both ends
// send through the same device: both directions are counted, and so are
// the run's set-up and warm-up (a few dozen packets over thousands).

// devicePackets sums the sent_pkts counters of every RDMA port of the host;
// ok is false when no device keeps one.
func devicePackets() (n uint64, ok bool) {
	for _, f := range deviceCounterFiles() {
		b, err := kernelStats.read(f)
		if err != nil {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(b), 10, 64)
		if err != nil {
			continue
		}
		n, ok = n+v, true
	}
	return n, ok
}

// deviceCounters caches the glob of the ports' sent_pkts files: the
// devices do not change while the harness runs, and a glob of sysfs per
// sample would cost more than the reading.
var deviceCounters struct {
	sync.Mutex
	files []string
}

func deviceCounterFiles() []string {
	deviceCounters.Lock()
	defer deviceCounters.Unlock()
	if len(deviceCounters.files) == 0 {
		deviceCounters.files, _ = filepath.Glob("/sys/class/infiniband/*/ports/*/hw_counters/sent_pkts")
	}
	return deviceCounters.files
}

// countPackets runs f and sets its sample's Packets: the device packets per
// message (per round trip for latency) of messages messages.
func countPackets(messages int, f func() (*Sample, error)) (*Sample, error) {
	before, ok := devicePackets()
	s, err := f()
	after, ok2 := devicePackets()
	if err == nil && s != nil && ok && ok2 && messages > 0 && after >= before {
		s.Packets = float64(after-before) / float64(messages)
	}
	return s, err
}

// printPackets lists, per size, the packets per message of every RDMA
// column that reported them (ours and perftest; TCP has none).
func (r *report) printPackets(w io.Writer, mp metricPlan) {
	unit := map[bool]string{true: "round trip", false: "message"}[mp.Metric == Latency]
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := false
	for _, size := range mp.Sizes {
		var cells []string
		for _, o := range mp.runners() {
			if a := r.get(mp.Metric, size, o.Label); a != nil && a.Packets > 0 {
				cells = append(cells, fmt.Sprintf("%s %.2f", o.Label, a.Packets))
			}
		}
		if len(cells) == 0 {
			continue
		}
		if !header {
			fmt.Fprintf(w, "  device packets per %s (both directions, ACKs included):\n", unit)
			header = true
		}
		fmt.Fprintf(tw, "  %s\t%s\n", sizeString(size), strings.Join(cells, "\t"))
	}
	tw.Flush()
}
