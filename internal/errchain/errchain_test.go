package errchain_test

import (
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"

	"github.com/verbline/rdma/internal/errchain"
)

// TestAnalyzer: each "want" comment in testdata/src/a is a report the
// check must make on that line, and every other line must get none.
func TestAnalyzer(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), errchain.Analyzer, "a")
}
