// Command troupe runs and operates Troupe nodes.
//
//	troupe dev                      everything in one process, no outside services
//	troupe node   [--nats URL] [--redis URL] [--pools FILE] [--retention D]
//	troupe worker [--nats URL] [--id ID] [--pool P] [--topics T,...] [--handler echo|sleep]
//	troupe submit [--topic T] [--id ID] [--wait]
//	troupe job    <job_id> | submit|list|status|approve|reject|cancel ...
//	troupe dlq    [list | retry <entry_id> | delete <entry_id>]
//	troupe pool   [list | get <topic> | map <topic> <pools> | unmap <topic>]
//	troupe saga   <workflow_id>
//	troupe version
//
// The operator commands (submit, job, dlq, pool, saga, trace, workers, ctl)
// go through a node's admin API (--api, env TROUPE_API_URL).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/connect"
)

// GCPercentDefault is the node's GOGC unless the environment sets one.
const GCPercentDefault = 200

type command struct {
	name, usage string
	run         func(ctx context.Context, args []string) error
}

var commands = []command{
	{"dev", "run a whole node embedded (NATS, Redis store, demo workers) and submit demo jobs", runDev},
	{"node", "run a node against NATS and Redis", runNode},
	{"worker", "run a demo CAP worker", runWorker},
	{"submit", "submit a job (troupe job submit); --wait waits for its end, exit 1 unless SUCCEEDED", runSubmit},
	{"job", "a job's state and history (job <id>); submit, list, status, approve, reject, cancel", runJob},
	{"dlq", "dead-lettered jobs and inputs: list, retry <entry>, delete <entry>", runDLQ},
	{"saga", "a workflow's compensation stack, rollback progress and compensation jobs (saga <workflow_id>)", runSaga},
	{"pool", "runtime topic → pool mappings, shared by all replicas: list, get, map, unmap", runPool},
	{"trace", "a job's mailbox trace, in order (trace <job_id>)", runTrace},
	{"workers", "live workers and their pools' load", runWorkers},
	{"schedule", "schedules (cron, intervals) and delayed jobs: list, get, create, pause, resume, delete, delayed", runSchedule},
	{"limits", "rate limit buckets: each one's level and its waiters", runLimits},
	{"ctl", "all of the above under one name (ctl job|dlq|pool|saga|trace|workers|stats|ready)", runCtl},
	{"safety", "serve the built-in policy engine as a CAP SafetyKernel (gRPC), or query or validate policies", runSafety},
	{"bench", "moved: the benchmark is its own command, cmd/troupe-bench (make bench)", runBench},
	{"keys", "generate a P-256 key pair for packet signatures (keys gen --out DIR --sender NAME)", runKeys},
	{"version", "the module version and VCS revision of this binary", runVersion},
}

func main() {
	// A node allocates a little per message and keeps little: collecting
	// less often trades memory for CPU (GC was measured at
	// ~4 ms per 1k jobs). GOGC in the environment still wins.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(GCPercentDefault)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// run runs one command line (without the program name) and returns the
// exit status: 0, 1 when the command fails, 2 for a usage error. Asking
// for help (-h, --help, help) is not an error: it prints the usage and
// returns 0.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	if isHelp(args[0]) {
		usage(stderr)
		return 0
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:])
		var ue usageError
		switch {
		case err == nil, errors.Is(err, flag.ErrHelp):
			return 0
		case errors.As(err, &ue):
			// The flag package has printed the error and the flags.
			return 2
		}
		fmt.Fprintf(stderr, "troupe %s: %v\n", c.name, err)
		return 1
	}
	fmt.Fprintf(stderr, "troupe: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: troupe <command> [flags]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.usage)
	}
	fmt.Fprintln(w, "\nThe operator commands (submit … ctl) call a node's admin API: --api URL or TROUPE_API_URL\n(default "+admin.URLDefault+"), --key or TROUPE_API_KEY.")
	fmt.Fprintln(w, "Run 'troupe <command> -h' for a command's subcommands, arguments and flags.")
}

// usageError is a command line the flag package rejected (and explained).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// newFlags returns a command's flag set. Its errors come back from
// parseFlags rather than exiting, so run decides the exit status.
func newFlags(name string) *flag.FlagSet { return flag.NewFlagSet(name, flag.ContinueOnError) }

// parseFlags parses a command's flags: -h is flag.ErrHelp (run exits 0
// after the flag package printed the flags), a bad flag a usageError.
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	return usageError{err}
}

// common holds the flags several commands share.
type common struct {
	// conn holds --nats, --redis and their credential and TLS flags
	// (connflags.go dials with them).
	conn                   connect.Flags
	keyPrefix, subjPrefix  string
	streamPrefix, logLevel string
	logJSON                bool
}

func (c *common) register(fs *flag.FlagSet, needNATS, needRedis bool) {
	c.conn.Register(fs, connect.Want{NATS: needNATS, Redis: needRedis})
	if needNATS {
		fs.StringVar(&c.subjPrefix, "subject-prefix", os.Getenv("TROUPE_SUBJECT_PREFIX"), "prefix before every CAP subject")
		fs.StringVar(&c.streamPrefix, "stream-prefix", envOr("TROUPE_STREAM_PREFIX", "TROUPE"), "JetStream stream name prefix")
	}
	if needRedis {
		fs.StringVar(&c.keyPrefix, "key-prefix", envOr("TROUPE_KEY_PREFIX", "troupe:"), "Redis key prefix")
	}
	fs.StringVar(&c.logLevel, "log-level", envOr("TROUPE_LOG_LEVEL", "info"), "debug, info, warn or error")
	fs.BoolVar(&c.logJSON, "log-json", false, "log JSON instead of text")
}

func (c *common) logger() *slog.Logger {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(c.logLevel)); err != nil {
		lv = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lv}
	if c.logJSON {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// durationEnv fills a duration flag from the environment variable env
// when the command line did not set it; a value that does not parse is an
// error naming the variable.
func durationEnv(fs *flag.FlagSet, name, env string, dst *time.Duration) error {
	v := os.Getenv(env)
	if v == "" {
		return nil
	}
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	if set {
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("%s=%q: %w", env, v, err)
	}
	*dst = d
	return nil
}

func loadPools(path string) (*troupe.Pools, error) {
	if path == "" {
		return troupe.DefaultPools(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pools: %w", err)
	}
	pools, err := troupe.ParsePools(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return pools, nil
}

func newID(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// labelsFlag collects repeated k=v flags.
type labelsFlag map[string]string

func (l labelsFlag) String() string { return fmt.Sprint(map[string]string(l)) }
func (l labelsFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=value, got %q", v)
	}
	l[k] = val
	return nil
}

// listFlag collects a repeated string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }
