//go:build linux && cgo

package rdma_test

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
)

// readmeExamples are the Example functions of example_readme_test.go, the
// README's quick starts, run by TestReadmeExamples as TestExamples runs
// example_test.go's.
var readmeExamples = map[string]func(){
	"Example_netHTTP":  Example_netHTTP,
	"Example_messages": Example_messages,
}

// TestReadmeExamplesDocumented needs no device: every quick start says what
// it prints and is in readmeExamples.
func TestReadmeExamplesDocumented(t *testing.T) {
	want := documentedOutputs(t, "example_readme_test.go")
	if !slices.Equal(slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(readmeExamples))) {
		t.Fatalf("example_readme_test.go's examples %v, readmeExamples %v", slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(readmeExamples)))
	}
}

// TestReadmeExamples runs the README's quick starts for real: each must
// print what its "Prints:" comment says, end in time and leave nothing
// behind.
func TestReadmeExamples(t *testing.T) {
	rdmatest.Require(t)
	want := documentedOutputs(t, "example_readme_test.go")
	for _, name := range slices.Sorted(maps.Keys(readmeExamples)) {
		t.Run(name, func(t *testing.T) {
			rdma.CheckLeaksAtEnd(t)
			got := runExample(t, name, readmeExamples[name], rdmatest.Scale(10*time.Second))
			if strings.TrimSpace(got) != want[name] {
				t.Errorf("%s printed:\n%s\nits Prints: comment says:\n%s", name, got, want[name])
			}
		})
	}
}
