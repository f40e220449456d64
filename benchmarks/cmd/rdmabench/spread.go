//go:build linux

package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// printSpread lists each cell's repetitions and their spread (max/min), for
// runs where the machine is known to be shared (two emulated guests on the
// same cores): the medians alone would hide how much the runs varied.
func (r *report) printSpread(w io.Writer) {
	fmt.Fprintf(w, "\nRepetitions (in run order) and spread = max/min:\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, mp := range r.plan {
		for _, size := range mp.Sizes {
			for _, run := range mp.runners() {
				a := r.agg[cellKey{mp.Metric, size, run.Label}]
				if a == nil || !run.runsAt(size) {
					continue
				}
				var reps []string
				for _, v := range a.Reps {
					reps = append(reps, fmtVal(mp.Metric, v))
				}
				spread := "-"
				if len(a.Reps) > 1 && slices.Min(a.Reps) > 0 {
					spread = fmt.Sprintf("%.2fx", slices.Max(a.Reps)/slices.Min(a.Reps))
				}
				failed := ""
				if len(a.Errs) > 0 {
					failed = fmt.Sprintf("%d failed", len(a.Errs))
				}
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s %s\t%s\t%s\n", mp.Metric.Short(), sizeString(size), run.Label,
					strings.Join(reps, " "), mp.Metric.Unit(), spread, failed)
			}
		}
	}
	tw.Flush()
}
