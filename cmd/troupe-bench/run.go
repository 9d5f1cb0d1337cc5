package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/troupe-run/troupe/internal/bench"
)

// runBench runs one bench command line (without the program name), or, as
// the child process, the node under test.
func runBench(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == bench.ServeArg {
		return bench.ServeChild(ctx, os.Stdin, os.Stdout, os.Stderr)
	}
	if len(args) > 0 && args[0] == matrixTableArg {
		return matrixTable(args[1:])
	}
	o, err := parseArgs(args)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cfg := o.cfg
	if o.cluster > 0 {
		cl, err := bench.StartLocalCluster(ctx, o.cluster, o.redisServer)
		if err != nil {
			return err
		}
		defer cl.Stop()
		cfg.RedisURL = cl.URLs()
		fmt.Fprintf(os.Stderr, "troupe-bench: Redis Cluster of %d masters on %s\n", o.cluster, cfg.RedisURL)
	}
	cfg.ChildCommand = []string{exe, bench.ServeArg}
	cfg.Stderr = os.Stderr
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if o.compare {
		return benchCompare(ctx, cfg, o)
	}
	res, runErr := bench.Run(ctx, cfg)
	if res == nil {
		return runErr
	}
	var errs []error
	if err := bench.WriteOutputs(res, o.out); err != nil {
		errs = append(errs, err)
	}
	bench.FormatReport(os.Stdout, res)
	if !o.noRecord {
		errs = append(errs, recordRows(o.record, bench.Row(res, o.note)))
	}
	return errors.Join(append([]error{runErr}, errs...)...)
}

// benchCompare runs Troupe, then the floor, and reports both.
func benchCompare(ctx context.Context, cfg bench.Config, o *options) error {
	c, runErr := bench.Compare(ctx, cfg)
	if c == nil || c.Troupe == nil {
		return runErr
	}
	path, werr := bench.WriteComparison(c, o.out)
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
	if !o.noRecord {
		rows := []string{bench.Row(c.Troupe, joinNote(o.note, fmt.Sprintf("%.1f%% of floor (next row)", c.OfFloor*100)))}
		if c.Floor != nil {
			rows = append(rows, bench.Row(c.Floor, joinNote(o.note, "floor for the row above")))
		}
		recErr = recordRows(o.record, rows...)
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

// matrixTableArg makes the command print the scale matrix's markdown table
// from the JSON results named after it (scripts/scale-matrix.sh).
const matrixTableArg = "matrix-table"

func matrixTable(paths []string) error {
	if len(paths) == 0 {
		return errors.New("matrix-table: name the cells' JSON results")
	}
	var runs []*bench.Result
	for _, p := range paths {
		r, err := bench.ReadResult(p)
		if err != nil {
			return err
		}
		runs = append(runs, r)
	}
	bench.MatrixTable(os.Stdout, runs)
	return nil
}
