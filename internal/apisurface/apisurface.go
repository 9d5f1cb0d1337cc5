// Package apisurface measures the module's public API: it counts the
// exported identifiers of a package and lists the internal types its
// exported signatures name. scripts/exported-count.sh prints the counts;
// TestPublicSignaturesHaveNoInternalTypes keeps internal types out.
//
// The counting rule (non-test .go files of one directory, build tags
// ignored):
//
//   - every exported top-level const, var, func and type counts once;
//   - every exported method whose receiver is an exported type counts once;
//   - every exported field of an exported struct type counts once (an
//     embedded field by its type's name), and every exported method of an
//     exported interface type counts once;
//   - nothing else (unexported names, methods of unexported types, fields of
//     unexported or anonymous nested structs) counts.
package apisurface

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Package is one directory's parsed non-test files.
type Package struct {
	Dir   string
	Name  string
	Files []*ast.File
	fset  *token.FileSet
}

// Parse reads the non-test .go files of dir.
func Parse(dir string) (*Package, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	p := &Package{Dir: dir, fset: token.NewFileSet()}
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(p.fset, filepath.Join(dir, n), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		p.Name = f.Name.Name
		p.Files = append(p.Files, f)
	}
	return p, nil
}

// Count is a package's exported identifiers by kind.
type Count struct {
	Consts, Vars, Funcs, Types, Methods, Fields int
}

// Total is the sum over kinds.
func (c Count) Total() int { return c.Consts + c.Vars + c.Funcs + c.Types + c.Methods + c.Fields }

// Count applies the rule in the package comment.
func (p *Package) Count() Count {
	var c Count
	exportedTypes := map[string]bool{}
	for _, f := range p.Files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, s := range g.Specs {
				if ts := s.(*ast.TypeSpec); ts.Name.IsExported() {
					exportedTypes[ts.Name.Name] = true
				}
			}
		}
	}
	for _, f := range p.Files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					c.Funcs++
				} else if exportedTypes[recvName(d.Recv.List[0].Type)] {
					c.Methods++
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if !n.IsExported() {
								continue
							}
							if d.Tok == token.CONST {
								c.Consts++
							} else {
								c.Vars++
							}
						}
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						c.Types++
						switch t := s.Type.(type) {
						case *ast.StructType:
							for _, fl := range t.Fields.List {
								for _, n := range fieldNames(fl) {
									if ast.IsExported(n) {
										c.Fields++
									}
								}
							}
						case *ast.InterfaceType:
							for _, m := range t.Methods.List {
								for _, n := range m.Names {
									if n.IsExported() {
										c.Methods++
									}
								}
							}
						}
					}
				}
			}
		}
	}
	return c
}

func recvName(e ast.Expr) string {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.ParenExpr:
			e = t.X
		case *ast.Ident:
			return t.Name
		default:
			return ""
		}
	}
}

// fieldNames is a field's names, or an embedded field's type name.
func fieldNames(f *ast.Field) []string {
	if len(f.Names) > 0 {
		out := make([]string, len(f.Names))
		for i, n := range f.Names {
			out[i] = n.Name
		}
		return out
	}
	e := f.Type
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	switch t := e.(type) {
	case *ast.Ident:
		return []string{t.Name}
	case *ast.SelectorExpr:
		return []string{t.Sel.Name}
	}
	return nil
}

// InternalRefs lists, as "file:line: Decl names pkg.Type", every place where
// an exported declaration's visible shape (an exported func's or method's
// parameters and results, an exported type's definition — its exported
// fields, embedded fields and interface methods — and an exported var's or
// const's declared type, or its value when it has none) names a type from an import path containing
// "/internal/".
func (p *Package) InternalRefs() []string {
	var out []string
	for _, f := range p.Files {
		internal := map[string]string{} // local name → import path
		for _, im := range f.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			if !strings.Contains(path, "/internal/") {
				continue
			}
			name := filepath.Base(path)
			if im.Name != nil {
				name = im.Name.Name
			}
			internal[name] = path
		}
		if len(internal) == 0 {
			continue
		}
		report := func(decl string, n ast.Node) {
			if n == nil {
				return
			}
			ast.Inspect(n, func(n ast.Node) bool {
				if _, ok := n.(*ast.FuncLit); ok {
					return false // a function body's internals are not API
				}
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if id, ok := sel.X.(*ast.Ident); ok {
					if path, ok := internal[id.Name]; ok {
						pos := p.fset.Position(sel.Pos())
						out = append(out, fmt.Sprintf("%s:%d: %s names %s.%s (%s)",
							filepath.Base(pos.Filename), pos.Line, decl, id.Name, sel.Sel.Name, path))
					}
				}
				return true
			})
		}
		exportedRecv := func(fl *ast.FieldList) bool {
			return fl == nil || ast.IsExported(recvName(fl.List[0].Type))
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Name.IsExported() && exportedRecv(d.Recv) {
					name := d.Name.Name
					if d.Recv != nil {
						name = recvName(d.Recv.List[0].Type) + "." + name
					}
					report(name, d.Type)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								// The declared type, or the values an
								// untyped declaration takes its type from.
								report(n.Name, s.Type)
								if s.Type == nil {
									for _, v := range s.Values {
										report(n.Name, v)
									}
								}
								break
							}
						}
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						switch t := s.Type.(type) {
						case *ast.StructType:
							for _, fl := range t.Fields.List {
								for _, n := range fieldNames(fl) {
									if ast.IsExported(n) {
										report(s.Name.Name+"."+n, fl.Type)
										break
									}
								}
							}
						case *ast.InterfaceType:
							for _, m := range t.Methods.List {
								if len(m.Names) == 0 || m.Names[0].IsExported() {
									report(s.Name.Name, m.Type)
								}
							}
						default:
							report(s.Name.Name, s.Type)
						}
						if s.TypeParams != nil {
							report(s.Name.Name, s.TypeParams)
						}
					}
				}
			}
		}
	}
	sort.Strings(out)
	return out
}
