package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
)

// `troupe bench` runs nothing: it points to cmd/troupe-bench and exits 2.
func TestBenchPointsToItsOwnCommand(t *testing.T) {
	t.Parallel()
	r := runBin(t, cliEnv(), "bench", "--jobs", "10", "--no-record")
	if r.code != 2 || !strings.Contains(r.errOut, "cmd/troupe-bench") || r.out != "" {
		t.Fatalf("troupe bench: want exit 2 naming cmd/troupe-bench, nothing on stdout; got %s", r)
	}
}

// The bench harness is not linked into the troupe binary: no symbol of its
// package in the built binary.
func TestTroupeBinaryHasNoBenchSymbols(t *testing.T) {
	t.Parallel()
	bin := troupeBinary(t)
	out, err := exec.CommandContext(context.Background(), "go", "tool", "nm", bin).Output()
	if err != nil {
		t.Fatalf("go tool nm: %v", err)
	}
	var found []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "troupe/bench.") || strings.Contains(line, "troupe/internal/bench.") {
			found = append(found, line)
		}
	}
	if len(found) > 0 {
		t.Fatalf("%d bench symbols in the troupe binary, e.g. %s", len(found), found[0])
	}
	if !strings.Contains(string(out), "main.main") {
		t.Fatal("go tool nm listed no main.main: not the troupe binary?")
	}
}
