package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
)

// The admin API's command-line client. Every operator command goes
// through it (`troupe job …` is `troupe ctl job …`, and so on), so the CLI
// needs one address, a node's admin API, and reads what the node reads;
// flags may come before, between or after the arguments. The synopses are
// in the usage texts below.
//
// Every command takes --api URL (env TROUPE_API_URL), --key KEY (env
// TROUPE_API_KEY) and --json (print the API's JSON instead of a table).

// ctlWaitPoll is how often `job submit --wait` reads the job.
const ctlWaitPoll = 200 * time.Millisecond

// WaitTimeoutDefault is how long `submit --wait` waits for a job to end
// (--timeout changes it): long enough for a slow agent step, short enough
// that a script waiting on a job nobody runs gets its answer.
const WaitTimeoutDefault = 5 * time.Minute

// ctlEnv is one ctl invocation: where its output goes and how it reaches
// the API.
type ctlEnv struct {
	out, errOut io.Writer
	api, key    string
	asJSON      bool
	// progress draws an updating line (a terminal) rather than one line per
	// change.
	progress bool
}

func (e *ctlEnv) register(fs *flag.FlagSet) {
	fs.StringVar(&e.api, "api", envOr("TROUPE_API_URL", admin.URLDefault), "admin API URL (env TROUPE_API_URL)")
	fs.StringVar(&e.key, "key", os.Getenv("TROUPE_API_KEY"), "API key (env TROUPE_API_KEY)")
	fs.BoolVar(&e.asJSON, "json", false, "print JSON instead of a table")
}

func (e *ctlEnv) client() *admin.Client { return admin.NewClient(e.api, e.key) }

