package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/bus"
	"github.com/troupe-run/troupe/proto/capv1"

	"github.com/troupe-run/troupe/store"
)

func runJob(ctx context.Context, args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "approve":
			return runDecide(ctx, args[1:], store.DecisionApproved)
		case "reject":
			return runDecide(ctx, args[1:], store.DecisionRejected)
		case "cancel":
			return runCancel(ctx, args[1:])
		case "submit", "list", "status":
			// Through the admin API (troupe ctl job …).
			return runCtl(ctx, append([]string{"job"}, args...))
		}
	}
	fs := newFlags("job")
	var c common
	c.register(fs, false, true)
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: troupe job [flags] <job_id>\n       troupe job approve|reject [--reason R] [--by WHO] <job_id>\n       troupe job cancel [--reason R] <job_id>")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
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
		return fmt.Errorf("no job %s under key prefix %q (a job waiting for room within its capacity grace has no record yet: `troupe job status %s` asks the nodes)",
			fs.Arg(0), c.keyPrefix, fs.Arg(0))
	}
	if err != nil {
		return err
	}
	printJob(os.Stdout, rec)
	return nil
}

func runDLQ(ctx context.Context, args []string) error {
	fs := newFlags("dlq")
	var c common
	c.register(fs, false, true)
	n := fs.Int64("n", 50, "entries to show, newest first")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
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

// runDecide records an approval or rejection of a job in APPROVAL_REQUIRED.
func runDecide(ctx context.Context, args []string, d store.Decision) error {
	fs := newFlags("job " + string(d))
	var c common
	c.register(fs, false, true)
	reason := fs.String("reason", "", "why (recorded on the job)")
	by := fs.String("by", envOr("USER", "operator"), "who decides (recorded on the job)")
	hash := fs.String("hash", "", "the job hash you reviewed (default: the one recorded on the job)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("need exactly one job id")
	}
	st, closeFn, err := openStore(c)
	if err != nil {
		return err
	}
	defer closeFn()
	id := fs.Arg(0)
	h := *hash
	if h == "" {
		rec, err := st.GetJob(ctx, id)
		if err != nil {
			return err
		}
		h = rec.Fields["job_hash"]
	}
	if err := st.Decide(ctx, id, d, *by, *reason, h); err != nil {
		return err
	}
	fmt.Printf("job %s %s by %s (hash %.12s…); a node resumes it within a few seconds\n", id, d, *by, h)
	return nil
}

// runCancel publishes a JobCancel on sys.job.cancel.
func runCancel(ctx context.Context, args []string) error {
	fs := newFlags("job cancel")
	var c common
	c.register(fs, true, false)
	reason := fs.String("reason", "cancelled by operator", "why")
	by := fs.String("by", envOr("USER", "operator"), "who cancels")
	var sf signFlags
	sf.registerCLI(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	enc, err := sf.encoder()
	if err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("need exactly one job id")
	}
	nc, err := c.dialNATS("troupe-cli")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	id := fs.Arg(0)
	data, err := enc.Cancel(id, sf.sender, &capv1.JobCancel{JobId: id, Reason: *reason, RequestedBy: *by})
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := js.Publish(pctx, bus.NewSubjects(c.subjPrefix).Cancel, data); err != nil {
		return fmt.Errorf("publish cancel: %w", err)
	}
	fmt.Printf("cancel requested for %s\n", id)
	return nil
}
