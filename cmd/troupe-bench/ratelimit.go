package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/troupe-run/troupe/internal/bench"
)

// runRateLimit is `troupe-bench --rate-limit [flags]`: the rate limit
// bench, on limiters alone (bench.RateLimit) or, with --through-nodes,
// through node processes and workers (bench.RateNodes).
func runRateLimit(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("troupe-bench --rate-limit", flag.ContinueOnError)
	var c bench.RateLimitConfig
	nodes := fs.Bool("through-nodes", false, "run --replicas troupe nodes as child processes with the bucket in their pools file, "+
		"--workers simulated workers, and --waiting jobs labelled troupe.rate_limit kept waiting; report jobs dispatched "+
		"each second and the Redis commands of the window")
	workers := fs.Int("workers", 4, "with --through-nodes: simulated workers")
	inproc := fs.Bool("inproc", false, "with --through-nodes: run the nodes inside the bench instead of child processes")
	natsURL := fs.String("nats", envOr("TROUPE_NATS_URL", bench.NATSURLDefault), "NATS URL (env TROUPE_NATS_URL)")
	fs.StringVar(&c.RedisURL, "redis", envOr("TROUPE_REDIS_URL", bench.RedisURLDefault), "Redis URL")
	fs.IntVar(&c.Replicas, "replicas", 3, "limiters (nodes) sharing the bucket")
	fs.IntVar(&c.Rate, "limit", 100, "the bucket's tokens a second")
	fs.IntVar(&c.Burst, "burst", 0, "the bucket's burst (0: --limit, the config's default)")
	fs.IntVar(&c.Waiting, "waiting", 1000, "jobs kept waiting across the replicas")
	fs.DurationVar(&c.Duration, "duration", time.Minute, "measured window")
	fs.DurationVar(&c.Warm, "warm", 3*time.Second, "time before the window (spends the burst)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if c.Replicas < 1 || c.Rate < 1 || c.Waiting < c.Replicas {
		return usageError{fmt.Errorf("need --replicas ≥ 1, --limit ≥ 1, --waiting ≥ --replicas")}
	}
	var r fmt.Stringer
	if *nodes {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		nc := bench.RateNodesConfig{RedisURL: c.RedisURL, NATSURL: *natsURL, Nodes: c.Replicas, Workers: *workers,
			Rate: c.Rate, Waiting: c.Waiting, Duration: c.Duration, Warm: c.Warm, Node: bench.NodeChild,
			ChildCommand: []string{exe, bench.ServeArg}, Stderr: os.Stderr}
		if *inproc {
			nc.Node = bench.NodeInProcess
		}
		if c.Burst != 0 {
			return usageError{fmt.Errorf("--burst: not with --through-nodes (the pools file's default, --limit)")}
		}
		res, err := bench.RateNodes(ctx, nc)
		if err != nil {
			return err
		}
		r = res
	} else {
		res, err := bench.RateLimit(ctx, c)
		if err != nil {
			return err
		}
		r = res
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(r)
	}
	fmt.Println(r)
	return nil
}
