package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/schedule"
)

// `troupe schedule …` (= `troupe ctl schedule …`): schedules and delayed
// jobs, through the admin API's /v1/schedules.

const scheduleUsage = `usage: troupe schedule [list]                     schedules: next tick, last fired tick
       troupe schedule get <id>
       troupe schedule create <id> (--cron EXPR | --every D) --topic T [job flags] [--missed skip|catch_up]
                              [--catch-up N] [--grace D] [--timezone TZ] [--paused]
         job flags: --tenant T --principal P --priority P --label k=v --env k=v (repeatable) --context-ptr URI
         cron: minute hour day-of-month month day-of-week (*, a-b, */s, a-b/s, lists, names) or @hourly, @daily, ...
       troupe schedule pause|resume|delete <id>
       troupe schedule delayed [--limit N]             delayed jobs not yet submitted, soonest first
       troupe schedule delayed delete <job_id>         drop one before its time
A job is delayed by its submit's label troupe.run_at (RFC 3339 or unix ms) or troupe.run_after (a duration):
       troupe job submit ... --label troupe.run_after=10m
`

func runSchedule(ctx context.Context, args []string) error {
	if len(args) > 0 && isHelp(args[0]) {
		fmt.Fprint(stdCtl().errOut, scheduleUsage+ctlFlagsUsage+"\n")
		return nil
	}
	return stdCtl().run(ctx, append([]string{"schedule"}, args...))
}

// kvFlag is a repeatable k=v flag.
type kvFlag map[string]string

func (f kvFlag) String() string { return "" }
func (f kvFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want k=v, got %q", v)
	}
	f[k] = val
	return nil
}

func (e *ctlEnv) scheduleFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	e.register(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), scheduleUsage, "\nflags:\n")
		fs.PrintDefaults()
	}
	return fs
}

func (e *ctlEnv) schedules(ctx context.Context, args []string) error {
	verb, rest := "", []string(nil)
	if len(args) > 0 {
		verb, rest = args[0], args[1:]
	}
	switch verb {
	case "", "list", "ls":
		return e.scheduleList(ctx, rest)
	case "get", "show":
		return e.scheduleOne(ctx, "get", rest)
	case "pause", "resume", "delete", "rm":
		return e.scheduleOne(ctx, verb, rest)
	case "create", "add":
		return e.scheduleCreate(ctx, rest)
	case "delayed":
		if len(rest) > 0 && (rest[0] == "delete" || rest[0] == "rm") {
			return e.delayedDelete(ctx, rest[1:])
		}
		return e.delayedList(ctx, rest)
	}
	if strings.HasPrefix(verb, "-") {
		return e.scheduleList(ctx, args)
	}
	fmt.Fprintf(e.errOut, "troupe schedule: unknown command %q\n\n%s", verb, scheduleUsage)
	return usageError{fmt.Errorf("unknown schedule command %q", verb)}
}

func (e *ctlEnv) scheduleList(ctx context.Context, args []string) error {
	fs := e.scheduleFlags("schedule list")
	if _, err := e.parse(fs, args); err != nil {
		return err
	}
	l, err := e.client().Schedules(ctx)
	if err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(l)
	}
	if len(l.Schedules) == 0 {
		fmt.Fprintln(e.out, "no schedules")
		return nil
	}
	tw := e.table()
	fmt.Fprintln(tw, "ID\tWHEN\tTOPIC\tTENANT\tMISSED\tSTATE\tNEXT TICK\tLAST JOB")
	for _, s := range l.Schedules {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, when(s), s.Topic, orDash(s.Tenant), missed(s),
			pausedOr(s), nextTick(s), lastJob(s))
	}
	return tw.Flush()
}

func when(s *schedule.Schedule) string {
	if s.Every != "" {
		return "every " + s.Every
	}
	if s.Timezone != "" {
		return s.Cron + " (" + s.Timezone + ")"
	}
	return s.Cron
}

func missed(s *schedule.Schedule) string {
	if s.Missed == schedule.MissedCatchUp {
		return fmt.Sprintf("catch_up %d", s.CatchUp)
	}
	return orDash(s.Missed)
}

func pausedOr(s *schedule.Schedule) string {
	if s.Paused {
		return "paused"
	}
	return "active"
}

func nextTick(s *schedule.Schedule) string {
	if s.NextTick == nil {
		return "-"
	}
	return s.NextTick.UTC().Format(time.RFC3339)
}

func lastJob(s *schedule.Schedule) string {
	if s.Last == nil {
		return "-"
	}
	return s.Last.JobID
}

func (e *ctlEnv) scheduleOne(ctx context.Context, verb string, args []string) error {
	fs := e.scheduleFlags("schedule " + verb)
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if err := exactly(pos, 1, "exactly one schedule id"); err != nil {
		fmt.Fprintf(e.errOut, "troupe schedule %s: %v\n\n%s", verb, err, scheduleUsage)
		return usageError{err}
	}
	c, id := e.client(), pos[0]
	var s schedule.Schedule
	switch verb {
	case "get":
		s, err = c.Schedule(ctx, id)
	case "pause", "resume":
		s, err = c.PauseSchedule(ctx, id, verb == "pause")
	default:
		if err := c.DeleteSchedule(ctx, id); err != nil {
			return err
		}
		if e.asJSON {
			return e.printJSON(admin.ScheduleAction{ID: id, Action: "deleted"})
		}
		fmt.Fprintf(e.out, "schedule %s deleted\n", id)
		return nil
	}
	if err != nil {
		return err
	}
	return e.printSchedule(&s)
}

