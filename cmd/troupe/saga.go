package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/troupe-run/troupe/saga"
)

// runSaga prints a workflow's saga: its compensation stack (newest first,
// the order a rollback runs in), the rollback's progress and each
// compensation's job id and state.
func runSaga(ctx context.Context, args []string) error {
	fs := newFlags("saga")
	var c common
	c.register(fs, false, true)
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: troupe saga [flags] <workflow_id>")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("need exactly one workflow id")
	}
	st, closeFn, err := openStore(c)
	if err != nil {
		return err
	}
	defer closeFn()
	rep, err := saga.Describe(ctx, st, fs.Arg(0))
	if err != nil {
		return err
	}
	if len(rep.Steps) == 0 && rep.Progress.Status == "" && !rep.Triggered {
		return fmt.Errorf("no saga for workflow %s under key prefix %q", fs.Arg(0), c.keyPrefix)
	}
	printSaga(os.Stdout, rep)
	return nil
}

// stampFormat prints milliseconds always, so the stack's times line up.
const stampFormat = "2006-01-02T15:04:05.000Z07:00"

func printSaga(w io.Writer, r *saga.Report) {
	p := r.Progress
	status := string(p.Status)
	if status == "" {
		status = "not started"
	}
	fmt.Fprintf(w, "workflow %s  rollback %s", r.WorkflowID, status)
	if r.Triggered {
		fmt.Fprint(w, "  (triggered)")
	}
	fmt.Fprintln(w)
	if !p.StartedAt.IsZero() {
		fmt.Fprintf(w, "  started %s on %s, %d run(s)", p.StartedAt.Format(stampFormat), p.Node, p.Runs)
		if !p.FinishedAt.IsZero() && p.Status != saga.StatusRunning {
			fmt.Fprintf(w, ", finished %s after %s", p.FinishedAt.Format(stampFormat), p.Duration)
		}
		fmt.Fprintln(w)
	}
	if r.LockHolder != "" {
		fmt.Fprintf(w, "  lock held by %s\n", r.LockHolder)
	}
	fmt.Fprintf(w, "stack (%d steps, newest first):\n", len(r.Steps))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  STEP JOB\tINDEX\tTOPIC\tCOMPLETED AT\tCOMPENSATION\tOUTCOME\tJOB STATE\tDETAIL")
	for _, s := range r.Steps {
		idx := "?"
		if s.Index >= 0 {
			idx = fmt.Sprint(s.Index)
		}
		outcome := string(s.Progress.Outcome)
		if outcome == "" {
			outcome = "pending"
		}
		state := string(s.CompState)
		if state == "" {
			state = "-"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.JobID, idx, s.Topic,
			s.CompletedAt.Format(stampFormat), s.CompJobID, outcome, state, s.Progress.Detail)
	}
	_ = tw.Flush()
}
