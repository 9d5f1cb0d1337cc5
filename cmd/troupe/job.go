package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/troupe-run/troupe/store"
)

func runJob(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("job", flag.ExitOnError)
	var c common
	c.register(fs, false, true)
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: troupe job [flags] <job_id>")
		fs.PrintDefaults()
	}
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("need exactly one job id")
	}
	st, closeFn, err := openStore(c)
	if err != nil {
		return err
	}
	defer closeFn()
	rec, err := st.GetJob(ctx, fs.Arg(0))
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("no job %s under key prefix %q", fs.Arg(0), c.keyPrefix)
	}
	if err != nil {
		return err
	}
	printJob(os.Stdout, rec)
	return nil
}

func runDLQ(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dlq", flag.ExitOnError)
	var c common
	c.register(fs, false, true)
	n := fs.Int64("n", 50, "entries to show, newest first")
	_ = fs.Parse(args)
	st, closeFn, err := openStore(c)
	if err != nil {
		return err
	}
	defer closeFn()
	es, err := st.ListDLQ(ctx, *n)
	if err != nil {
		return err
	}
	if len(es) == 0 {
		fmt.Println("DLQ is empty")
		return nil
	}
	fmt.Printf("%-20s %-24s %-24s %-22s %s\n", "ID", "AT", "JOB", "REASON", "MESSAGE")
	for _, e := range es {
		reason := string(e.Reason)
		if e.LastReason != "" {
			reason += " (" + string(e.LastReason) + ")"
		}
		fmt.Printf("%-20s %-24s %-24s %-22s %s\n", e.ID, e.At.Format("2006-01-02T15:04:05.000"), e.JobID, reason, e.Message)
	}
	return nil
}