func (e *ctlEnv) printSchedule(s *schedule.Schedule) error {
	if e.asJSON {
		return e.printJSON(s)
	}
	tw := e.table()
	fmt.Fprintf(tw, "schedule\t%s\n", s.ID)
	fmt.Fprintf(tw, "when\t%s\n", when(s))
	fmt.Fprintf(tw, "topic\t%s\n", s.Topic)
	fmt.Fprintf(tw, "tenant\t%s\n", orDash(s.Tenant))
	fmt.Fprintf(tw, "missed ticks\t%s (grace %s)\n", missed(s), s.GraceOr())
	fmt.Fprintf(tw, "state\t%s\n", pausedOr(s))
	fmt.Fprintf(tw, "next tick\t%s\n", nextTick(s))
	if s.Last != nil {
		fmt.Fprintf(tw, "last tick\t%s → %s (fired %s)\n", s.Last.Tick.Format(time.RFC3339), s.Last.JobID,
			s.Last.FiredAt.Format(time.RFC3339Nano))
	}
	fmt.Fprintf(tw, "created\t%s by %s\n", s.CreatedAt.Format(time.RFC3339), orDash(s.CreatedBy))
	return tw.Flush()
}

func (e *ctlEnv) scheduleCreate(ctx context.Context, args []string) error {
	fs := e.scheduleFlags("schedule create")
	var s schedule.Schedule
	labels, env := kvFlag{}, kvFlag{}
	fs.StringVar(&s.Cron, "cron", "", "cron expression (5 fields, or @hourly, @daily, ...)")
	fs.StringVar(&s.Every, "every", "", "interval (30s, 1h; at least 1s)")
	fs.StringVar(&s.Timezone, "timezone", "", "IANA time zone of --cron (default UTC)")
	fs.StringVar(&s.Topic, "topic", "", "the job's topic")
	fs.StringVar(&s.Tenant, "tenant", "", "the job's tenant")
	fs.StringVar(&s.Principal, "principal", "", "the job's principal")
	fs.StringVar(&s.Priority, "priority", "", "interactive, batch or critical")
	fs.StringVar(&s.ContextPtr, "context-ptr", "", "the job's context pointer (its input)")
	fs.Var(labels, "label", "the job's placement label k=v (repeatable)")
	fs.Var(env, "env", "the job's env k=v (repeatable)")
	fs.StringVar(&s.Missed, "missed", schedule.MissedSkip, "missed ticks: skip or catch_up")
	fs.IntVar(&s.CatchUp, "catch-up", 0, "with --missed catch_up: fire at most N missed ticks")
	fs.StringVar(&s.Grace, "grace", "", "how late a tick may fire before it is missed (default 1m)")
	fs.BoolVar(&s.Paused, "paused", false, "create it paused")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if err := exactly(pos, 1, "exactly one schedule id"); err != nil {
		fmt.Fprintf(e.errOut, "troupe schedule create: %v\n\n%s", err, scheduleUsage)
		return usageError{err}
	}
	s.ID = pos[0]
	if len(labels) > 0 {
		s.Labels = labels
	}
	if len(env) > 0 {
		s.Env = env
	}
	if (s.Cron == "") == (s.Every == "") {
		err := errors.New("set one of --cron and --every")
		fmt.Fprintf(e.errOut, "troupe schedule create: %v\n\n%s", err, scheduleUsage)
		return usageError{err}
	}
	got, err := e.client().CreateSchedule(ctx, s)
	if err != nil {
		return err
	}
	return e.printSchedule(&got)
}

func (e *ctlEnv) delayedList(ctx context.Context, args []string) error {
	fs := e.scheduleFlags("schedule delayed")
	limit := fs.Int("limit", 100, "delayed jobs, soonest first")
	if _, err := e.parse(fs, args); err != nil {
		return err
	}
	l, err := e.client().Delayed(ctx, *limit)
	if err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(l)
	}
	if len(l.Delayed) == 0 {
		fmt.Fprintln(e.out, "no delayed jobs")
		return nil
	}
	tw := e.table()
	fmt.Fprintln(tw, "JOB\tDUE\tTOPIC\tTENANT\tSUBMITTED")
	for _, d := range l.Delayed {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", d.JobID, d.Due.Format("2006-01-02 15:04:05.000"), d.Topic,
			orDash(d.Tenant), d.Submitted.Format("2006-01-02 15:04:05.000"))
	}
	return tw.Flush()
}

func (e *ctlEnv) delayedDelete(ctx context.Context, args []string) error {
	fs := e.scheduleFlags("schedule delayed delete")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if err := exactly(pos, 1, "exactly one job id"); err != nil {
		fmt.Fprintf(e.errOut, "troupe schedule delayed delete: %v\n\n%s", err, scheduleUsage)
		return usageError{err}
	}
	if err := e.client().DeleteDelayed(ctx, pos[0]); err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(admin.ScheduleAction{ID: pos[0], Action: "deleted"})
	}
	fmt.Fprintf(e.out, "delayed job %s deleted\n", pos[0])
	return nil
}
