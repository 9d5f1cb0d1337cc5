package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/jobstate"
)

// Search, retry, bulk actions and pausing a topic, through the admin API.

// The usage of the commands this file adds.
const (
	jobsUsage = `usage: troupe ctl jobs [STATE] [filters] [--limit N] [--cursor C] [--all]
                                      jobs newest first (troupe job list is the same)
filters: --state S --topic T --tenant T --worker W --label k=v (repeatable)
         --since T --until T (created time: RFC 3339, or a duration ago: 15m, 2h) --q ID_PART
`
	bulkUsage = `usage: troupe ctl bulk cancel|retry [filters] [--limit N] [--reason R]
                    cancel or retry every job the filters select (at most 1000 a call;
                    "truncated" says there are more); filters as troupe ctl jobs
       troupe job cancel --filter [filters]    the same as bulk cancel
       troupe job retry --filter [filters]     the same as bulk retry
`
	sagasUsage = `usage: troupe ctl sagas [--limit N] [--cursor C]   workflows with compensations, newest first
`
	seriesUsage = `usage: troupe ctl series [--window 15m]   queue depth, dispatch latency and outcomes per step
`
)

// filterFlags are the job filter flags.
type filterFlags struct {
	state, topic, tenant, worker, since, until, q string
	labels                                        listFlag
}

func (f *filterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.state, "state", "", "only jobs in this state (PENDING, RUNNING, FAILED, ...)")
	fs.StringVar(&f.topic, "topic", "", "only jobs of this topic")
	fs.StringVar(&f.tenant, "tenant", "", "only this tenant's jobs (an all-tenant key)")
	fs.StringVar(&f.worker, "worker", "", "only jobs dispatched to this worker")
	fs.Var(&f.labels, "label", "only jobs with label key=value (repeatable: all of them)")
	fs.StringVar(&f.since, "since", "", "only jobs created at or after: RFC 3339, or a duration ago (15m)")
	fs.StringVar(&f.until, "until", "", "only jobs created at or before: RFC 3339, or a duration ago")
	fs.StringVar(&f.q, "q", "", "only jobs whose id contains this")
}

// filter returns the API filter; now dates the durations.
func (f *filterFlags) filter(now time.Time) (admin.JobFilter, error) {
	out := admin.JobFilter{State: strings.ToUpper(f.state), Topic: f.topic, Tenant: f.tenant, Worker: f.worker,
		Labels: f.labels, Q: f.q}
	if out.State != "" && !jobstate.State(out.State).Valid() {
		return out, fmt.Errorf("--state must be one of %v", jobstate.AllStates)
	}
	var err error
	if out.Since, err = timeArg("since", f.since, now); err != nil {
		return out, err
	}
	out.Until, err = timeArg("until", f.until, now)
	return out, err
}

func (f *filterFlags) empty() bool {
	return f.state == "" && f.topic == "" && f.tenant == "" && f.worker == "" && len(f.labels) == 0 &&
		f.since == "" && f.until == "" && f.q == ""
}

// timeArg reads a time flag: RFC 3339 as is, a duration as that long ago.
func timeArg(name, v string, now time.Time) (string, error) {
	if v == "" {
		return "", nil
	}
	if _, err := time.Parse(time.RFC3339, v); err == nil {
		return v, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return "", fmt.Errorf("--%s %q: want an RFC 3339 time or a duration ago (15m, 2h)", name, v)
	}
	return now.Add(-d).UTC().Format(time.RFC3339Nano), nil
}

