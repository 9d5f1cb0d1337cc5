// Command troupe-bench measures a Troupe node end to end: throughput,
// dispatch and submit → terminal latency, node CPU and RSS, Redis commands
// and NATS messages per job, against simulated CAP workers and real Redis
// and NATS, next to the floor (the same traffic with no scheduling logic).
// BENCHMARKS.md lists the figures and the command line of each.
//
//	troupe-bench [--compare | --floor] [--jobs N] [--workers N] [--rate R] [--nodes N] [--hold] [--adopt] ...
//	    [--redis URL | --redis host:port,host:port,... | --redis-cluster N] [--worker-mode direct|cap]
//	troupe-bench matrix-table RESULT.json...   (the scale matrix's table: scripts/scale-matrix.sh)
//	troupe-bench --rate-limit [--through-nodes] [--replicas N] [--limit R] [--waiting N] [--duration D]
//	    (a bucket shared by limiters, or by node processes with workers: ratelimit.go)
//
// It is a separate binary so that the harness is not linked into troupe.
// It re-runs itself (troupe-bench __serve) as the child process that hosts
// the node under test. main.go: the exit status; flags.go: the command
// line; run.go: a run, a comparison, and their rows in BENCHMARKS.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
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
	var err error
	if len(os.Args) > 1 && os.Args[1] == "--rate-limit" {
		err = runRateLimit(ctx, os.Args[2:])
	} else {
		err = runBench(ctx, os.Args[1:])
	}
	code := exitCode(err, os.Stderr)
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
