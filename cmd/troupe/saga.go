package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"text/tabwriter"

	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/saga"
)

// saga prints a workflow's saga: its compensation stack (newest first,
// the order a rollback runs in), the rollback's progress and each
// compensation's job id and state.
func (e *ctlEnv) saga(ctx context.Context, args []string) error {
	fs := e.flags("saga")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if err := exactly(pos, 1, "exactly one workflow id"); err != nil {
		return err
	}
	rep, err := e.client().Saga(ctx, pos[0])
	var ae *admin.APIError
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
		return fmt.Errorf("no saga for workflow %s (no step with a compensation recorded, or its records expired)", pos[0])
	}
	if err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(rep)
	}
	printSaga(e.out, rep)
	return nil
}

// stampFormat prints milliseconds always, so the stack's times line up.
const stampFormat = "2006-01-02T15:04:05.000Z07:00"

func printSaga(w io.Writer, r *saga.Report) {
	p := r.Progress
	if p == nil {
		p = &saga.Progress{} // no rollback has run
	}
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
