//go:build linux

package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/pprof/profile"
)

// TestStageOf: a sample goes to the first stage in rule order that any frame
// of its stack belongs to, and a sample in C by its phase label.
func TestStageOf(t *testing.T) {
	for _, tc := range []struct {
		frames []string
		phase  string
		want   string
	}{
		{[]string{"runtime.nanotime1", "runtime.nanotime", "time.Now", libPrefix + "/internal/poller.(*Waiter).Spin"}, "recv", "clock"},
		{[]string{"runtime.futex", "internal/sync.(*Mutex).lockSlow", "sync.(*Mutex).Lock", libPrefix + ".(*engine).handleCompletions"}, "", "locks"},
		{[]string{"runtime.memmove", libPrefix + ".(*engine).read"}, "recv", "copy"},
		{[]string{libPrefix + ".(*engine).maybeSendCreditsLocked", libPrefix + ".(*engine).handleCompletions"}, "", "credits"},
		{[]string{libPrefix + "/internal/poller.(*table).dispatch", libPrefix + "/internal/poller.(*Poller).run"}, "", "dispatch"},
		{[]string{libPrefix + "/internal/verbs.(*QP).PostSend", libPrefix + ".(*engine).write"}, "send", "post"},
		{[]string{"runtime._ExternalCode"}, "send", "C: post (send phase)"},
		{[]string{"runtime._ExternalCode"}, "recv", "C: poll (recv phase)"},
		{[]string{"runtime._ExternalCode"}, "", "C: other"},
		{[]string{"runtime.findRunnable", "runtime.schedule"}, "", "scheduler"},
		{[]string{"main.pingPong"}, "other", "benchmark"},
		{[]string{libPrefix + ".(*engine).fillChunks", libPrefix + ".(*engine).write", "main.pingPong"}, "send", "library, other"},
		{[]string{"io.ReadAtLeast", "main.pingPong"}, "recv", "other"},
		{[]string{"runtime.sigtramp"}, "", "runtime, other"},
		{[]string{libPrefix + "/internal/verbs.(*QP).post", libPrefix + "/internal/verbs.(*QP).PostRecvSend"}, "send", "post"},
		{[]string{libPrefix + "/internal/verbs.(*CQ).poll", libPrefix + "/internal/verbs.(*CQ).PollTries"}, "recv", "poll"},
		{[]string{"time.runtimeNow", "time.Now", libPrefix + ".(*engine).handleCompletions"}, "recv", "clock"},
		// A blocking one-sided call: its post is post, its wait for the
		// operation's end the waiter's.
		{[]string{libPrefix + ".(*engine).postLocked", libPrefix + ".(*engine).postOneSided"}, "send", "post"},
		{[]string{libPrefix + "/internal/poller.(*Waiter).Spin", libPrefix + ".(*engine).spinWait",
			libPrefix + ".(*engine).awaitOp", libPrefix + ".(*engine).postOneSided"}, "send", "waiter"},
		{[]string{libPrefix + ".(*engine).postOneSided", libPrefix + ".(*engine).oneSided"}, "send", "library, other"},
	} {
		if got := stageOf(tc.frames, tc.phase); got != tc.want {
			t.Errorf("stageOf(%v, %q) = %q, want %q", tc.frames, tc.phase, got, tc.want)
		}
	}
}

// TestProfileStages reads a profile as runtime/pprof writes it (inlined
// frames within a location, innermost first; a phase label) and counts its
// samples by stage.
func TestProfileStages(t *testing.T) {
	fn := func(id uint64, name string) *profile.Function { return &profile.Function{ID: id, Name: name} }
	now, waiter, ext := fn(1, "time.Now"), fn(2, libPrefix+"/internal/poller.(*Waiter).Spin"), fn(3, "runtime._ExternalCode")
	inlined := &profile.Location{ID: 1, Line: []profile.Line{{Function: now}, {Function: waiter}}}
	c := &profile.Location{ID: 2, Line: []profile.Line{{Function: ext}}}
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"}, Period: 1000000,
		Function: []*profile.Function{now, waiter, ext}, Location: []*profile.Location{inlined, c},
		Sample: []*profile.Sample{
			{Location: []*profile.Location{inlined}, Value: []int64{3, 3000000}},
			{Location: []*profile.Location{c}, Value: []int64{5, 5000000}, Label: map[string][]string{"phase": {"recv"}}},
		},
	}
	var b bytes.Buffer
	if err := p.Write(&b); err != nil {
		t.Fatal(err)
	}
	got, err := profileStages(&b)
	if err != nil {
		t.Fatal(err)
	}
	if got["clock"] != 3 || got["C: poll (recv phase)"] != 5 || len(got) != 2 {
		t.Fatalf("stages %v, want clock 3 and C: poll (recv phase) 5", got)
	}
	var out strings.Builder
	counts := map[string]map[string]float64{"conn-pingpong": {"client.clock": 3, "client.C: poll (recv phase)": 5}}
	writeStages(&out, []string{"conn-pingpong"}, counts)
	if !strings.Contains(out.String(), "37.5%") || !strings.Contains(out.String(), "62.5%") {
		t.Errorf("table without the client's shares 37.5%% and 62.5%%:\n%s", out.String())
	}
	t.Logf("\n%s", out.String())
}
