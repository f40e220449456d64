//go:build linux

package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// TestPlanLeavesOutWhatTheDeviceLacks: on a device without UD queue pairs
// or atomics (iWARP) the plan has neither the cases nor the perftest
// baselines that need them, and the log names each one left out; with the
// device not probed, every case stays.
func TestPlanLeavesOutWhatTheDeviceLacks(t *testing.T) {
	all := regexp.MustCompile("")
	labels := func(h *harness) map[string]bool {
		got := map[string]bool{}
		for _, mp := range h.plan(all, all) {
			for _, r := range mp.runners() {
				got[r.Label] = true
			}
		}
		return got
	}
	var log bytes.Buffer
	iwarp := &harness{addr: "169.254.77.1", mode: modeDefault, work: defaultWorkload(false), log: &log,
		device: "siw0", lacks: func(n need) string {
			switch n {
			case needUD:
				return "no UD queue pairs (iWARP)"
			case needAtomics:
				return "no RDMA atomics (iWARP)"
			}
			return ""
		}}
	got := labels(iwarp)
	unprobed := labels(&harness{addr: "169.254.77.1", mode: modeDefault, work: defaultWorkload(false), log: &bytes.Buffer{}})
	// A metric none of whose cases runs has no baselines to leave out (the
	// atomics'): the log names its cases.
	for _, l := range []string{"ud-pingpong", "ud-msgrate", "ib_send_lat -c UD", "ib_send_bw -c UD", "cas-lat", "faa-lat", "faa-rate",
		"ib_atomic_lat -A CMP_AND_SWAP -R", "ib_atomic_bw -A FETCH_AND_ADD -R"} {
		if got[l] {
			t.Errorf("%s is in the plan of a device without it", l)
		}
		if !unprobed[l] {
			t.Errorf("%s is missing from the plan of a device not probed", l)
		}
		if !strings.HasPrefix(l, "ib_atomic") && !strings.Contains(log.String(), l+":") {
			t.Errorf("the log does not say %s was left out:\n%s", l, log.String())
		}
	}
	for _, l := range []string{"conn-pingpong", "msg-pingpong", "write-pingpong", "go-floor", "ib_send_lat -R", "ib_read_bw -R"} {
		if !got[l] {
			t.Errorf("%s, which needs nothing of the device, is missing from the plan", l)
		}
	}
}
