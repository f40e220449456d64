//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
)

// compareRuns prints, for every paired ratio two runs' JSON outputs share,
// both medians with their intervals and whether the intervals overlap (the
// runs agree on that cell). metric and size, when not empty and not 0,
// select the cells. It returns the number of cells on which the runs
// disagree, or an error if a file cannot be read.
func compareRuns(w io.Writer, pathA, pathB string, metric Metric, size int) (int, error) {
	a, err := readReport(pathA)
	if err != nil {
		return 0, err
	}
	b, err := readReport(pathB)
	if err != nil {
		return 0, err
	}
	type key struct {
		metric         Metric
		size           int
		caseName, base string
	}
	inB := map[key]jsonResult{}
	for _, r := range b.Results {
		inB[key{r.Metric, r.Size, r.Case, r.BaselineLabel}] = r
	}
	fmt.Fprintf(w, "A: %s (%s)\nB: %s (%s)\n\n", pathA, a.Date, pathB, b.Date)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "metric\tsize\tratio\tA\tB\t")
	cells, disagree := 0, 0
	for _, ra := range a.Results {
		if (metric != "" && ra.Metric != metric) || (size != 0 && ra.Size != size) {
			continue
		}
		rb, ok := inB[key{ra.Metric, ra.Size, ra.Case, ra.BaselineLabel}]
		if !ok || ra.RatioCI == nil || rb.RatioCI == nil {
			continue
		}
		cells++
		verdict := "agree"
		switch {
		case !ra.RatioCI.finite() || !rb.RatioCI.finite():
			verdict = "no interval (too few rounds)"
		case !ra.RatioCI.overlaps(*rb.RatioCI):
			verdict = "DISAGREE"
			disagree++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s/%s\t%s\t%s\t%s\n", ra.Metric.Short(), sizeString(ra.Size), ra.Case,
			strings.TrimSuffix(ra.BaselineLabel, " -R"), ra.RatioCI.ratioText(), rb.RatioCI.ratioText(), verdict)
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%d cells compared, %d disagree (95%% intervals that do not overlap)\n", cells, disagree)
	if cells == 0 {
		return 0, fmt.Errorf("the two runs share no paired ratio with the selection")
	}
	return disagree, nil
}

func readReport(path string) (*jsonReport, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r jsonReport
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w (a JSON written by rdmabench -json?)", path, err)
	}
	return &r, nil
}
