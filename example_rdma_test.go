//go:build linux && cgo

package rdma_test

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
)

// examples are the Example functions of example_test.go. They have no
// "Output:" comment (go test would run them on machines without a device),
// so TestExamples runs them here.
var examples = map[string]func(){
	"ExampleListen":               ExampleListen,
	"ExampleDial":                 ExampleDial,
	"ExampleDialer_DialContext":   ExampleDialer_DialContext,
	"ExampleListenConfig":         ExampleListenConfig,
	"ExampleConn_Send":            ExampleConn_Send,
	"ExampleConn_Export":          ExampleConn_Export,
	"ExampleConn_PostWriteRemote": ExampleConn_PostWriteRemote,
	"Example_errors":              Example_errors,
	"ExampleReadMetrics":          ExampleReadMetrics,
	"ExampleConn_QPInfo":          ExampleConn_QPInfo,
}

// TestExamplesDocumented needs no device: every Example function says what
// it prints, and TestExamples runs every one of them.
func TestExamplesDocumented(t *testing.T) {
	documentedExamples(t)
}

// documentedExamples returns the "Prints:" text of every example, failing t
// if an Example of example_test.go lacks one or is missing from examples.
func documentedExamples(t *testing.T) map[string]string {
	t.Helper()
	want := documentedOutputs(t, "example_test.go")
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if examples[name] == nil {
			t.Errorf("%s in example_test.go is not in the examples table of example_rdma_test.go", name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(examples)) {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: no Example function with a \"Prints:\" comment in example_test.go", name)
		}
	}
	return want
}

// iwarpPrints are the lines an example prints differently on an iWARP
// device (siw), as its comment says: no InfiniBand transport attributes
// in QPInfo, no hardware counters in sysfs.
var iwarpPrints = map[string]map[string]string{
	"ExampleConn_QPInfo": {"retry count: 3": "retry count: 0", "ACK timeout: 134.217728ms (n=15)": "ACK timeout: 0s (n=0)"},
	"ExampleReadMetrics": {"devices with hardware counters: 1": "devices with hardware counters: 0"},
}

// TestExamples runs every example for real and checks that it prints what
// its "Prints:" comment says, that it ends within a (scaled) time limit,
// and that it leaves no connection, buffer, RDMA object or goroutine behind.
func TestExamples(t *testing.T) {
	rdmatest.Require(t)
	want := documentedExamples(t)
	if t.Failed() {
		return
	}
	iwarp := rdma.OnIWARPDevice(t)
	for _, name := range slices.Sorted(maps.Keys(examples)) {
		t.Run(name, func(t *testing.T) {
			rdma.CheckLeaksAtEnd(t)
			start := time.Now()
			got := runExample(t, name, examples[name], rdmatest.Scale(10*time.Second))
			t.Logf("ran in %v", time.Since(start).Round(time.Millisecond))
			if iwarp {
				for from, to := range iwarpPrints[name] {
					want[name] = strings.Replace(want[name], from, to, 1)
				}
			}
			if strings.TrimSpace(got) != want[name] {
				t.Errorf("%s printed:\n%s\nits Prints: comment says:\n%s", name, got, want[name])
			}
		})
	}
}

// runExample runs f with os.Stdout redirected to a pipe and returns what f
// printed. An example that has not returned within timeout is a hang: the
// test binary prints every goroutine's stack and exits, as go test's own
// -timeout does (the example's goroutines cannot be stopped, and the tests
// after it would only trip over them).
func runExample(t *testing.T, name string, f func(), timeout time.Duration) string {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	copied := make(chan struct{})
	go func() {
		io.Copy(&out, r)
		r.Close()
		close(copied)
	}()
	stdout := os.Stdout
	os.Stdout = w
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		buf := make([]byte, 4<<20)
		buf = buf[:runtime.Stack(buf, true)]
		fmt.Fprintf(os.Stderr, "--- FAIL: %s: %s did not return within %v (RDMA_TEST_TIMESCALE scales it); "+
			"every goroutine:\n%s\nFAIL\n", t.Name(), name, timeout, buf)
		os.Exit(2)
	}
	os.Stdout = stdout
	w.Close()
	<-copied
	return out.String()
}

// documentedOutputs returns, by Example function of file, the text of its
// "Prints:" comment (as go test takes an "Output:" comment: the lines after
// it, without the comment markers, trimmed).
func documentedOutputs(t *testing.T, file string) map[string]string {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Recv != nil || !strings.HasPrefix(fd.Name.Name, "Example") || fd.Body == nil {
			continue
		}
		found := false
		for _, cg := range f.Comments {
			if cg.Pos() < fd.Body.Lbrace || cg.End() > fd.Body.Rbrace {
				continue
			}
			text, ok := strings.CutPrefix(cg.Text(), "Prints:\n")
			if !ok {
				continue
			}
			if found {
				t.Errorf("%s has two Prints: comments", fd.Name.Name)
			}
			found = true
			out[fd.Name.Name] = strings.TrimSpace(text)
		}
		if !found {
			t.Errorf("%s (%s) has no Prints: comment saying what it prints", fd.Name.Name, fset.Position(fd.Pos()))
		}
	}
	return out
}