// jobSearch lists jobs by filter: troupe ctl jobs, troupe job list.
func (e *ctlEnv) jobSearch(ctx context.Context, args []string) error {
	fs := e.flags("ctl jobs")
	var ff filterFlags
	ff.register(fs)
	limit := fs.Int("limit", 50, "jobs per page")
	cursor := fs.String("cursor", "", "continue after a previous page")
	all := fs.Bool("all", false, "follow every page")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if ff.state == "" && len(pos) == 1 {
		ff.state = pos[0]
	}
	f, err := ff.filter(time.Now())
	if err != nil {
		return err
	}
	c := e.client()
	var jobs []admin.JobSummary
	next := *cursor
	for page := 0; ; page++ {
		l, err := c.SearchJobs(ctx, f, *limit, next)
		if err != nil {
			return err
		}
		jobs = append(jobs, l.Jobs...)
		next = l.Next
		// A filter may return short pages: without --all, a page that
		// found nothing is followed a few times before giving up.
		if next == "" || (!*all && (len(jobs) > 0 || page >= 8)) {
			break
		}
	}
	if e.asJSON {
		return e.printJSON(admin.JobList{State: f.State, Jobs: jobs, Next: next})
	}
	if len(jobs) == 0 {
		fmt.Fprintln(e.out, "no jobs")
	} else {
		tw := e.table()
		fmt.Fprintln(tw, "JOB\tSTATE\tTOPIC\tTENANT\tREASON\tWORKER\tATTEMPTS\tCREATED")
		for _, j := range jobs {
			worker := orDash(j.Worker)
			switch {
			case j.RunAt != nil:
				worker = "(delayed to " + j.RunAt.Format(time.RFC3339) + ")" // no record until then
			case j.Unwritten:
				worker = "(unwritten)" // waiting within its capacity grace, no record yet
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", j.ID, j.State, j.Topic, j.Tenant, orDash(j.Reason),
				worker, j.Attempts, j.Created.Format("2006-01-02 15:04:05.000"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if next != "" {
		fmt.Fprintf(e.out, "more: --cursor %s\n", next)
	}
	return nil
}

// jobCancel cancels one job, or with --filter every job the filters select.
func (e *ctlEnv) jobCancel(ctx context.Context, args []string) error {
	return e.jobAction(ctx, "cancel", args)
}

// jobRetry retries one ended job, or with --filter every job selected.
func (e *ctlEnv) jobRetry(ctx context.Context, args []string) error {
	return e.jobAction(ctx, "retry", args)
}

func (e *ctlEnv) jobAction(ctx context.Context, action string, args []string) error {
	fs := e.flags("ctl job " + action)
	reason := fs.String("reason", "", "why")
	by := fs.String("by", envOr("USER", ""), "who cancels, sent with a single cancel (the server may take it from the API key instead)")
	bulk := fs.Bool("filter", false, "act on every job the filter flags select instead of one job id")
	var ff filterFlags
	ff.register(fs)
	limit := fs.Int("limit", admin.BulkLimitMax, "with --filter: at most this many jobs")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if *bulk {
		if len(pos) != 0 {
			return errors.New("--filter takes filter flags, not job ids")
		}
		return e.runBulk(ctx, action, &ff, *limit, *reason)
	}
	if err := exactly(pos, 1, "exactly one job id (or --filter with filter flags)"); err != nil {
		return err
	}
	if !ff.empty() {
		return errors.New("filter flags need --filter (a bulk action), not a job id")
	}
	c := e.client()
	if action == "retry" {
		r, err := c.RetryJob(ctx, pos[0])
		if err != nil {
			return err
		}
		if e.asJSON {
			return e.printJSON(r)
		}
		fmt.Fprintf(e.out, "job %s retried as %s\n", r.RetryOf, r.JobID)
		return nil
	}
	a, err := c.Cancel(ctx, pos[0], *reason, *by)
	if err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(a)
	}
	if a.Note == admin.CancelRecordedNote {
		// No record and waiting on no node: its submit may still be held
		// in the stream.
		fmt.Fprintf(e.out, "job %s: no record yet; %s\n", a.JobID, a.Note)
		return nil
	}
	fmt.Fprintf(e.out, "job %s: cancel requested\n", a.JobID)
	return nil
}

// bulk serves troupe ctl bulk cancel|retry [filters].
func (e *ctlEnv) bulk(ctx context.Context, args []string) error {
	fs := e.flags("ctl bulk")
	var ff filterFlags
	ff.register(fs)
	limit := fs.Int("limit", admin.BulkLimitMax, "at most this many jobs")
	reason := fs.String("reason", "", "why (recorded with each cancel)")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || (pos[0] != "cancel" && pos[0] != "retry") {
		return e.usage("bulk", errors.New("need an action: cancel or retry"))
	}
	return e.runBulk(ctx, pos[0], &ff, *limit, *reason)
}

func (e *ctlEnv) runBulk(ctx context.Context, action string, ff *filterFlags, limit int, reason string) error {
	if ff.empty() {
		return errors.New("a bulk " + action + " needs at least one filter (--state, --topic, --label, ...)")
	}
	f, err := ff.filter(time.Now())
	if err != nil {
		return err
	}
	res, err := e.client().Bulk(ctx, admin.BulkRequest{Action: action, Filter: f, Limit: limit, Reason: reason})
	if err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(res)
	}
	fmt.Fprintf(e.out, "%s: %d matched, %d done, %d failed", action, res.Matched, res.Done, len(res.Failed))
	if res.Truncated {
		fmt.Fprint(e.out, " (truncated: more jobs may match; run it again)")
	}
	fmt.Fprintln(e.out)
	for old, id := range res.Retried {
		fmt.Fprintf(e.out, "  %s retried as %s\n", old, id)
	}
	for _, f := range res.Failed {
		fmt.Fprintf(e.out, "  %s: %s\n", f.JobID, f.Error)
	}
	return nil
}

// poolPause serves troupe pool pause|resume <topic>.
func (e *ctlEnv) poolPause(ctx context.Context, c *admin.Client, pos []string) error {
	if err := exactly(pos, 2, "a topic: pool "+pos[0]+" <topic>"); err != nil {
		return err
	}
	p, err := c.PauseTopic(ctx, pos[1], pos[0] == "pause")
	if err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(p)
	}
	if p.Paused {
		fmt.Fprintf(e.out, "topic %s paused: its jobs wait SCHEDULED pool_paused on every replica\n", p.Topic)
	} else {
		fmt.Fprintf(e.out, "topic %s resumed\n", p.Topic)
	}
	return nil
}

// sagas serves troupe ctl sagas (and troupe saga list).
func (e *ctlEnv) sagas(ctx context.Context, args []string) error {
	fs := e.flags("ctl sagas")
	limit := fs.Int("limit", 20, "sagas per page (at most 200)")
	cursor := fs.String("cursor", "", "continue after a previous page")
	if _, err := e.parse(fs, args); err != nil {
		return err
	}
	l, err := e.client().Sagas(ctx, *limit, *cursor)
	if err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(l)
	}
	tw := e.table()
	fmt.Fprintln(tw, "WORKFLOW\tSTATE\tSTEPS\tUPDATED")
	for _, s := range l.Sagas {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", s.ID, s.State, s.Steps, s.UpdatedAt.Format("2006-01-02 15:04:05.000"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if l.Next != "" {
		fmt.Fprintf(e.out, "more: --cursor %s\n", l.Next)
	}
	return nil
}

// series serves troupe ctl series.
func (e *ctlEnv) series(ctx context.Context, args []string) error {
	fs := e.flags("ctl series")
	window := fs.String("window", "15m", "how far back")
	if _, err := e.parse(fs, args); err != nil {
		return err
	}
	s, err := e.client().Series(ctx, *window)
	if err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(s)
	}
	tw := e.table()
	fmt.Fprintf(tw, "TIME\tWAITING\tRUNNING\tDISPATCH_P50_MS\tDISPATCH_P95_MS\tSUCCEEDED\tFAILED\t(step %ds)\n", s.StepS)
	for _, p := range s.Points {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.1f\t%d\t%d\t\n", time.Unix(p.T, 0).Format("15:04:05"), p.Waiting, p.Running,
			p.DispatchP50, p.DispatchP95, p.Succeeded, p.Failed)
	}
	return tw.Flush()
}
