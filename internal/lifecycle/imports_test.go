package lifecycle

import (
	"go/build"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestCoreImportsNothing keeps the decision core a function of its inputs:
// the package and its tests import the standard library, the job states and
// the CAP types only — no store, router, bus, actor system, metrics or
// tracing (the shell, internal/jobactor, speaks to those). Files behind a
// build tag (the store conformance test, tag conformance) are left out, as
// `go list -test -deps` leaves them out.
func TestCoreImportsNothing(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := build.Default.ImportDir(wd, 0)
	if err != nil {
		t.Fatal(err)
	}
	allowed := []string{
		"github.com/troupe-run/troupe/internal/jobstate",
		"github.com/troupe-run/troupe/internal/lifecycle", // its external tests
		"github.com/troupe-run/troupe/proto/capv1",
	}
	for what, imports := range map[string][]string{"imports": pkg.Imports,
		"test imports": pkg.TestImports, "external test imports": pkg.XTestImports} {
		for _, imp := range imports {
			first, _, _ := strings.Cut(imp, "/")
			if !strings.Contains(first, ".") || slices.Contains(allowed, imp) {
				continue // the standard library has no dot in its first element
			}
			t.Errorf("the core's %s include %s: only the standard library, jobstate and capv1 are allowed", what, imp)
		}
	}
	if len(pkg.Imports) == 0 {
		t.Fatal("no imports read: the test does not see the package")
	}
}
