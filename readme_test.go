package rdma_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestReadmeSnippets needs no device: every Go snippet in README.md is a
// run of lines of one of the root package's example files (whose examples
// compile with the tests and run inside Soft-RoCE), so the README's code
// compiles and does what the examples check. Lines are compared trimmed,
// blank lines ignored: a snippet may drop the indentation it had in its
// function.
func TestReadmeSnippets(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	snippets := goBlocks(string(readme))
	if len(snippets) == 0 {
		t.Fatal("README.md has no Go snippet: the quick starts are missing")
	}
	files, err := filepath.Glob("example*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	sources := map[string][]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sources[f] = codeLines(string(b))
	}
	for i, snip := range snippets {
		lines := codeLines(snip)
		found := false
		for _, src := range sources {
			if containsRun(src, lines) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("README.md's Go snippet %d is not a run of lines of any of %v: copy it from an example "+
				"there (example_readme_test.go holds the quick starts), or change the example first:\n%s", i+1, files, snip)
		}
	}
}

// goBlocks returns the contents of the ```go fenced blocks of a Markdown text.
func goBlocks(md string) []string {
	var blocks []string
	var cur []string
	in := false
	for line := range strings.Lines(md) {
		trimmed := strings.TrimSpace(line)
		switch {
		case !in && trimmed == "```go":
			in, cur = true, nil
		case in && trimmed == "```":
			in = false
			blocks = append(blocks, strings.Join(cur, ""))
		case in:
			cur = append(cur, line)
		}
	}
	return blocks
}

// codeLines returns text's lines trimmed, without the blank ones.
func codeLines(text string) []string {
	var out []string
	for line := range strings.Lines(text) {
		if l := strings.TrimSpace(line); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// containsRun reports whether run occurs in lines as consecutive elements.
func containsRun(lines, run []string) bool {
	if len(run) == 0 {
		return true
	}
	for i := range lines {
		if i+len(run) > len(lines) {
			return false
		}
		if slices.Equal(lines[i:i+len(run)], run) {
			return true
		}
	}
	return false
}

// TestReadmeSnippetCheck checks the check: a snippet is found only as a run
// of consecutive lines, whatever their indentation.
func TestReadmeSnippetCheck(t *testing.T) {
	src := codeLines("func f() {\n\ta := 1\n\n\tb := 2\n\tc := 3\n}\n")
	if !containsRun(src, codeLines("a := 1\nb := 2\n")) {
		t.Error("a run of consecutive lines (a blank line between) was not found")
	}
	if containsRun(src, codeLines("a := 1\nc := 3\n")) {
		t.Error("lines that are not consecutive were taken for a run")
	}
	if got := goBlocks("text\n```go\nx := 1\n```\n```sh\nmake\n```\n"); len(got) != 1 || got[0] != "x := 1\n" {
		t.Errorf("goBlocks = %q, want the one go block", got)
	}
}
