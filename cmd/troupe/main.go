// Command troupe runs and operates Troupe nodes.
//
//	troupe dev                      everything in one process, no outside services
//	troupe node   [--nats URL] [--redis URL] [--pools FILE]
//	troupe worker [--nats URL] [--id ID] [--pool P] [--topics T,...] [--handler echo|sleep]
//	troupe submit [--nats URL] --topic T [--id ID] [--wait]
//	troupe job    [--redis URL] ID
//	troupe dlq    [--redis URL]
//	troupe saga   [--redis URL] WORKFLOW_ID
package main

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/troupe-run/troupe/internal/connect"
	"github.com/troupe-run/troupe/router"
)

// GCPercentDefault is the node's GOGC unless the environment sets one.
const GCPercentDefault = 200

//go:embed pools.default.yaml
var defaultPools []byte

type command struct {
	name, usage string
	run         func(ctx context.Context, args []string) error
}

var commands = []command{
	{"dev", "run a whole node embedded (NATS, Redis store, demo workers) and submit demo jobs", runDev},
	{"node", "run a node against NATS and Redis", runNode},
	{"worker", "run a demo CAP worker", runWorker},
	{"submit", "publish a job on sys.job.submit", runSubmit},
	{"job", "print a job's state and transition history", runJob},
	{"dlq", "list dead-lettered jobs and inputs", runDLQ},
	{"saga", "print a workflow's compensation stack, rollback progress and compensation jobs", runSaga},
	{"pool", "list, add or remove runtime topic → pool mappings (shared by all replicas)", runPool},
	{"safety", "serve the built-in policy engine as a CAP SafetyKernel (gRPC), or query or validate policies", runSafety},
	{"bench", "measure throughput, latency and cost per job with simulated workers (BENCHMARKS.md)", runBench},
	{"ctl", "operate a node through its admin API: job, dlq, workers, pools, trace, stats (--api URL)", runCtl},
	{"trace", "print a job's mailbox trace, in order (admin API; troupe ctl trace)", runTrace},
	{"workers", "list live workers and their pools' load (admin API; troupe ctl workers)", runWorkers},
	{"keys", "generate a P-256 key pair for packet signatures (keys gen --out DIR --sender NAME)", runKeys},
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		os.Exit(2)
	}
	// A node allocates a little per message and keeps little: collecting
	// less often trades memory for CPU (DEPENDENCY-NOTES measured GC at
	// ~4 ms per 1k jobs). GOGC in the environment still wins.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(GCPercentDefault)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	for _, c := range commands {
		if c.name == os.Args[1] {
			if err := c.run(ctx, os.Args[2:]); err != nil {
				fmt.Fprintf(os.Stderr, "troupe %s: %v\n", c.name, err)
				os.Exit(1)
			}
			return
		}
	}
	fmt.Fprintf(os.Stderr, "troupe: unknown command %q\n\n", os.Args[1])
	usage()
	os.Exit(2)
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: troupe <command> [flags]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(os.Stderr, "  %-8s %s\n", c.name, c.usage)
	}
	fmt.Fprintln(os.Stderr, "\nRun 'troupe <command> -h' for a command's flags.")
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

func loadPools(path string) (*router.PoolConfig, error) {
	if path == "" {
		return router.ParsePools(defaultPools)
	}
	return router.LoadPools(path)
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
