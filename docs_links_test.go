package rdma_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestDocsLinks needs no device: every relative link in the project's
// Markdown (README.md, docs/, the READMEs under benchmarks/ and examples/)
// names a file that exists and, with a #fragment into a Markdown file, a
// heading of that file, as GitHub makes anchors of headings.
func TestDocsLinks(t *testing.T) {
	var files []string
	for _, pat := range []string{"*.md", "docs/*.md", "*/README.md", "*/*/README.md"} {
		m, err := filepath.Glob(pat)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 10 {
		t.Fatalf("found only %d Markdown files: %v", len(files), files)
	}
	anchors := map[string]map[string]bool{}
	texts := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		texts[f] = withoutCodeBlocks(string(b))
		anchors[filepath.Clean(f)] = headingAnchors(texts[f])
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	scheme := regexp.MustCompile(`^[a-z]+:`)
	for _, f := range files {
		for _, m := range link.FindAllStringSubmatch(texts[f], -1) {
			target := m[1]
			if scheme.MatchString(target) {
				continue // https:, mailto:
			}
			path, frag, _ := strings.Cut(target, "#")
			dest := filepath.Clean(f)
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), path)
			}
			if _, err := os.Stat(dest); err != nil {
				t.Errorf("%s: link %q: %v", f, target, err)
				continue
			}
			if frag != "" && strings.HasSuffix(dest, ".md") && !anchors[dest][frag] {
				t.Errorf("%s: link %q: %s has no heading whose anchor is #%s", f, target, dest, frag)
			}
		}
	}
}

// withoutCodeBlocks blanks the fenced code blocks of a Markdown text.
func withoutCodeBlocks(md string) string {
	var b strings.Builder
	in := false
	for line := range strings.Lines(md) {
		if strings.HasPrefix(line, "```") {
			in = !in
			continue
		}
		if !in {
			b.WriteString(line)
		}
	}
	return b.String()
}

// mdHeading is a Markdown heading line; its group is the heading's text.
var mdHeading = regexp.MustCompile(`^#{1,6}\s+(.*)`)

// headingAnchors returns the anchors GitHub gives a text's headings:
// lower case, punctuation other than '-' and '_' dropped, spaces as '-',
// and a repeated anchor numbered -1, -2, ...
func headingAnchors(md string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for line := range strings.Lines(md) {
		m := mdHeading.FindStringSubmatch(strings.TrimRight(line, "\n"))
		if m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(m[1])) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n, ok := seen[a]; ok {
			seen[a] = n + 1
			a += "-" + strconv.Itoa(n+1)
		} else {
			seen[a] = 0
		}
		anchors[a] = true
	}
	return anchors
}
