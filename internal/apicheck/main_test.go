package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"slices"
	"strings"
	"testing"
)

// The reference package of the tests: one of each kind of declaration, and
// unexported ones that must not count.
const ref = `package p

type Mode int

const (
	ModeA Mode = iota
	ModeB
)

var ErrX error

type inner struct{}

func (inner) Promoted() int { return 0 }
func (inner) hidden()       {}

type Conn struct {
	inner
	Name string
	n    int
}

func (c *Conn) Read(b []byte) (n int, err error) { return 0, nil }
func (c Conn) Value() string                     { return "" }
func (c *Conn) Writev(bs ...[]byte) error         { return nil }
func (c *Conn) close()                           {}

type Getter interface{ Get(key string) (int, bool) }

type region struct {
	Addr uint64
	key  uint32
}

func (region) Size() int { return 0 }

type Alias = region

func Dial(network, address string) (*Conn, error) { return nil, nil }
func unexported()                                 {}
`

func check(t *testing.T, src string) *types.Package {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := (&types.Config{}).Check("example.com/p", fset, []*ast.File{f}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pkg
}

func TestDescribe(t *testing.T) {
	got := describe(check(t, ref))
	want := []string{
		"const ModeA Mode = 0",
		"const ModeB Mode = 1",
		"field Alias.Addr uint64",
		"field Conn.Name string",
		"func Dial(string, string) (*Conn, error)",
		"method (*Conn) Read([]byte) (int, error)",
		"method (*Conn) Writev(...[]byte) error",
		"method (Alias) Size() int",
		"method (Conn) Promoted() int",
		"method (Conn) Value() string",
		"method Getter.Get(string) (int, bool)",
		"type Alias = region",
		"type Conn struct",
		"type Getter interface",
		"type Mode int",
		"var ErrX error",
	}
	if !slices.Equal(got, want) {
		t.Errorf("describe:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A stand-in differs only in what is not API (parameter names, unexported
// fields and methods, bodies, declaration order): no difference.
func TestSameAPI(t *testing.T) {
	stub := `package p

func Dial(string, string) (*Conn, error) { return nil, nil }

type Alias = region

type region struct {
	Addr uint64
	k    uint32
}

func (r region) Size() int { return 1 }

type Getter interface{ Get(string) (int, bool) }

type Conn struct {
	inner
	Name string
	other []byte
}

type inner struct{}

func (inner) Promoted() int { return 0 }

func (*Conn) Read([]byte) (int, error)  { return 0, nil }
func (Conn) Value() string               { return "x" }
func (*Conn) Writev(_ ...[]byte) error   { return nil }

type Mode int

const (
	ModeA Mode = 0
	ModeB Mode = 1
)

var ErrX error
`
	if d := diff(describe(check(t, ref)), describe(check(t, stub))); d != "" {
		t.Errorf("unexpected difference:\n%s", d)
	}
}

// Each change of the API shows up as the lines that differ.
func TestAPIChanges(t *testing.T) {
	want := describe(check(t, ref))
	for _, tc := range []struct {
		name, old, new string
		diff           []string
	}{
		{"method missing", "func (c *Conn) Read(b []byte) (n int, err error) { return 0, nil }", "",
			[]string{"- method (*Conn) Read([]byte) (int, error)"}},
		{"parameter type", "Read(b []byte) (n int", "Read(b []int) (n int",
			[]string{"- method (*Conn) Read([]byte) (int, error)", "+ method (*Conn) Read([]int) (int, error)"}},
		{"value to pointer receiver", "func (c Conn) Value()", "func (c *Conn) Value()",
			[]string{"- method (Conn) Value() string", "+ method (*Conn) Value() string"}},
		{"variadic", "Writev(bs ...[]byte)", "Writev(bs [][]byte)",
			[]string{"- method (*Conn) Writev(...[]byte) error", "+ method (*Conn) Writev([][]byte) error"}},
		{"promoted method", "func (inner) Promoted() int { return 0 }", "",
			[]string{"- method (Conn) Promoted() int"}},
		{"field type", "Name string", "Name []byte",
			[]string{"- field Conn.Name string", "+ field Conn.Name []byte"}},
		{"extra field", "n    int", "N    int", []string{"+ field Conn.N int"}},
		{"constant value", "ModeA Mode = iota", "ModeA Mode = iota + 1",
			[]string{"- const ModeA Mode = 0", "- const ModeB Mode = 1", "+ const ModeA Mode = 1", "+ const ModeB Mode = 2"}},
		{"alias to defined type", "type Alias = region", "type Alias region",
			[]string{"- method (Alias) Size() int", "- type Alias = region", "+ type Alias struct"}},
		{"interface method", "Get(key string) (int, bool)", "Get(key string) int",
			[]string{"- method Getter.Get(string) (int, bool)", "+ method Getter.Get(string) int"}},
		{"variable type", "var ErrX error", "var ErrX string",
			[]string{"- var ErrX error", "+ var ErrX string"}},
		{"function exported", "func unexported()", "func Exported()", []string{"+ func Exported()"}},
	} {
		src := strings.Replace(ref, tc.old, tc.new, 1)
		if src == ref {
			t.Fatalf("%s: %q not in the reference", tc.name, tc.old)
		}
		got := strings.Split(strings.TrimSpace(diff(want, describe(check(t, src)))), "\n")
		for i := range got {
			got[i] = strings.TrimSpace(got[i])
		}
		if !slices.Equal(got, tc.diff) {
			t.Errorf("%s:\n%s\nwant:\n%s", tc.name, strings.Join(got, "\n"), strings.Join(tc.diff, "\n"))
		}
	}
}
