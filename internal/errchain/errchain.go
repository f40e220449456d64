// Package errchain is a static check: an error formatted into another error
// must stay in its chain. fmt.Errorf keeps an error for errors.Is and
// errors.As only through %w; formatted with %v or %s (or passed as
// err.Error()) it becomes text, and a caller can no longer match a
// *verbs.CompletionError, a wire error or an errno inside it. make vet runs
// the command in cmd/errchain over the module.
//
// A call is reported when an argument whose type implements error is
// formatted with a verb other than %w, or an argument is a call of an
// error's Error method. Go allows several %w in one format (since 1.20), so
// the fix is always available; a deliberate exception carries the comment
// "errchain:text" on the call's line, with the reason beside it.
package errchain

import (
	"go/ast"
	"go/constant"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/passes/inspect"
	"golang.org/x/tools/go/ast/inspector"
	"golang.org/x/tools/go/types/typeutil"
)

// Analyzer reports errors formatted into fmt.Errorf without %w.
var Analyzer = &analysis.Analyzer{
	Name:     "errchain",
	Doc:      "reports errors formatted into fmt.Errorf without %w, which drops them from the error chain",
	Requires: []*analysis.Analyzer{inspect.Analyzer},
	Run:      run,
}

var errorType = types.Universe.Lookup("error").Type().Underlying().(*types.Interface)

func run(pass *analysis.Pass) (any, error) {
	ins := pass.ResultOf[inspect.Analyzer].(*inspector.Inspector)
	exempt := exemptLines(pass)
	ins.Preorder([]ast.Node{(*ast.CallExpr)(nil)}, func(n ast.Node) {
		call := n.(*ast.CallExpr)
		fn, ok := typeutil.Callee(pass.TypesInfo, call).(*types.Func)
		if !ok || fn.FullName() != "fmt.Errorf" || len(call.Args) == 0 {
			return
		}
		pos := pass.Fset.Position(call.Pos())
		if exempt[pos.Filename][pos.Line] {
			return
		}
		tv := pass.TypesInfo.Types[call.Args[0]]
		if tv.Value == nil || tv.Value.Kind() != constant.String {
			return // a format built at run time: nothing to read
		}
		verbs, ok := formatVerbs(constant.StringVal(tv.Value))
		if !ok {
			return // explicit argument indexes: not worth following
		}
		args := call.Args[1:]
		for i, arg := range args {
			if i >= len(verbs) {
				break
			}
			if verbs[i] == 'w' || verbs[i] == 'T' { // %T prints the type, not the error
				continue
			}
			if isErrorCall(pass, arg) {
				pass.Reportf(arg.Pos(), "%s formats err.Error() with %%%c: pass the error itself with %%w so errors.Is and errors.As still find it", "fmt.Errorf", verbs[i])
				continue
			}
			if t := pass.TypesInfo.TypeOf(arg); t != nil && types.Implements(t, errorType) && !isNil(pass, arg) {
				pass.Reportf(arg.Pos(), "fmt.Errorf formats an error with %%%c: use %%w so errors.Is and errors.As still find it", verbs[i])
			}
		}
	})
	return nil, nil
}

// formatVerbs returns the verb of each argument of a Printf format, in
// order; ok is false if the format uses explicit argument indexes.
func formatVerbs(format string) (verbs []rune, ok bool) {
	for i := 0; i < len(format); i++ {
		if format[i] != '%' {
			continue
		}
		i++
		// Flags, width and precision; a '*' takes an argument of its own.
		for ; i < len(format); i++ {
			c := format[i]
			if c == '[' {
				return nil, false
			}
			if c == '*' {
				verbs = append(verbs, '*')
				continue
			}
			if strings.IndexByte("+-# 0123456789.", c) < 0 {
				break
			}
		}
		if i >= len(format) {
			break
		}
		if format[i] == '%' {
			continue
		}
		verbs = append(verbs, rune(format[i]))
	}
	return verbs, true
}

// isErrorCall reports whether e is x.Error() for an x of error type.
func isErrorCall(pass *analysis.Pass, e ast.Expr) bool {
	call, ok := ast.Unparen(e).(*ast.CallExpr)
	if !ok || len(call.Args) != 0 {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Error" {
		return false
	}
	t := pass.TypesInfo.TypeOf(sel.X)
	return t != nil && types.Implements(t, errorType)
}

func isNil(pass *analysis.Pass, e ast.Expr) bool {
	tv, ok := pass.TypesInfo.Types[e]
	return ok && tv.IsNil()
}

// exemptLines returns, per file, the lines that carry an "errchain:text"
// comment.
func exemptLines(pass *analysis.Pass) map[string]map[int]bool {
	m := map[string]map[int]bool{}
	for _, f := range pass.Files {
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				if !strings.Contains(c.Text, "errchain:text") {
					continue
				}
				p := pass.Fset.Position(c.Slash)
				if m[p.Filename] == nil {
					m[p.Filename] = map[int]bool{}
				}
				m[p.Filename][p.Line] = true
			}
		}
	}
	return m
}