// printJSON writes v as the API would.
func (e *ctlEnv) printJSON(v any) error {
	enc := json.NewEncoder(e.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (e *ctlEnv) table() *tabwriter.Writer { return tabwriter.NewWriter(e.out, 0, 4, 2, ' ', 0) }

func stdCtl() *ctlEnv {
	return &ctlEnv{out: os.Stdout, errOut: os.Stderr, progress: isTerminal(os.Stderr)}
}

// isTerminal reports whether f is a character device (a terminal), where a
// \r-updated progress line makes sense.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func runCtl(ctx context.Context, args []string) error { return stdCtl().run(ctx, args) }

func runTrace(ctx context.Context, args []string) error {
	return stdCtl().run(ctx, append([]string{"trace"}, args...))
}

func runWorkers(ctx context.Context, args []string) error {
	return stdCtl().run(ctx, append([]string{"workers"}, args...))
}

// ctlFlagsUsage ends every usage text: the flags each API command takes.
const ctlFlagsUsage = `
Flags of every command, before or after its arguments: --api URL (env TROUPE_API_URL,
default ` + admin.URLDefault + `), --key KEY (env TROUPE_API_KEY), --json (the API's JSON).`

// The usage of each command group, what -h prints.
const (
	jobUsage = `usage: troupe job <job_id>                      a job's state, history, decisions, input and result
       troupe job submit [--topic T] [--id ID] [--tenant T] [--label k=v] [--context-ptr P]
                         [--payload FILE|- | --payload-json JSON] [--env k=v]
                         [--workflow-id W [--step N] [--compensation TOPIC[:payload]]]
                         [--wait [--timeout D]] [--bus [--nats URL] [--sign-key F --sender S]]
       troupe job list [STATE] [filters] [--limit N] [--cursor C] [--all]     (troupe ctl jobs)
       troupe job status <job_id>
       troupe job approve <job_id> [--reason R] [--hash H]
       troupe job reject <job_id> [--reason R] [--hash H]
       troupe job cancel <job_id> [--reason R]  |  troupe job cancel --filter [filters] [--limit N]
       troupe job retry <job_id>                |  troupe job retry --filter [filters] [--limit N]
                                        a FAILED, TIMEOUT or CANCELLED job again, under a new id
filters: --state S --topic T --tenant T --worker W --label k=v (repeatable)
         --since T --until T (created time: RFC 3339, or a duration ago: 15m) --q ID_PART
       troupe job wait <job_id> [--timeout D]          until it ends; exit 1 unless SUCCEEDED
`
	dlqUsage = `usage: troupe dlq [list] [--limit N]     dead-lettered jobs and inputs, newest first
       troupe dlq retry <entry_id> [--force]
       troupe dlq delete <entry_id>
`
	poolUsage = `usage: troupe pool [list]                           topic → pool mappings (file and runtime) and pools
       troupe pool get <topic>
       troupe pool map <topic> <pool>[,<pool>...]    (or set) every replica within about a second
       troupe pool unmap <topic>                     (or delete) pools.yaml applies again
       troupe pool pause <topic>                     dispatch none of its jobs (they wait SCHEDULED
                                                     pool_paused) on every replica, until resume
       troupe pool resume <topic>
`
	sagaUsage = `usage: troupe saga <workflow_id>    the compensation stack (newest first), the rollback's progress
                                  and each compensation's job state (an all-tenant key)
       troupe saga list [--limit N] [--cursor C]   the workflows with compensations, newest first
`
	traceUsage = `usage: troupe trace <job_id>       every message the job's actor received, in order
`
	workersUsage = `usage: troupe workers              live workers and their pools' load
`
	statsUsage = `usage: troupe ctl stats            jobs per state and the node's counters
       troupe ctl ready            the node's readiness (exit 1 when not ready)
`
)

const ctlUsage = `usage: troupe ctl <command> [arguments] [flags]

  job <job_id> | submit|status|list|approve|reject|cancel|retry   jobs
  jobs [filters]                                           search jobs (state, topic, label, time, ...)
  bulk cancel|retry [filters]                              act on every job a filter selects
  dlq list|retry|delete                                    the dead-letter queue
  workers                                                  live workers and pool load
  keys                                                     concurrency keys: slots held, lingering, waiting
  pool list|get|map|unmap|pause|resume                     topic → pool mappings, pausing a topic
  saga <workflow_id> | list, sagas                         a workflow's compensations, the workflows
  schedule list|get|create|pause|resume|delete|delayed     schedules (cron, intervals) and delayed jobs
  limits [--bucket NAME]                                   rate limit buckets: level, waiters
  trace <job_id>                                           a job's mailbox trace
  stats | ready | series                                   node counters, readiness, chart series

The same commands without "ctl": troupe job, dlq, workers, pool, saga, trace.
` + ctlFlagsUsage

// helpFor returns the usage of a command group and whether args asks for
// it (no arguments where some are needed, or -h as the first).
func helpFor(group string) string {
	switch group {
	case "job":
		return jobUsage
	case "dlq":
		return dlqUsage
	case "pool", "pools":
		return poolUsage
	case "saga":
		return sagaUsage
	case "trace":
		return traceUsage
	case "workers":
		return workersUsage
	case "stats", "ready":
		return statsUsage
	case "jobs":
		return jobsUsage
	case "bulk":
		return bulkUsage
	case "sagas":
		return sagasUsage
	case "series":
		return seriesUsage
	}
	return ctlUsage + "\n"
}

func (e *ctlEnv) run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return e.usage("ctl", errors.New("missing command"))
	}
	group := args[0]
	verb, rest := "", []string(nil)
	if len(args) > 1 {
		verb, rest = args[1], args[2:]
	}
	if isHelp(verb) && group != "trace" && group != "workers" && group != "saga" {
		// `troupe job -h` lists the subcommands; a subcommand's -h its flags.
		fmt.Fprint(e.errOut, helpFor(group)+ctlFlagsUsage+"\n")
		return nil
	}
	switch group {
	case "job":
		switch verb {
		case "":
			return e.usage("job", errors.New("need a job id or a job command"))
		case "submit":
			return e.jobSubmit(ctx, rest)
		case "status", "get", "show":
			return e.jobStatus(ctx, rest)
		case "list", "ls":
			return e.jobSearch(ctx, rest)
		case "retry":
			return e.jobRetry(ctx, rest)
		case "approve", "reject":
			return e.jobDecide(ctx, verb, rest)
		case "cancel":
			return e.jobCancel(ctx, rest)
		case "wait":
			return e.jobWait(ctx, rest)
		}
		// `troupe job <job_id>`: any other word is a job id.
		return e.jobStatus(ctx, args[1:])
	case "dlq":
		switch verb {
		case "list", "ls":
			return e.dlqList(ctx, rest)
		case "retry":
			return e.dlqRetry(ctx, rest)
		case "delete", "rm":
			return e.dlqDelete(ctx, rest)
		}
		if verb == "" || strings.HasPrefix(verb, "-") {
			return e.dlqList(ctx, args[1:])
		}
		return e.usage("dlq", fmt.Errorf("unknown dlq command %q (list, retry, delete)", verb))
	case "workers":
		return e.workers(ctx, args[1:])
	case "keys":
		return e.keys(ctx, args[1:]) // keys_cli.go
	case "jobs":
		return e.jobSearch(ctx, args[1:])
	case "bulk":
		return e.bulk(ctx, args[1:])
	case "sagas":
		return e.sagas(ctx, args[1:])
	case "series":
		return e.series(ctx, args[1:])
	case "pools", "pool":
		return e.pools(ctx, args[1:])
	case "saga":
		if verb == "list" || verb == "ls" {
			return e.sagas(ctx, rest)
		}
		return e.saga(ctx, args[1:])
	case "trace":
		return e.trace(ctx, args[1:])
	case "schedule", "schedules":
		return e.schedules(ctx, args[1:]) // schedule.go
	case "limits", "limit":
		return e.limits(ctx, args[1:]) // limits.go
	case "stats":
		return e.stats(ctx, args[1:])
	case "ready":
		return e.ready(ctx, args[1:])
	case "-h", "--help", "-help", "help":
		fmt.Fprintln(e.errOut, ctlUsage)
		return nil
	}
	return e.usage("ctl", fmt.Errorf("unknown command %q", group))
}

