package main

import (
	"context"
	"flag"
	"fmt"
	"time"
)

// `troupe ctl limits` (= `troupe limits`): each rate limit bucket's level
// and its waiters, through the admin API's /v1/limits.

const limitsUsage = `usage: troupe limits [--bucket NAME] [--limit N]   rate limit buckets: level, waiters by node, this node's waiting jobs in order
Buckets are declared in the pools file (section rate_limits); a job takes units by its meta.labels
troupe.rate_limit=<bucket> and troupe.rate_units=<n>, or by its topic's binding.
`

func runLimits(ctx context.Context, args []string) error {
	if len(args) > 0 && isHelp(args[0]) {
		fmt.Fprint(stdCtl().errOut, limitsUsage+ctlFlagsUsage+"\n")
		return nil
	}
	return stdCtl().run(ctx, append([]string{"limits"}, args...))
}

func (e *ctlEnv) limits(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("ctl limits", flag.ContinueOnError)
	e.register(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), limitsUsage, "\nflags:\n")
		fs.PrintDefaults()
	}
	bucket := fs.String("bucket", "", "one bucket only")
	limit := fs.Int("limit", 20, "waiting jobs shown per bucket")
	if _, err := e.parse(fs, args); err != nil {
		return err
	}
	l, err := e.client().Limits(ctx, *bucket, *limit)
	if err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(l)
	}
	if len(l.Buckets) == 0 {
		fmt.Fprintln(e.out, "no rate limit buckets declared")
		return nil
	}
	tw := e.table()
	fmt.Fprintln(tw, "BUCKET\tLEVEL\tLIMIT\tBURST\tWAITING UNITS (ALL NODES)\tWAITING JOBS (THIS NODE)")
	for _, b := range l.Buckets {
		units := 0
		for _, w := range b.Waiting {
			units += w.Units
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%d/%s\t%d\t%d\t%d\n", b.Name, b.Tokens, b.Limit,
			time.Duration(b.PerMS)*time.Millisecond, b.Burst, units, b.Queued)
	}
	for _, b := range l.Buckets {
		if len(b.Waiters) == 0 && len(b.Waiting) == 0 {
			continue
		}
		fmt.Fprintf(tw, "\n%s\n", b.Name)
		for _, w := range b.Waiting {
			fmt.Fprintf(tw, "  node %s\t%d units waiting\n", w.Node, w.Units)
		}
		if len(b.Waiters) > 0 {
			fmt.Fprintln(tw, "  POSITION\tJOB\tUNITS\tWAITING FOR")
		}
		for _, w := range b.Waiters {
			fmt.Fprintf(tw, "  %d\t%s\t%d\t%s\n", w.Position, w.JobID, w.Units, time.Since(w.Since).Truncate(time.Millisecond))
		}
	}
	return tw.Flush()
}
