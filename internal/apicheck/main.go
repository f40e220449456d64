// Command apicheck checks that the module's public packages export the same
// API in every build: on Linux with cgo (the RDMA implementation) and in the
// builds without it (CGO_ENABLED=0, GOOS=darwin, GOOS=windows), where
// engine_stub.go stands in for the engine. A program that compiles against
// one build must compile against the others, so nothing may drift: an
// exported declaration in a file of one build only fails `make vet` here.
//
//	go run ./internal/apicheck [-v] [-go GO] [packages]
//
// The packages (default: every non-internal, non-main package of the module)
// are compiled in each build with `go list -export`, and their export data is
// read with go/types. For each exported constant (with its value), variable,
// function, type (a struct's exported fields, an interface's methods, the
// underlying type otherwise) and method (with its receiver, value or
// pointer), one line is written with parameter names left out; the lines of
// each build must equal those of Linux with cgo. Documentation is not
// compared.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
)

// A build is a set of environment variables for the go command.
type build struct{ env []string }

func (b build) String() string { return strings.Join(b.env, " ") }

// The reference build first.
var builds = []build{
	{[]string{"GOOS=linux", "CGO_ENABLED=1"}},
	{[]string{"GOOS=linux", "CGO_ENABLED=0"}},
	{[]string{"GOOS=darwin", "CGO_ENABLED=0"}},
	{[]string{"GOOS=windows", "CGO_ENABLED=0"}},
}

func main() {
	verbose := flag.Bool("v", false, "print each package's API lines")
	flag.StringVar(&goTool, "go", "go", "the go command to compile with")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: apicheck [-v] [-go GO] [packages]")
		flag.PrintDefaults()
	}
	flag.Parse()
	pkgs := flag.Args()
	if len(pkgs) == 0 {
		var err error
		if pkgs, err = publicPackages(builds[0]); err != nil {
			fail(err)
		}
	}
	apis := make([]map[string][]string, len(builds))
	for i, b := range builds {
		var err error
		if apis[i], err = load(b, pkgs); err != nil {
			fail(fmt.Errorf("%v: %w", b, err))
		}
	}
	bad := false
	for _, pkg := range pkgs {
		ref := apis[0][pkg]
		if *verbose && len(ref) > 0 {
			fmt.Printf("%s (%v):\n\t%s\n", pkg, builds[0], strings.Join(ref, "\n\t"))
		}
		same := true
		for i, b := range builds[1:] {
			if d := diff(ref, apis[i+1][pkg]); d != "" {
				fmt.Printf("FAIL: the exported API of %s differs between %v (-) and %v (+):\n%s", pkg, builds[0], b, d)
				same = false
			}
		}
		if same {
			fmt.Printf("apicheck: %s: %d exported declarations, the same in %d builds\n", pkg, len(ref), len(builds))
		}
		bad = bad || !same
	}
	if bad {
		fmt.Println("Keep the stand-ins for builds without RDMA (engine_stub.go, files tagged !linux || !cgo) in step with the Linux build.")
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "apicheck:", err)
	os.Exit(2)
}

var goTool = "go"

// goCmd runs the go command with b's environment and returns its stdout.
func goCmd(b build, args ...string) ([]byte, error) {
	cmd := exec.Command(goTool, args...)
	cmd.Env = append(os.Environ(), b.env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out, nil
}

// publicPackages lists the module's packages that users can import and that
// export something: not internal, not commands.
func publicPackages(b build) ([]string, error) {
	out, err := goCmd(b, "list", "-f", `{{if ne .Name "main"}}{{.ImportPath}}{{end}}`, "./...")
	if err != nil {
		return nil, err
	}
	var pkgs []string
	for _, p := range strings.Fields(string(out)) {
		if !slices.Contains(strings.Split(p, "/"), "internal") {
			pkgs = append(pkgs, p)
		}
	}
	return pkgs, nil
}

// load compiles pkgs in build b and returns the API lines of each.
func load(b build, pkgs []string) (map[string][]string, error) {
	out, err := goCmd(b, append([]string{"list", "-e", "-export", "-deps", "-json=ImportPath,Export,Error"}, pkgs...)...)
	if err != nil {
		return nil, err
	}
	exports := map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath, Export string
			Error              *struct{ Err string }
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, err
		}
		if p.Error != nil {
			return nil, fmt.Errorf("%s: %s", p.ImportPath, p.Error.Err)
		}
		exports[p.ImportPath] = p.Export
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	apis := map[string][]string{}
	for _, path := range pkgs {
		pkg, err := imp.Import(path)
		if err != nil {
			return nil, err
		}
		apis[path] = describe(pkg)
	}
	return apis, nil
}

