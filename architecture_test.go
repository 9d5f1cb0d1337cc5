package troupe_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// ARCHITECTURE.md's package picture is the output of scripts/import-graph.sh
// (go list's import graph of the module's own packages): a package that gains
// or loses an import of another fails this test until the picture says so.
func TestArchitectureShowsTheImportGraph(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH: the graph comes from go list")
	}
	out, err := exec.Command("bash", "scripts/import-graph.sh").Output()
	if err != nil {
		t.Fatalf("scripts/import-graph.sh: %v", err)
	}
	doc, err := os.ReadFile("ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- import-graph:begin -->\n```\n", "```\n<!-- import-graph:end -->"
	text := string(doc)
	i := strings.Index(text, begin)
	j := strings.Index(text, end)
	if i < 0 || j < i {
		t.Fatalf("ARCHITECTURE.md has no block between %q and %q", begin, end)
	}
	if got, want := text[i+len(begin):j], string(out); got != want {
		t.Fatalf("ARCHITECTURE.md's import graph is out of date; scripts/import-graph.sh prints:\n%s", want)
	}
}
