//go:build linux

package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/google/pprof/profile"
)

// Stages (-stages): each child profiles its CPU (as RDMABENCH_CPUPROFILE
// does) and sorts its samples into the stages of a message's path, by the
// functions on each sample's stack; the report prints each case's shares.
// Under emulation the profiler loses many samples (40-66% in a ping-pong),
// so shares, not times, are what a profile tells.
//
// A sample goes to the first stage in this order that a frame of its stack
// belongs to (so time.Now inside the waiter counts as clock, a mutex inside
// the completion handler as locks); a sample taken inside C (a post or a
// poll through the fast calls has no Go stack there) goes by the phase
// label the latency clients set (phase); what no rule claims goes by its
// innermost frame (stageOf).
var stageRules = []struct {
	stage string
	match func(fn string) bool
}{
	{"clock", func(fn string) bool {
		return fn == "time.Now" || fn == "time.runtimeNow" || fn == "time.now" || fn == "time.Since" ||
			fn == "runtime.nanotime" || fn == "runtime.nanotime1" || fn == "runtime.walltime"
	}},
	{"copy", func(fn string) bool { return fn == "runtime.memmove" || fn == "runtime.memclrNoHeapPointers" }},
	{"locks", func(fn string) bool {
		return strings.HasPrefix(fn, "sync.(*Mutex).") || strings.HasPrefix(fn, "internal/sync.(*Mutex).") ||
			strings.HasPrefix(fn, "sync.(*RWMutex).") || fn == "runtime.lock2" || fn == "runtime.unlock2"
	}},
	{"atomics", func(fn string) bool {
		return strings.HasPrefix(fn, "sync/atomic.") || strings.HasPrefix(fn, "go.uber.org/atomic.") ||
			strings.HasPrefix(fn, "internal/runtime/atomic.")
	}},
	{"credits", func(fn string) bool {
		if !strings.HasPrefix(fn, libPrefix+".") {
			return false
		}
		f := strings.ToLower(fn)
		return strings.Contains(f, "credit") || strings.Contains(f, "granted") || strings.Contains(f, "repost") ||
			strings.Contains(f, "window")
	}},
	{"post", func(fn string) bool {
		// postOneSided is a one-sided call's whole course (the wait for a
		// slot and for the operation's end among it), not its post: its
		// post is postLocked, its waits the waiter's.
		return method(fn, libPrefix+"/internal/verbs.(*QP).", "post") || strings.Contains(fn, "sqPush") ||
			method(fn, libPrefix+".(*engine).", "post") && fn != libPrefix+".(*engine).postOneSided"
	}},
	{"poll", func(fn string) bool { return method(fn, libPrefix+"/internal/verbs.(*CQ).", "poll") }},
	{"waiter", func(fn string) bool { return strings.HasPrefix(fn, libPrefix+"/internal/poller.(*Waiter).") }},
	{"dispatch", func(fn string) bool {
		return strings.HasPrefix(fn, libPrefix+"/internal/poller.(*table).dispatch") ||
			strings.HasPrefix(fn, libPrefix+".(*engine).handleCompletions")
	}},
	{"gc", func(fn string) bool {
		return strings.HasPrefix(fn, "runtime.gc") || fn == "runtime.mallocgc" || strings.HasPrefix(fn, "runtime.markroot") ||
			strings.HasPrefix(fn, "runtime.scanobject")
	}},
	{"scheduler", func(fn string) bool {
		return fn == "runtime.schedule" || fn == "runtime.findRunnable" || fn == "runtime.park_m" ||
			fn == "runtime.gopark" || fn == "runtime.goready" || fn == "runtime.Gosched" || fn == "runtime.mcall" ||
			fn == "runtime.futex" || fn == "runtime.usleep" || fn == "runtime.netpoll"
	}},
}

const libPrefix = "github.com/verbline/rdma"

