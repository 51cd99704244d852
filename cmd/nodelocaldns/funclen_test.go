package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the longest a non-test function may be, from its
// signature's line to its closing brace's (the guide's rule).
const maxFuncLines = 100

// TestNoLongFunctions keeps every non-test function of cmd/, internal/
// and test/ within maxFuncLines: a longer one is split into its parts.
func TestNoLongFunctions(t *testing.T) {
	fset := token.NewFileSet()
	for _, root := range []string{"../../cmd", "../../internal", "../../test"} {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				fd, ok := decl.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				from, to := fset.Position(fd.Pos()), fset.Position(fd.End())
				if n := to.Line - from.Line + 1; n > maxFuncLines {
					t.Errorf("%s:%d: %s is %d lines (at most %d)", p, from.Line, fd.Name.Name, n, maxFuncLines)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
