package main

import (
	"errors"
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/bench"
)

// The flags of every bench mode reach the run's Config; what is not a run
// setting (compare, out, record, note) stays with the command.
func TestFlagsReachTheRunConfig(t *testing.T) {
	o, err := parseArgs([]string{"--compare", "--jobs", "2000", "--nodes", "3", "--rate", "200", "--delay", "50ms",
		"--max-parallel", "4", "--hold", "--hold-for", "2s", "--adopt", "--lock-ttl", "5s", "--no-record",
		"--record", "x.md", "--note", "n", "--out", "o", "--quiet", "--keep", "--node", "inproc"})
	if err != nil {
		t.Fatal(err)
	}
	c := o.cfg
	if c.Jobs != 2000 || c.Nodes != 3 || c.Rate != 200 || c.Delay != 50*time.Millisecond || c.MaxParallel != 4 ||
		!c.Hold || c.HoldFor != 2*time.Second || !c.Adopt || c.LockTTL != 5*time.Second || !c.Keep ||
		c.Node != bench.NodeInProcess || c.Target != "" || c.Progress != nil {
		t.Errorf("config %+v", c)
	}
	if !o.compare || !o.noRecord || o.record != "x.md" || o.note != "n" || o.out != "o" {
		t.Errorf("options %+v", o)
	}
	// --max-parallel 0 announces no limit; unset leaves the bench's default.
	for _, tc := range []struct {
		args []string
		want int
	}{{[]string{"--max-parallel", "0"}, -1}, {nil, 0}} {
		if o, err := parseArgs(tc.args); err != nil || o.cfg.MaxParallel != tc.want {
			t.Errorf("%v: max parallel %v, %v; want %d", tc.args, o, err, tc.want)
		}
	}
	if o, err := parseArgs([]string{"--submit-batch", "1000", "--submitters", "4"}); err != nil ||
		o.cfg.SubmitBatch != 1000 || o.cfg.Submitters != 4 {
		t.Errorf("--submit-batch 1000 --submitters 4: %+v, %v", o, err)
	}
	if o, err := parseArgs([]string{"--concurrency-keys", "100", "--key-limit", "2"}); err != nil ||
		o.cfg.ConcurrencyKeys != 100 || o.cfg.KeyLimit != 2 {
		t.Errorf("--concurrency-keys 100 --key-limit 2: %+v, %v", o, err)
	}
	if o, err := parseArgs([]string{"--floor"}); err != nil || o.cfg.Target != bench.TargetFloor {
		t.Errorf("--floor: %+v, %v", o, err)
	}
	if o, err := parseArgs([]string{"--external", "--run-id", "x1"}); err != nil || o.cfg.Node != bench.NodeExternal {
		t.Errorf("--external: %+v, %v", o, err)
	}
}

// A wrong flag exits 2, -h 0, a run that cannot be made 1 with its reason.
func TestExitStatus(t *testing.T) {
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	stderr := os.Stderr
	os.Stderr = devNull // the flag package's usage text
	_, bad := parseArgs([]string{"--no-such-flag"})
	_, help := parseArgs([]string{"-h"})
	os.Stderr = stderr
	if code := exitCode(bad, devNull); code != 2 {
		t.Errorf("bad flag: exit %d, want 2 (%v)", code, bad)
	}
	if code := exitCode(help, devNull); code != 0 || !errors.Is(help, flag.ErrHelp) {
		t.Errorf("-h: exit %d, %v; want 0", code, help)
	}
	for _, args := range [][]string{{"--floor", "--compare"}, {"--external"}, {"extra"}} {
		_, err := parseArgs(args)
		if err == nil || exitCode(err, devNull) != 1 {
			t.Errorf("%v: %v, want a failure (exit 1)", args, err)
		}
	}
	if _, err := parseArgs([]string{"--external"}); err == nil || !strings.Contains(err.Error(), "troupe node --key-prefix") {
		t.Errorf("--external without --run-id: %v, want the node's command line", err)
	}
}

// --redis takes a Redis Cluster's addresses as one comma-separated list;
// --redis-cluster starts one instead (not both); --worker-mode picks the
// workers.
func TestRedisClusterFlags(t *testing.T) {
	o, err := parseArgs([]string{"--redis", "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003", "--nodes", "3",
		"--worker-mode", "cap"})
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.RedisURL != "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003" || o.cfg.Nodes != 3 ||
		o.cfg.WorkerMode != bench.WorkerCAP || o.cluster != 0 {
		t.Errorf("config %+v, cluster %d", o.cfg, o.cluster)
	}
	o, err = parseArgs([]string{"--redis-cluster", "3", "--redis-server", "/opt/redis/redis-server"})
	if err != nil || o.cluster != 3 || o.redisServer != "/opt/redis/redis-server" {
		t.Errorf("--redis-cluster 3: %+v, %v", o, err)
	}
	for _, args := range [][]string{{"--redis-cluster", "3", "--redis", "127.0.0.1:6379"}, {"--redis-cluster", "-1"}} {
		if _, err := parseArgs(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