// method reports whether fn is a method of the type prefix names whose
// name starts with verb, in either case (PostSend and post alike).
func method(fn, prefix, verb string) bool {
	m, ok := strings.CutPrefix(fn, prefix)
	return ok && strings.HasPrefix(strings.ToLower(m), verb)
}

// stageNames are the stages in report order: the rules', the two of C
// (by phase label), and those of the innermost frame.
var stageNames = func() []string {
	var s []string
	for _, r := range stageRules {
		s = append(s, r.stage)
	}
	return append(s, "C: post (send phase)", "C: poll (recv phase)", "C: other",
		"library, other", "benchmark", "runtime, other", "other")
}()

// stageOf is the stage of a sample whose stack is frames (innermost
// first, inlined calls included) and whose phase label is phase. What no
// rule claims goes by its innermost frame: the benchmark's own code is at
// the root of every sample of its goroutine, so the root cannot decide.
func stageOf(frames []string, phase string) string {
	for _, r := range stageRules {
		for _, fn := range frames {
			if r.match(fn) {
				return r.stage
			}
		}
	}
	if slices.Contains(frames, "runtime._ExternalCode") {
		switch phase {
		case "send":
			return "C: post (send phase)"
		case "recv":
			return "C: poll (recv phase)"
		}
		return "C: other"
	}
	if len(frames) == 0 {
		return "other"
	}
	switch fn := frames[0]; {
	case strings.HasPrefix(fn, libPrefix):
		return "library, other"
	case strings.HasPrefix(fn, "main."):
		return "benchmark"
	case strings.HasPrefix(fn, "runtime."):
		return "runtime, other"
	}
	return "other"
}

// profileStages reads a CPU profile and counts its samples by stage.
func profileStages(r io.Reader) (map[string]float64, error) {
	p, err := profile.Parse(r)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, s := range p.Sample {
		var frames []string
		for _, loc := range s.Location {
			for _, l := range loc.Line { // inlined calls first
				if l.Function != nil {
					frames = append(frames, l.Function.Name)
				}
			}
		}
		phase := ""
		if v := s.Label["phase"]; len(v) > 0 {
			phase = v[0]
		}
		if len(s.Value) > 0 {
			out[stageOf(frames, phase)] += float64(s.Value[0])
		}
	}
	return out, nil
}

// stageShares turns counts (keys side.stage, side "client" or "server")
// into one side's shares by stage, in stageNames' order, and that side's
// sample count.
func stageShares(counts map[string]float64, side string) (shares []float64, total float64) {
	for _, st := range stageNames {
		total += counts[side+"."+st]
	}
	for _, st := range stageNames {
		if total > 0 {
			shares = append(shares, counts[side+"."+st]/total)
		} else {
			shares = append(shares, 0)
		}
	}
	return shares, total
}

// writeStages prints, for a metric and size, each runner's shares of CPU
// samples by stage, client and server, summed over its rounds.
func writeStages(w io.Writer, rows []string, counts map[string]map[string]float64) {
	var cols []string
	shares := map[string][]float64{}
	totals := map[string]float64{}
	for _, r := range rows {
		if counts[r] == nil {
			continue
		}
		for _, side := range []string{"client", "server"} {
			c := r + " " + side
			cols = append(cols, c)
			shares[c], totals[c] = stageShares(counts[r], side)
		}
	}
	if len(cols) == 0 {
		return
	}
	fmt.Fprintf(w, "  CPU samples by stage (-stages), share of each side's samples over its rounds:\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  stage\t%s\t\n", strings.Join(cols, "\t"))
	for i, st := range stageNames {
		row := []string{"  " + st}
		for _, c := range cols {
			row = append(row, fmt.Sprintf("%.1f%%", 100*shares[c][i]))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	row := []string{"  samples"}
	for _, c := range cols {
		row = append(row, fmt.Sprintf("%.0f", totals[c]))
	}
	fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	tw.Flush()
}