// describe returns one line per exported declaration of pkg, sorted.
func describe(pkg *types.Package) []string {
	q := types.RelativeTo(pkg)
	typ := func(t types.Type) string { return types.TypeString(t, q) }
	var lines []string
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch obj := obj.(type) {
		case *types.Const:
			lines = append(lines, fmt.Sprintf("const %s %s = %s", name, typ(obj.Type()), obj.Val().ExactString()))
		case *types.Var:
			lines = append(lines, fmt.Sprintf("var %s %s", name, typ(obj.Type())))
		case *types.Func:
			lines = append(lines, fmt.Sprintf("func %s%s", name, signature(obj.Type().(*types.Signature), q)))
		case *types.TypeName:
			lines = append(lines, describeType(obj, q)...)
		}
	}
	sort.Strings(lines)
	return lines
}

// describeType describes a named type or alias: what it is, its exported
// fields, and its exported methods (promoted ones included).
func describeType(obj *types.TypeName, q types.Qualifier) []string {
	name, t := obj.Name(), obj.Type()
	var lines []string
	if obj.IsAlias() {
		lines = append(lines, fmt.Sprintf("type %s = %s", name, types.TypeString(types.Unalias(t), q)))
	} else {
		lines = append(lines, fmt.Sprintf("type %s %s", name, kind(t.Underlying(), q)))
	}
	switch u := t.Underlying().(type) {
	case *types.Struct:
		for f := range u.Fields() {
			if f.Exported() {
				embedded := ""
				if f.Embedded() {
					embedded = " (embedded)"
				}
				lines = append(lines, fmt.Sprintf("field %s.%s %s%s", name, f.Name(), types.TypeString(f.Type(), q), embedded))
			}
		}
	case *types.Interface:
		for m := range u.Methods() {
			if m.Exported() {
				lines = append(lines, fmt.Sprintf("method %s.%s%s", name, m.Name(), signature(m.Type().(*types.Signature), q)))
			}
		}
		return lines
	}
	values := types.NewMethodSet(t)
	for sel := range types.NewMethodSet(types.NewPointer(t)).Methods() {
		m := sel.Obj()
		if !m.Exported() {
			continue
		}
		recv := "*" + name
		if values.Lookup(m.Pkg(), m.Name()) != nil {
			recv = name
		}
		lines = append(lines, fmt.Sprintf("method (%s) %s%s", recv, m.Name(), signature(m.Type().(*types.Signature), q)))
	}
	return lines
}

// kind is a type's underlying type, with a struct's or interface's members
// left to their own lines.
func kind(u types.Type, q types.Qualifier) string {
	switch u.(type) {
	case *types.Struct:
		return "struct"
	case *types.Interface:
		return "interface"
	}
	return types.TypeString(u, q)
}

// signature writes a signature's parameter and result types without their
// names, which are not part of the API.
func signature(sig *types.Signature, q types.Qualifier) string {
	list := func(t *types.Tuple, variadic bool) string {
		var parts []string
		for i := range t.Len() {
			s := types.TypeString(t.At(i).Type(), q)
			if variadic && i == t.Len()-1 {
				s = "..." + strings.TrimPrefix(s, "[]")
			}
			parts = append(parts, s)
		}
		return strings.Join(parts, ", ")
	}
	s := "(" + list(sig.Params(), sig.Variadic()) + ")"
	switch r := sig.Results(); r.Len() {
	case 0:
	case 1:
		s += " " + list(r, false)
	default:
		s += " (" + list(r, false) + ")"
	}
	return s
}

// diff lists the lines only in want (-) and only in got (+); "" when equal.
func diff(want, got []string) string {
	var b strings.Builder
	for _, l := range want {
		if !slices.Contains(got, l) {
			fmt.Fprintf(&b, "\t- %s\n", l)
		}
	}
	for _, l := range got {
		if !slices.Contains(want, l) {
			fmt.Fprintf(&b, "\t+ %s\n", l)
		}
	}
	return b.String()
}
