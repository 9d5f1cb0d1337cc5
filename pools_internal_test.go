package troupe

import (
	"reflect"
	"testing"

	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/internal/router"
)

// A parsed pools.yaml reaches the router as the router parses it, the
// overload thresholds Pool does not show included, and the router's copy
// does not share the caller's slices and maps.
func TestParsedPoolsReachTheRouterUnchanged(t *testing.T) {
	yaml := []byte("topics:\n  job.a: [gpu, cpu]\npools:\n  gpu:\n    requires: [cuda]\n    dispatch: direct\n" +
		"    overload: {active_ratio: 0.75, cpu_load: 80, gpu_utilization: 95}\n  cpu: {requires: []}\n")
	want, err := router.ParsePools(yaml)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParsePools(yaml)
	if err != nil {
		t.Fatal(err)
	}
	got := p.routing()
	if !reflect.DeepEqual(got.Topics, want.Topics) || !reflect.DeepEqual(got.Pools, want.Pools) {
		t.Fatalf("routing = %+v, want %+v", got, want)
	}
	if o := got.Pools["gpu"].Overload; o != (registry.Thresholds{ActiveRatio: 0.75, CPULoad: 80, GPUUtil: 95}) {
		t.Errorf("gpu overload = %+v", o)
	}
	p.Topics["job.a"][0] = "changed"
	p.Pools["gpu"].Requires[0] = "changed"
	if got.Topics["job.a"][0] != "gpu" || got.Pools["gpu"].Requires[0] != "cuda" {
		t.Errorf("the router's copy follows the caller's edits: %+v", got)
	}
	if _, err := ParsePools([]byte("topics: {job.a: a}\npools:\n  a: {dispatch: sideways}\n")); err == nil {
		t.Error("a bad dispatch mode parsed")
	}
}
