package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/troupe-run/troupe/internal/bench"
)

// options is a parsed command line: the run's Config and what to do with
// its result.
type options struct {
	cfg      bench.Config
	compare  bool
	out      string
	record   string
	noRecord bool
	note     string
	// cluster > 0 starts a local Redis Cluster of that many masters for
	// the run (redisServer: the redis-server command).
	cluster     int
	redisServer string
}

// parseArgs reads a command line (without the program name). A flag the
// flag package rejects is a usageError; -h is flag.ErrHelp.
func parseArgs(args []string) (*options, error) {
	fs := flag.NewFlagSet("troupe-bench", flag.ContinueOnError)
	o := &options{}
	cfg := &o.cfg
	fs.IntVar(&cfg.Jobs, "jobs", bench.JobsDefault, "jobs to submit and measure")
	fs.IntVar(&cfg.Workers, "workers", bench.WorkersDefault, "simulated CAP workers")
	fs.Float64Var(&cfg.Rate, "rate", 0, "submit rate in jobs/s (0: full speed)")
	fs.DurationVar(&cfg.Delay, "delay", 0, "how long a worker holds a job before answering (0: at once)")
	maxPar := fs.Int("max-parallel", bench.MaxParallelDefault, "max_parallel_jobs each simulated worker announces "+
		"(0: no limit; unset with --hold: no limit)")
	fs.DurationVar(&cfg.Timeout, "timeout", bench.TimeoutDefault, "give up when jobs are still not terminal this long after the first submit")
	fs.IntVar(&cfg.Warmup, "warmup", bench.WarmupDefault, "warm-up jobs before measuring (-1: none)")
	fs.DurationVar(&cfg.Heartbeat, "heartbeat", bench.HeartbeatDefault, "worker heartbeat interval")
	fs.IntVar(&cfg.SubmitWindow, "window", bench.SubmitWindowDefault, "submits awaiting their JetStream ack at full speed")
	fs.IntVar(&cfg.SubmitBatch, "submit-batch", 0, "submit in batches of this many jobs, one wait for all their acks "+
		"(Client.SubmitBatch); 1: one acked publish per job (Client.Submit); 0: the --window of async publishes")
	fs.IntVar(&cfg.Submitters, "submitters", 1, "with --submit-batch: goroutines submitting at once")
	fs.StringVar(&cfg.RedisURL, "redis", envOr("TROUPE_REDIS_URL", bench.RedisURLDefault), "Redis URL, or several addresses "+
		"separated by commas for a Redis Cluster (its seeds), as troupe node takes them (env TROUPE_REDIS_URL)")
	fs.IntVar(&o.cluster, "redis-cluster", 0, "start a local Redis Cluster of this many masters on free loopback ports "+
		"(redis-server processes in a temporary directory, stopped at exit) and run on it instead of --redis")
	fs.StringVar(&o.redisServer, "redis-server", "redis-server", "the redis-server command --redis-cluster starts")
	workerMode := fs.String("worker-mode", string(bench.WorkerDirect), "how the simulated workers take jobs: direct "+
		"(Troupe's worker: its own subject, troupe.dispatch=direct) or cap (a stock CAP SDK worker: the pool subject only)")
	fs.StringVar(&cfg.NATSURL, "nats", envOr("TROUPE_NATS_URL", bench.NATSURLDefault), "NATS URL (env TROUPE_NATS_URL)")
	node := fs.String("node", string(bench.NodeChild), "where the node runs: child (a child process: clean CPU/RSS), inproc (inside the bench), external")
	fs.IntVar(&cfg.Nodes, "nodes", 1, "Troupe nodes (replicas sharing the run's Redis keys, streams and workers), each a child process "+
		"(or inside the bench with --node inproc); the floor stays one process")
	external := fs.Bool("external", false, "same as --node external: submit to and observe a node you started with the run's prefixes (needs --run-id)")
	fs.IntVar(&cfg.NodePID, "node-pid", 0, "with --node external: the node's pid, to read its CPU and RSS from /proc")
	fs.StringVar(&cfg.RunID, "run-id", "", "run id [a-z0-9] that derives the key, subject and stream prefixes (default: random)")
	fs.StringVar(&cfg.Topic, "topic", bench.TopicDefault, "job topic")
	fs.StringVar(&cfg.Pool, "pool", bench.PoolDefault, "pool name the workers heartbeat with (the topic must map to it)")
	fs.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write the node's CPU profile over the measured window to this file (a child node also writes its allocation profile, since its start, to <file>.allocs)")
	fs.StringVar(&cfg.NodeLogLevel, "log-level", "warn", "the node's log level")
	floor := fs.Bool("floor", false, "measure the floor (the same NATS and Redis traffic with no scheduling logic) instead of Troupe")
	fs.BoolVar(&o.compare, "compare", false, "measure Troupe, then the floor, with the same parameters, and report both")
	fs.StringVar(&o.out, "out", "bench-out", "directory for the JSON results")
	fs.StringVar(&o.record, "record", "BENCHMARKS.md", "file whose runs table gets a row per run")
	fs.BoolVar(&o.noRecord, "no-record", false, "do not add a row to the runs table")
	fs.StringVar(&o.note, "note", "", "text for the row's note column")
	quiet := fs.Bool("quiet", false, "no progress bar")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the run's streams and keys for inspection")
	fs.BoolVar(&cfg.Hold, "hold", false, "workers hold every job until all --jobs are in flight, the node is sampled for --hold-for, then all are answered")
	fs.DurationVar(&cfg.HoldFor, "hold-for", bench.HoldForDefault, "with --hold: how long the in-flight state is sampled")
	fs.BoolVar(&cfg.Adopt, "adopt", false, "with the jobs in flight (implies --hold), start a second node, kill -9 the first, time the adoption")
	fs.DurationVar(&cfg.ParkAfter, "park-after", 0, "the node's park-after (0: its default; negative: never park)")
	fs.DurationVar(&cfg.CapacityGrace, "capacity-grace", 0, "the node's capacity grace: how long a job waiting for room stays unwritten (0: its default, 1m; negative: written at once)")
	fs.IntVar(&cfg.MaxAdmitting, "max-admitting", 0, "the node's MaxAdmitting: submits it holds un-acked before it pulls more (0: its default, 2000; negative: no bound)")
	fs.DurationVar(&cfg.LockTTL, "lock-ttl", 0, "the node's job lock TTL (0: its default, 60s)")
	fs.Int64Var(&cfg.NodeMemoryLimit, "node-memory-limit", 0, "the node's Go soft memory limit in bytes (what GOMEMLIMIT sets; 0: none)")
	fs.IntVar(&cfg.ConcurrencyKeys, "concurrency-keys", 0, "give the jobs this many concurrency keys, round-robin, with the node(s) "+
		"limiting each to --key-limit; the workers count per key the jobs held at once (over-fills) and the makespan is "+
		"compared with the ideal, ceil(jobs/(keys×limit))×--delay")
	fs.IntVar(&cfg.KeyLimit, "key-limit", 0, "with --concurrency-keys: each key's limit (pools file concurrency_keys: {\"*\": {limit: N}})")
	fs.StringVar(&cfg.HeapProfile, "heapprofile", "", "with --hold: write the node's heap profile at the end of the hold to this file")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usageError{err}
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	cfg.MaxParallel = maxParallelFlag(fs, *maxPar)
	cfg.Node = bench.NodeMode(*node)
	cfg.WorkerMode = bench.WorkerMode(*workerMode)
	if o.cluster < 0 {
		return nil, fmt.Errorf("--redis-cluster %d: want a number of masters ≥ 1 (0: none)", o.cluster)
	}
	if o.cluster > 0 && isSet(fs, "redis") {
		return nil, errors.New("--redis and --redis-cluster: pick one (--redis-cluster starts its own servers)")
	}
	if *external {
		cfg.Node = bench.NodeExternal
	}
	if cfg.Node == bench.NodeExternal && cfg.RunID == "" {
		return nil, fmt.Errorf("--node external needs --run-id ID, with the node started as\n  %s", bench.NodeCommand("ID"))
	}
	if *floor {
		cfg.Target = bench.TargetFloor
	}
	if *floor && o.compare {
		return nil, errors.New("--floor and --compare: pick one (--compare runs both)")
	}
	if !*quiet && bench.IsTerminal(os.Stderr) {
		cfg.Progress = os.Stderr
	}
	return o, nil
}

// isSet reports whether the command line set flag name.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// maxParallelFlag maps --max-parallel onto Config.MaxParallel: unset leaves
// the bench's default (which depends on --hold), 0 is no limit (-1 there).
func maxParallelFlag(fs *flag.FlagSet, n int) int {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "max-parallel" })
	switch {
	case !set:
		return 0
	case n <= 0:
		return -1
	}
	return n
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
