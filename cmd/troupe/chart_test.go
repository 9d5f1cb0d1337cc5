package main

import (
	"os"
	"reflect"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/jobactor"
)

// TestHelmChartConfig parses the Helm chart's default pools.yaml and
// timeouts.yaml (deploy/helm/troupe/values.yaml, config.pools and
// config.timeouts) as the node does: the pools are the CLI's built-in
// routing and the timeouts the node's defaults, so a default install
// behaves as `troupe node` without --pools and --timeouts.
// (deploy/helm/charttest renders and checks the chart itself.)
func TestHelmChartConfig(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/helm/troupe/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Config struct {
			Pools    yaml.Node `yaml:"pools"`
			Timeouts yaml.Node `yaml:"timeouts"`
		} `yaml:"config"`
	}
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	pools, err := yaml.Marshal(&values.Config.Pools)
	if err != nil {
		t.Fatal(err)
	}
	got, err := troupe.ParsePools(pools)
	if err != nil {
		t.Fatalf("config.pools: %v\n%s", err, pools)
	}
	if want := troupe.DefaultPools(); !reflect.DeepEqual(got, want) {
		t.Errorf("config.pools = %+v, want the built-in routing %+v", got, want)
	}
	timeouts, err := yaml.Marshal(&values.Config.Timeouts)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := jobactor.ParseTimeouts(timeouts)
	if err != nil {
		t.Fatalf("config.timeouts: %v\n%s", err, timeouts)
	}
	if want := jobactor.DefaultTimeouts(); !reflect.DeepEqual(tm, want) {
		t.Errorf("config.timeouts = %+v, want the node's defaults %+v", tm, want)
	}
}
