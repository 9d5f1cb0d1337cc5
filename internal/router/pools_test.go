package router

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/troupe-run/troupe/internal/registry"
)

// capPools is the format existing CAP deployments use, verbatim.
const capPools = `
topics:                 # required, ≥1; value = pool name or list of pool names
  job.default: default
  job.bench: [bench, bench-b]
pools:                  # optional; only key allowed per pool: requires
  default: {requires: []}
  bench:   {requires: [docker, git]}
`

func TestParsePoolsLoadsTheCAPFormatUnchanged(t *testing.T) {
	t.Parallel()
	cfg, err := ParsePools([]byte(capPools))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg.Topics, map[string][]string{"job.default": {"default"}, "job.bench": {"bench", "bench-b"}}) {
		t.Fatalf("topics = %v", cfg.Topics)
	}
	if got := cfg.Pools["bench"]; !reflect.DeepEqual(got.Requires, []string{"docker", "git"}) || got.Dispatch != DispatchAuto {
		t.Fatalf("pool bench = %+v", got)
	}
	// A pool named only in topics exists, with no requirements.
	if _, ok := cfg.Pools["bench-b"]; !ok {
		t.Fatal("pool bench-b (only in topics) missing")
	}
	if cfg.Pools["default"].Overload != (registry.Thresholds{}) {
		t.Fatal("thresholds set without the key")
	}
}

func TestParsePoolsTroupeAdditions(t *testing.T) {
	t.Parallel()
	cfg, err := ParsePools([]byte(`
topics: {job.gpu: gpu}
pools:
  gpu:
    requires: [gpu]
    dispatch: direct
    overload: {active_ratio: 0.75, cpu_load: 80, gpu_utilization: 95}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := Pool{Requires: []string{"gpu"}, Dispatch: DispatchDirect,
		Overload: registry.Thresholds{ActiveRatio: 0.75, CPULoad: 80, GPUUtil: 95}}
	if got := cfg.Pools["gpu"]; !reflect.DeepEqual(got, want) {
		t.Fatalf("pool gpu = %+v, want %+v", got, want)
	}
}

func TestParsePoolsErrorsNameTheLine(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, yaml string
		line       int
		mention    string
	}{
		{"unknown top-level key", "topics: {job.a: a}\nversion: 2\n", 2, `"version"`},
		{"unknown pool key", "topics: {job.a: a}\npools:\n  a:\n    requires: []\n    labels: {}\n", 5, `"labels"`},
		{"bad dispatch", "topics: {job.a: a}\npools:\n  a:\n    dispatch: fast\n", 4, "fast"},
		{"threshold out of range", "topics: {job.a: a}\npools:\n  a:\n    overload:\n      cpu_load: 120\n", 5, "cpu_load"},
		{"unknown threshold", "topics: {job.a: a}\npools:\n  a:\n    overload: {memory: 3}\n", 4, "memory"},
		{"duplicate topic", "topics:\n  job.a: a\n  job.b: b\n  job.a: c\n", 4, "line 2"},
		{"topic with no pool", "topics:\n  job.a: a\n  job.b: []\n", 3, "job.b"},
		{"topic value is a mapping", "topics:\n  job.a: {pool: a}\n", 2, "job.a"},
		{"requires not a list", "topics: {job.a: a}\npools:\n  a:\n    requires: {x: 1}\n", 4, "requires"},
		{"syntax error", "topics:\n  job.a: a\n   bad: [\n", 3, ""},
		{"no topics", "pools:\n  a: {}\n", 1, "topics"},
	}
	for _, c := range cases {
		_, err := ParsePools([]byte(c.yaml))
		var pe *PoolsError
		if !errors.As(err, &pe) || !errors.Is(err, ErrInvalidPools) {
			t.Errorf("%s: err = %v, want a *PoolsError", c.name, err)
			continue
		}
		if pe.Line != c.line || !strings.Contains(err.Error(), "line ") {
			t.Errorf("%s: line %d (%v), want %d", c.name, pe.Line, err, c.line)
		}
		if !strings.Contains(err.Error(), c.mention) {
			t.Errorf("%s: %q does not mention %q", c.name, err, c.mention)
		}
	}
}

func TestLoadPoolsNamesTheFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "pools.yaml")
	if err := os.WriteFile(path, []byte("topics:\n  job.a: a\npools:\n  a: {dispatch: nope}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadPools(path)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "line 4") {
		t.Fatalf("err = %v, want the path and line 4", err)
	}
}

func TestWithMappingsRuntimeWins(t *testing.T) {
	t.Parallel()
	file, err := ParsePools([]byte(capPools))
	if err != nil {
		t.Fatal(err)
	}
	merged := file.WithMappings(map[string][]string{"job.bench": {"fast"}, "job.new": {"default"}})
	if got := merged.Topics["job.bench"]; !reflect.DeepEqual(got, []string{"fast"}) {
		t.Fatalf("job.bench = %v, want the runtime mapping", got)
	}
	if got := merged.Topics["job.default"]; !reflect.DeepEqual(got, []string{"default"}) {
		t.Fatalf("job.default = %v, want the file mapping", got)
	}
	if _, ok := merged.Pools["fast"]; !ok {
		t.Fatal("pool named only at runtime missing")
	}
	if !reflect.DeepEqual(merged.Pools["bench"].Requires, []string{"docker", "git"}) {
		t.Fatal("file pool settings lost")
	}
	if _, ok := file.Topics["job.new"]; ok {
		t.Fatal("WithMappings modified the file config")
	}
}
