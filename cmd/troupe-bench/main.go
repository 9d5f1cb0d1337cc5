// Command troupe-bench measures a Troupe node end to end: throughput,
// dispatch and submit → terminal latency, node CPU and RSS, Redis commands
// and NATS messages per job, against simulated CAP workers and real Redis
// and NATS, next to the floor (the same traffic with no scheduling logic).
// BENCHMARKS.md lists the figures and the command line of each.
//
//	troupe-bench [--compare | --floor] [--jobs N] [--workers N] [--rate R] [--nodes N] [--hold] [--adopt] ...
//
// It is a separate binary so that the harness is not linked into troupe.
// It re-runs itself (troupe-bench __serve) as the child process that hosts
// the node under test.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/troupe-run/troupe/internal/bench"
)

// gcPercent is the GOGC the bench and its child node run with unless the
// environment sets one: the same as `troupe node`'s, so the node under test
// collects as a production node does.
const gcPercent = 200

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := exitCode(runBench(ctx, os.Args[1:]), os.Stderr)
	stop()
	os.Exit(code)
}

// exitCode maps runBench's error onto the exit status: 0, 1 when the run
// fails, 2 for a usage error. Asking for help (-h) is not an error.
func exitCode(err error, stderr *os.File) int {
	var ue usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		// The flag package has printed the error and the flags.
		return 2
	}
	fmt.Fprintf(stderr, "troupe-bench: %v\n", err)
	return 1
}

// usageError is a command line the flag package rejected (and explained).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// runBench runs one bench command line (without the program name).
func runBench(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == bench.ServeArg {
		return bench.ServeChild(ctx, os.Stdin, os.Stdout, os.Stderr)
	}
	fs := flag.NewFlagSet("troupe-bench", flag.ContinueOnError)
	var cfg bench.Config
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
	fs.StringVar(&cfg.RedisURL, "redis", envOr("TROUPE_REDIS_URL", bench.RedisURLDefault), "Redis URL (env TROUPE_REDIS_URL)")
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
	compare := fs.Bool("compare", false, "measure Troupe, then the floor, with the same parameters, and report both")
	out := fs.String("out", "bench-out", "directory for the JSON results")
	record := fs.String("record", "BENCHMARKS.md", "file whose runs table gets a row per run")
	noRecord := fs.Bool("no-record", false, "do not add a row to the runs table")
	note := fs.String("note", "", "text for the row's note column")
	quiet := fs.Bool("quiet", false, "no progress bar")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the run's streams and keys for inspection")
	fs.BoolVar(&cfg.Hold, "hold", false, "workers hold every job until all --jobs are in flight, the node is sampled for --hold-for, then all are answered")
	fs.DurationVar(&cfg.HoldFor, "hold-for", bench.HoldForDefault, "with --hold: how long the in-flight state is sampled")
	fs.BoolVar(&cfg.Adopt, "adopt", false, "with the jobs in flight (implies --hold), start a second node, kill -9 the first, time the adoption")
	fs.DurationVar(&cfg.ParkAfter, "park-after", 0, "the node's park-after (0: its default; negative: never park)")
	fs.DurationVar(&cfg.CapacityGrace, "capacity-grace", 0, "the node's capacity grace: how long a job waiting for room stays unwritten (0: its default, 1m; negative: written at once)")
	fs.DurationVar(&cfg.LockTTL, "lock-ttl", 0, "the node's job lock TTL (0: its default, 60s)")
	fs.Int64Var(&cfg.NodeMemoryLimit, "node-memory-limit", 0, "the node's Go soft memory limit in bytes (what GOMEMLIMIT sets; 0: none)")
	fs.StringVar(&cfg.HeapProfile, "heapprofile", "", "with --hold: write the node's heap profile at the end of the hold to this file")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	cfg.MaxParallel = maxParallelFlag(fs, *maxPar)
	cfg.Node = bench.NodeMode(*node)
	if *external {
		cfg.Node = bench.NodeExternal
	}
	if cfg.Node == bench.NodeExternal && cfg.RunID == "" {
		return fmt.Errorf("--node external needs --run-id ID, with the node started as\n  %s", bench.NodeCommand("ID"))
	}
	if *floor {
		cfg.Target = bench.TargetFloor
	}
	if *floor && *compare {
		return errors.New("--floor and --compare: pick one (--compare runs both)")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cfg.ChildCommand = []string{exe, bench.ServeArg}
	if !*quiet && bench.IsTerminal(os.Stderr) {
		cfg.Progress = os.Stderr
	}
	cfg.Stderr = os.Stderr
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	if *compare {
		return benchCompare(ctx, cfg, *out, *record, *noRecord, *note)
	}
	res, runErr := bench.Run(ctx, cfg)
	if res == nil {
		return runErr
	}
	var errs []error
	if err := bench.WriteOutputs(res, *out); err != nil {
		errs = append(errs, err)
	}
	bench.FormatReport(os.Stdout, res)
	if !*noRecord {
		errs = append(errs, recordRows(*record, bench.Row(res, *note)))
	}
	return errors.Join(append([]error{runErr}, errs...)...)
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

func benchCompare(ctx context.Context, cfg bench.Config, out, record string, noRecord bool, note string) error {
	c, runErr := bench.Compare(ctx, cfg)
	if c == nil || c.Troupe == nil {
		return runErr
	}
	path, werr := bench.WriteComparison(c, out)
	bench.FormatReport(os.Stdout, c.Troupe)
	if c.Floor != nil {
		fmt.Println()
		bench.FormatReport(os.Stdout, c.Floor)
		troupe := "Troupe"
		if n := c.Troupe.Params.Nodes; n > 1 {
			troupe = fmt.Sprintf("Troupe on %d nodes", n)
		}
		fmt.Printf("\n%s %.0f jobs/s = %.1f%% of the floor's %.0f jobs/s (the floor in one process; same invocation, %s)\n",
			troupe, c.Troupe.JobsPerSec, c.OfFloor*100, c.Floor.JobsPerSec, path)
	}
	var recErr error
	if !noRecord {
		rows := []string{bench.Row(c.Troupe, joinNote(note, fmt.Sprintf("%.1f%% of floor (next row)", c.OfFloor*100)))}
		if c.Floor != nil {
			rows = append(rows, bench.Row(c.Floor, joinNote(note, "floor for the row above")))
		}
		recErr = recordRows(record, rows...)
	}
	return errors.Join(runErr, werr, recErr)
}

func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// recordRows adds rows to the runs table; a missing file is reported, not
// created, since the table lives in the repository's BENCHMARKS.md.
func recordRows(path string, rows ...string) error {
	if err := bench.AppendRows(path, rows...); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			fmt.Fprintf(os.Stderr, "troupe-bench: %s not found (run from the repository root, or pass --record PATH / --no-record)\n", path)
			return nil
		}
		return err
	}
	fmt.Printf("recorded in %s\n", path)
	return nil
}
