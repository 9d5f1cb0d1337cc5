package capsnippets

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// A README snippet: a marker naming its file, then a fenced block.
var readmeSnippet = regexp.MustCompile("(?s)<!-- cap-snippet: (\\S+) -->\n```[a-z]*\n(.*?)\n```\n")

// The SDK revision a text names.
var revision = regexp.MustCompile(`cordum-io/cap at ([0-9a-f]{7,40})`)

// TestReadmeSnippetsAreTheFiles checks that each stock CAP snippet in
// README.md is, character for character, its file under
// docs/cap-snippets/ (the file scripts/check-cap-snippets.sh builds and
// runs), that every snippet file is in the README once, and that each
// names the SDK revision the README states.
func TestReadmeSnippetsAreTheFiles(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	stated := revision.FindStringSubmatch(readme)
	if stated == nil {
		t.Fatal("README names no CAP SDK revision (\"cordum-io/cap at <hash>\")")
	}
	files := map[string]bool{}
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		switch filepath.Ext(path) {
		case ".go", ".py", ".js":
			if filepath.Dir(path) != "." { // this package's own files are not snippets
				files[filepath.ToSlash(path)] = false
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("snippet files %v: want go/, python/ and node/", files)
	}
	for _, m := range readmeSnippet.FindAllStringSubmatch(readme, -1) {
		name, text := m[1], m[2]
		seen, ok := files[name]
		if !ok {
			t.Errorf("README snippet %s: no such file in docs/cap-snippets/", name)
			continue
		}
		if seen {
			t.Errorf("README has snippet %s twice", name)
		}
		files[name] = true
		want, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if got := text; got != strings.TrimRight(string(want), "\n") {
			t.Errorf("README snippet %s differs from docs/cap-snippets/%s:\n%s", name, name, firstDiff(got, string(want)))
		}
		if rev := revision.FindStringSubmatch(text); rev == nil || rev[1] != stated[1] {
			t.Errorf("snippet %s names SDK revision %v, the README states %s", name, rev, stated[1])
		}
	}
	for name, seen := range files {
		if !seen {
			t.Errorf("docs/cap-snippets/%s is not in the README (<!-- cap-snippet: %s --> before its block)", name, name)
		}
	}
}

// firstDiff shows the first line where got and want differ.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(strings.TrimRight(want, "\n"), "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + strconv.Itoa(i+1) + ":\n  README: " + gl + "\n  file:   " + wl
		}
	}
	return "(trailing text)"
}