// parse parses flags that may come before, between or after the positional
// arguments (`trace <id> --json` as well as `trace --json <id>`), and
// returns the positionals.
func (e *ctlEnv) parse(fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(e.errOut)
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// flags returns a command's flag set, whose -h prints the usage of its
// group (name is "ctl <group> [verb]" or "<group> [verb]") and the flags.
func (e *ctlEnv) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	e.register(fs)
	group := strings.Fields(strings.TrimPrefix(name, "ctl "))[0]
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), helpFor(group), "\nflags:\n")
		fs.PrintDefaults()
	}
	return fs
}

// usage prints a group's usage and returns err as a usage error (exit 2).
func (e *ctlEnv) usage(group string, err error) error {
	fmt.Fprintf(e.errOut, "troupe %s: %v\n\n%s", group, err, helpFor(group))
	return usageError{err}
}

func exactly(pos []string, n int, what string) error {
	if len(pos) != n {
		return fmt.Errorf("need %s", what)
	}
	return nil
}

// --- jobs -------------------------------------------------------------------

func (e *ctlEnv) jobSubmit(ctx context.Context, args []string) error {
	fs := e.flags("job submit")
	topic := fs.String("topic", "job.echo", "job topic")
	id := fs.String("id", "", "job id (default: assigned by the server; with --bus job-<random>)")
	tenant := fs.String("tenant", "", "tenant id (a tenant key submits for its own tenant)")
	ctxPtr := fs.String("context-ptr", "", "context pointer")
	wait := fs.Bool("wait", false, "wait until the job is terminal, showing its progress; exit 1 unless it SUCCEEDED")
	timeout := fs.Duration("timeout", WaitTimeoutDefault, "how long --wait waits")
	labels := labelsFlag{}
	fs.Var(labels, "label", "job label key=value (repeatable)")
	onBus := fs.Bool("bus", false, "publish the JobRequest on sys.job.submit as a CAP client does (--nats, --sign-key; a payload is written to --redis), not through the API; --wait still asks the API")
	var data jobDataFlags // payload.go
	data.register(fs)
	var bc common
	bc.register(fs, true, true) // Redis: where --bus stores a payload
	var sf signFlags
	sf.registerCLI(fs)
	if _, err := e.parse(fs, args); err != nil {
		return err
	}
	req := &capv1.JobRequest{JobId: *id, Topic: *topic, TenantId: *tenant, ContextPtr: *ctxPtr, Labels: labels}
	input, comp, err := data.apply(req)
	if err != nil {
		return e.usage("job", err)
	}
	var sub admin.Submitted
	if *onBus {
		if req.JobId == "" {
			req.JobId = newID("job-")
		}
		if err := storeOnBus(ctx, &bc, req, input, comp); err != nil {
			return err
		}
		if sub, err = submitOnBus(ctx, &bc, &sf, req); err != nil {
			return err
		}
	} else {
		if sf.signKey != "" {
			return errors.New("--sign-key signs what the CLI publishes itself: use it with --bus (through the API the node signs)")
		}
		if input == nil && comp == nil {
			sub, err = e.client().Submit(ctx, req)
		} else {
			sub, err = e.client().SubmitWithData(ctx, req, input, comp)
		}
		if err != nil {
			return err
		}
	}
	if !*wait {
		if e.asJSON {
			return e.printJSON(sub)
		}
		note := ""
		if sub.Duplicate {
			note = fmt.Sprintf(" (a job with this id exists: %s; the submit is absorbed)", sub.State)
		}
		fmt.Fprintf(e.out, "submitted %s (tenant %s)%s\n", sub.JobID, orDash(sub.Tenant), note)
		return nil
	}
	return e.waitAndPrint(ctx, sub.JobID, *timeout)
}

