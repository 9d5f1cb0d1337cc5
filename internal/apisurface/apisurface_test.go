package apisurface

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// publicDirs is every package directory of the module outside internal/ and
// cmd/ (the generated proto/capv1 included: it is public API too).
func publicDirs(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", "github.com/troupe-run/troupe/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var dirs []string
	for _, d := range strings.Fields(string(out)) {
		s := filepath.ToSlash(d)
		if strings.Contains(s, "/internal/") || strings.Contains(s, "/cmd/") {
			continue
		}
		dirs = append(dirs, d)
	}
	if len(dirs) < 4 {
		t.Fatalf("found only %d public packages: %v", len(dirs), dirs)
	}
	return dirs
}

// TestPublicSignaturesHaveNoInternalTypes fails when an exported function,
// method, field, interface method, type definition or typed var/const of a
// public package names a type from an internal/ package: an embedder could
// not name, build or convert such a value.
func TestPublicSignaturesHaveNoInternalTypes(t *testing.T) {
	for _, dir := range publicDirs(t) {
		p, err := Parse(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range p.InternalRefs() {
			t.Errorf("%s: %s", dir, r)
		}
	}
}

// TestInternalRefsFindsAnInternalType checks the scan itself on a fixture
// that names an internal type in each kind of exported declaration.
func TestInternalRefsFindsAnInternalType(t *testing.T) {
	p, err := Parse("testdata/leaky")
	if err != nil {
		t.Fatal(err)
	}
	got := p.InternalRefs()
	want := []string{"Alias", "Embeds.Store", "Fn", "Iface", "Leaky.Method", "Var", "WithField.F"}
	for _, w := range want {
		found := false
		for _, g := range got {
			if strings.Contains(g, " "+w+" names ") {
				found = true
			}
		}
		if !found {
			t.Errorf("no report for %s in %q", w, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d reports, want %d: %q", len(got), len(want), got)
	}
	if c := p.Count(); c.Total() != 12 {
		t.Errorf("count = %+v (total %d), want 12", c, c.Total())
	}
}
