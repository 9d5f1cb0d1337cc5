package main

import (
	"fmt"
	"io"
	"time"

	"github.com/troupe-run/troupe/internal/store"
)

// printJob writes a job's record and history for humans.
func printJob(w io.Writer, r *store.JobRecord) {
	fmt.Fprintf(w, "job %s  topic %s  state %s", r.ID, r.Topic, r.State)
	if r.Reason != "" {
		fmt.Fprintf(w, " (%s)", r.Reason)
	}
	fmt.Fprintln(w)
	if r.Worker != "" {
		fmt.Fprintf(w, "  worker %s via %s\n", r.Worker, r.Subject)
	}
	if r.ErrorCode != "" || r.ErrorMessage != "" {
		fmt.Fprintf(w, "  error %s: %s\n", r.ErrorCode, r.ErrorMessage)
	}
	if r.ResultPtr != "" {
		fmt.Fprintf(w, "  result %s\n", r.ResultPtr)
	}
	if r.LockHolder != "" {
		fmt.Fprintf(w, "  owner %s\n", r.LockHolder)
	}
	if h := r.Fields["job_hash"]; h != "" {
		fmt.Fprintf(w, "  job hash %s\n", h)
	}
	if d := r.Fields["approval_decision"]; d != "" {
		fmt.Fprintf(w, "  %s by %s: %s\n", d, r.Fields["approval_by"], r.Fields["approval_reason"])
	}
	if by := r.Fields["cancelled_by"]; by != "" {
		fmt.Fprintf(w, "  cancelled by %s: %s\n", by, r.Fields["cancel_reason"])
	}
	if lr := r.Fields["last_reason"]; lr != "" && r.State.Terminal() {
		fmt.Fprintf(w, "  last underlying reason %s after %d attempts\n", lr, r.Attempts)
	}
	var start time.Time
	for i, h := range r.History {
		if i == 0 {
			start = h.At
		}
		from := string(h.From)
		if from == "" {
			from = "·"
		}
		fmt.Fprintf(w, "  %s  %+8.1fms  %-18s → %-18s %-24s %s\n", h.At.Format("2006-01-02T15:04:05.000Z07:00"),
			float64(h.At.Sub(start).Microseconds())/1000, from, h.To, h.Reason, h.Node)
	}
}