// jobWait waits for a job submitted earlier, as submit --wait does.
func (e *ctlEnv) jobWait(ctx context.Context, args []string) error {
	fs := e.flags("job wait")
	timeout := fs.Duration("timeout", WaitTimeoutDefault, "how long to wait")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if err := exactly(pos, 1, "exactly one job id"); err != nil {
		return err
	}
	return e.waitAndPrint(ctx, pos[0], *timeout)
}

// waitAndPrint waits for a job to end and prints it; a job that does not
// end SUCCEEDED is an error, so the command exits 1.
func (e *ctlEnv) waitAndPrint(ctx context.Context, id string, timeout time.Duration) error {
	c := e.client()
	j, err := e.waitJob(ctx, c, id, timeout)
	if err != nil {
		return err
	}
	d := jobDataOf(ctx, c, j.ID) // payload.go
	if e.asJSON {
		if err := e.printJSON(jobWithData{Job: j, Data: d}); err != nil {
			return err
		}
	} else {
		printAPIJob(e.out, j)
		printJobData(e.out, d)
	}
	if j.State != string(jobstate.StateSucceeded) {
		return fmt.Errorf("job %s ended %s", j.ID, j.State)
	}
	return nil
}

// waitJob polls a job until it is terminal, drawing its path so far: one
// updating line on a terminal, one line per state change otherwise.
func (e *ctlEnv) waitJob(ctx context.Context, c *admin.Client, id string, timeout time.Duration) (admin.Job, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	spin := []rune(`|/-\`)
	lastPath := ""
	defer func() {
		if e.progress {
			fmt.Fprintln(e.errOut)
		}
	}()
	for i := 0; ; i++ {
		j, err := c.Job(ctx, id)
		var ae *admin.APIError
		switch {
		case err == nil:
		case errors.As(err, &ae) && ae.Status == 404:
			// Not recorded yet: the node has not taken the submit.
			j = admin.Job{ID: id}
		default:
			return admin.Job{}, err
		}
		path := jobPath(j)
		elapsed := time.Since(start).Truncate(100 * time.Millisecond)
		if e.progress {
			fmt.Fprintf(e.errOut, "\r%c %6s  %s\033[K", spin[i%len(spin)], elapsed, path)
		} else if path != lastPath {
			fmt.Fprintf(e.errOut, "%6s  %s\n", elapsed, path)
		}
		lastPath = path
		if jobstate.State(j.State).Terminal() {
			return j, nil
		}
		select {
		case <-ctx.Done():
			return j, fmt.Errorf("job %s still %s after %s", id, orDash(j.State), timeout)
		case <-time.After(ctlWaitPoll):
		}
	}
}

// jobPath is a job's states so far, "PENDING → SCHEDULED → …".
func jobPath(j admin.Job) string {
	if len(j.History) == 0 {
		return "waiting for a node to take the job"
	}
	parts := make([]string, 0, len(j.History))
	for _, h := range j.History {
		parts = append(parts, h.To)
	}
	s := strings.Join(parts, " → ")
	if last := j.History[len(j.History)-1]; last.Reason != "" {
		s += " (" + last.Reason + ")"
	}
	return s
}

func (e *ctlEnv) jobStatus(ctx context.Context, args []string) error {
	fs := e.flags("ctl job status")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if err := exactly(pos, 1, "exactly one job id"); err != nil {
		return err
	}
	c := e.client()
	j, err := c.Job(ctx, pos[0])
	if err != nil {
		return err
	}
	d := jobDataOf(ctx, c, j.ID) // payload.go
	if e.asJSON {
		return e.printJSON(jobWithData{Job: j, Data: d})
	}
	printAPIJob(e.out, j)
	printJobData(e.out, d)
	return nil
}

// printAPIJob prints a job as `troupe job` does, plus what only the API
// knows (decisions, retry links).
func printAPIJob(w io.Writer, j admin.Job) {
	rec := &store.JobRecord{ID: j.ID, State: jobstate.State(j.State), Topic: j.Topic, Tenant: j.Tenant, TraceID: j.TraceID,
		Node: j.Node, Worker: j.Worker, Subject: j.Subject, Reason: jobstate.Reason(j.Reason), ResultPtr: j.ResultPtr,
		ErrorCode: j.ErrorCode, ErrorMessage: j.ErrorMessage, Fence: j.Fence, Attempts: j.Attempts,
		Created: j.Created, Updated: j.Updated, LockHolder: j.Owner, Fields: j.Fields}
	for _, h := range j.History {
		rec.History = append(rec.History, store.HistoryEntry{At: h.At, From: jobstate.State(h.From), To: jobstate.State(h.To),
			Reason: jobstate.Reason(h.Reason), Node: h.Node})
	}
	printJob(w, rec)
	fmt.Fprintf(w, "  tenant %s\n", orDash(j.Tenant))
	if j.QueuePosition != nil {
		fmt.Fprintf(w, "  waiting for capacity: %d jobs ahead in the queue\n", *j.QueuePosition)
	}
	switch {
	case j.RunAt != nil:
		fmt.Fprintf(w, "  delayed: submitted at %s (in %s); no record until then; cancel removes it\n",
			j.RunAt.Format(time.RFC3339Nano), time.Until(*j.RunAt).Round(time.Second))
	case j.Unwritten:
		fmt.Fprintf(w, "  no record yet: waiting within its capacity grace in node %s's memory since %s, its submit held in the stream\n",
			orDash(j.Node), j.Created.Format(time.RFC3339))
	}
	for _, d := range j.Decisions {
		if d.Kind == "policy" {
			fmt.Fprintf(w, "  policy: %s (rule %s) %s\n", orDash(d.Decision), orDash(d.RuleID), d.Reason)
		}
	}
	if j.RetryOf != "" {
		fmt.Fprintf(w, "  retry of %s (DLQ entry %s)\n", j.RetryOf, j.DLQEntry)
	}
	if len(j.Retries) > 0 {
		fmt.Fprintf(w, "  retried as %s\n", strings.Join(j.Retries, ", "))
	}
	printAttempts(w, j.AttemptList)
}

// printAttempts lists a job's dispatches (the API's attempt_list): the
// worker, when, and how each ended; the record keeps only the last one's
// worker and error.
func printAttempts(w io.Writer, list []admin.Attempt) {
	for _, a := range list {
		end := "still running"
		if a.EndedAt != nil {
			end = fmt.Sprintf("ended %s %s %s", a.EndedAt.Format(timeOfDay), orDash(a.State), a.Reason)
		}
		fmt.Fprintf(w, "  attempt %d: worker %s, dispatched %s, %s", a.N, orDash(a.Worker),
			a.DispatchedAt.Format(timeOfDay), strings.TrimSpace(end))
		if a.Error != "" {
			fmt.Fprintf(w, ": %s", a.Error)
		}
		fmt.Fprintln(w)
	}
}

// timeOfDay is how attempts print their times.
const timeOfDay = "15:04:05.000"

func (e *ctlEnv) jobDecide(ctx context.Context, verb string, args []string) error {
	fs := e.flags("ctl job " + verb)
	reason := fs.String("reason", "", "why (recorded on the job)")
	// The API records the API key's principal as the decider; --by, if
	// given, must name that principal (a check, not a choice).
	by := fs.String("by", "", "the API key's principal name, checked by the server (the decider is always the key's principal)")
	hash := fs.String("hash", "", "the job hash you reviewed (default: the one recorded on the job)")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if err := exactly(pos, 1, "exactly one job id"); err != nil {
		return err
	}
	a, err := e.client().Decide(ctx, pos[0], verb, *reason, *by, *hash)
	if err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(a)
	}
	fmt.Fprintf(e.out, "job %s: %s %s\n", a.JobID, a.Action, a.Note)
	return nil
}

// --- DLQ ----------------------------------------------------------------------

func (e *ctlEnv) dlqList(ctx context.Context, args []string) error {
	fs := e.flags("ctl dlq list")
	limit := fs.Int("limit", 50, "entries, newest first")
	if _, err := e.parse(fs, args); err != nil {
		return err
	}
	d, err := e.client().DLQ(ctx, *limit)
	if err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(d)
	}
	if len(d.Entries) == 0 {
		fmt.Fprintln(e.out, "DLQ is empty")
		return nil
	}
	tw := e.table()
	fmt.Fprintln(tw, "ENTRY\tAT\tJOB\tTENANT\tREASON\tRETRIED AS\tMESSAGE")
	for _, x := range d.Entries {
		reason := x.Reason
		if x.LastReason != "" {
			reason += " (" + x.LastReason + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", x.ID, x.At.Format("2006-01-02 15:04:05.000"), orDash(x.JobID),
			orDash(x.Tenant), reason, orDash(x.RetriedAs), x.Message)
	}
	return tw.Flush()
}

func (e *ctlEnv) dlqRetry(ctx context.Context, args []string) error {
	fs := e.flags("ctl dlq retry")
	force := fs.Bool("force", false, "retry an entry that was retried before")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if err := exactly(pos, 1, "exactly one DLQ entry id"); err != nil {
		return err
	}
	s, err := e.client().RetryDLQ(ctx, pos[0], *force)
	if err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(s)
	}
	fmt.Fprintf(e.out, "retrying %s as %s\n", s.RetryOf, s.JobID)
	return nil
}

func (e *ctlEnv) dlqDelete(ctx context.Context, args []string) error {
	fs := e.flags("ctl dlq delete")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if err := exactly(pos, 1, "exactly one DLQ entry id"); err != nil {
		return err
	}
	if err := e.client().DeleteDLQ(ctx, pos[0]); err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(map[string]string{"deleted": pos[0]})
	}
	fmt.Fprintf(e.out, "deleted %s\n", pos[0])
	return nil
}

// --- workers, pools -------------------------------------------------------------

func (e *ctlEnv) workers(ctx context.Context, args []string) error {
	fs := e.flags("ctl workers")
	if _, err := e.parse(fs, args); err != nil {
		return err
	}
	w, err := e.client().Workers(ctx)
	if err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(w)
	}
	if len(w.Workers) == 0 {
		fmt.Fprintln(e.out, "no live workers")
		return nil
	}
	tw := e.table()
	fmt.Fprintln(tw, "POOL\tWORKERS\tIN FLIGHT/CAPACITY\tLOAD")
	for _, p := range w.Pools {
		fmt.Fprintf(tw, "%s\t%d\t%d/%s\t%s\n", p.Pool, p.Workers, p.InFlight, capacity(p.MaxParallel),
			loadBar(p.Load))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "WORKER\tPOOL\tIN FLIGHT\tREPORTED\tMAX\tCPU\tDISPATCH\tPLACED BY\tBEATS EVERY\tLAST SEEN")
	slow := 0
	for _, x := range w.Workers {
		mode := "pool"
		if x.Direct {
			mode = "direct"
		}
		pool := x.Pool
		if x.Unrouted {
			pool += " (no topic routes here)"
		}
		beat := "-"
		if x.HeartbeatIntervalMS > 0 {
			beat = (time.Duration(x.HeartbeatIntervalMS) * time.Millisecond).String()
		}
		if x.HeartbeatTooSlow {
			beat += " (too slow)"
			slow++
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%.0f%%\t%s\t%s\t%s\t%s ago\n", x.ID, pool, x.InFlight, x.ActiveJobs,
			capacity(x.MaxParallel), x.CPULoad, mode, orDash(x.Steward), beat, time.Since(x.LastSeen).Truncate(100*time.Millisecond))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if slow > 0 {
		fmt.Fprintf(e.out, "\n%d worker(s) beat too seldom for the node's worker TTL (over a third of it): one lost heartbeat "+
			"gets them evicted or their direct dispatches dropped. Make them beat more often or raise the worker TTL; "+
			"the node's log names each.\n", slow)
	}
	return nil
}

func capacity(n int32) string {
	if n <= 0 {
		return "∞"
	}
	return fmt.Sprint(n)
}

// loadBar draws a load fraction as ten cells and a percentage.
func loadBar(f float64) string {
	const cells = 10
	n := max(0, min(cells, int(f*cells+0.5)))
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", cells-n) + fmt.Sprintf("] %3.0f%%", f*100)
}

func (e *ctlEnv) pools(ctx context.Context, args []string) error {
	fs := e.flags("ctl pools")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		pos = []string{"list"}
	}
	c := e.client()
	switch pos[0] {
	case "list", "ls":
		pl, err := c.Pools(ctx)
		if err != nil {
			return err
		}
		if e.asJSON {
			return e.printJSON(pl)
		}
		tw := e.table()
		fmt.Fprintf(tw, "TOPIC\tPOOLS\tSOURCE\tPAUSED\t(runtime version %d)\n", pl.Version)
		for _, m := range pl.Topics {
			paused := "-"
			if m.Paused {
				paused = "paused"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", m.Topic, strings.Join(m.Pools, ","), m.Source, paused)
		}
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "POOL\tREQUIRES\tDISPATCH\t")
		for _, p := range pl.Pools {
			fmt.Fprintf(tw, "%s\t%s\t%s\t\n", p.Name, orDash(strings.Join(p.Requires, ",")), orDash(p.Dispatch))
		}
		return tw.Flush()
	case "get":
		if err := exactly(pos, 2, "a topic: pools get <topic>"); err != nil {
			return err
		}
		m, err := c.Pool(ctx, pos[1])
		if err != nil {
			return err
		}
		if e.asJSON {
			return e.printJSON(m)
		}
		fmt.Fprintf(e.out, "%s → %s (%s)\n", m.Topic, strings.Join(m.Pools, ","), m.Source)
		return nil
	case "pause", "resume":
		return e.poolPause(ctx, c, pos)
	case "set", "map":
		if err := exactly(pos, 3, "a topic and pools: pools set <topic> <pool>[,<pool>...]"); err != nil {
			return err
		}
		m, err := c.SetPool(ctx, pos[1], strings.Split(pos[2], ","))
		if err != nil {
			return err
		}
		if e.asJSON {
			return e.printJSON(m)
		}
		fmt.Fprintf(e.out, "%s → %s (every replica within about a second)\n", m.Topic, strings.Join(m.Pools, ","))
		return nil
	case "delete", "unmap", "rm":
		if err := exactly(pos, 2, "a topic: pools delete <topic>"); err != nil {
			return err
		}
		if err := c.DeletePool(ctx, pos[1]); err != nil {
			return err
		}
		if e.asJSON {
			return e.printJSON(map[string]string{"deleted": pos[1]})
		}
		fmt.Fprintf(e.out, "%s: runtime mapping removed (pools.yaml applies again)\n", pos[1])
		return nil
	}
	return fmt.Errorf("unknown pools command %q (list, get, set, delete)", pos[0])
}

// --- trace, stats, ready -------------------------------------------------------

func (e *ctlEnv) trace(ctx context.Context, args []string) error {
	fs := e.flags("trace")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if err := exactly(pos, 1, "exactly one job id"); err != nil {
		return err
	}
	tr, err := e.client().Trace(ctx, pos[0])
	if err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(tr)
	}
	if len(tr.Entries) == 0 {
		if tr.Tracing {
			fmt.Fprintf(e.out, "job %s: no messages recorded yet\n", tr.JobID)
		} else {
			fmt.Fprintf(e.out, "job %s: no trace (mailbox tracing is off on this node, and no replica persisted one)\n", tr.JobID)
		}
		return nil
	}
	tw := e.table()
	fmt.Fprintln(tw, "#\tTIME\t+MS\tNODE\tSENDER\tMESSAGE\tSTATE BEFORE → AFTER\tREASON\tµS")
	t0 := tr.Entries[0].At
	for i, x := range tr.Entries {
		msg := x.Type
		if x.Panicked {
			msg += " (panicked)"
		}
		if x.Dropped > 0 {
			fmt.Fprintf(tw, "\t\t\t\t\t… %d earlier messages of this activation dropped (ring full)\t\t\t\n", x.Dropped)
		}
		live := ""
		if x.Live {
			live = " *"
		}
		fmt.Fprintf(tw, "%d\t%s\t%+.1f\t%s\t%s\t%s%s\t%s → %s\t%s\t%.1f\n", i+1, x.At.Format("15:04:05.000000"),
			float64(x.At.Sub(t0).Microseconds())/1000, orDash(x.Node), orDash(x.Sender), msg, live,
			orDot(x.Before), orDot(x.After), orDash(x.Reason), float64(x.HandleNanos)/1000)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if tr.Entries[len(tr.Entries)-1].Live {
		fmt.Fprintln(e.out, "* still in the live actor's ring")
	}
	return nil
}

func (e *ctlEnv) stats(ctx context.Context, args []string) error {
	fs := e.flags("ctl stats")
	if _, err := e.parse(fs, args); err != nil {
		return err
	}
	s, err := e.client().Stats(ctx)
	if err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(s)
	}
	tw := e.table()
	fmt.Fprintf(tw, "node %s at %s\n\n", s.Node, s.At.Format(time.RFC3339))
	fmt.Fprintln(tw, "STATE\tJOBS")
	for _, st := range jobstate.AllStates {
		fmt.Fprintf(tw, "%s\t%d\n", st, s.States[string(st)])
	}
	fmt.Fprintf(tw, "\nreceived %.0f, dispatched %.0f, live job actors %d\n", s.Received, s.Dispatched, s.LiveJobActors)
	return tw.Flush()
}

func (e *ctlEnv) ready(ctx context.Context, args []string) error {
	fs := e.flags("ctl ready")
	if _, err := e.parse(fs, args); err != nil {
		return err
	}
	r, err := e.client().Ready(ctx)
	if err != nil {
		return err
	}
	if e.asJSON {
		if err := e.printJSON(r); err != nil {
			return err
		}
	} else if r.Ready {
		fmt.Fprintln(e.out, "ready")
	} else {
		for k, v := range r.Failed {
			fmt.Fprintf(e.out, "not ready: %s: %s\n", k, v)
		}
	}
	if !r.Ready {
		return errors.New("node not ready")
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func orDot(s string) string {
	if s == "" {
		return "·"
	}
	return s
}
