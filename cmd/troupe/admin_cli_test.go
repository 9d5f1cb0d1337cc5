package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

const ctlTestKey = "ctl-test-key-0123456789abcdef"

// ctlSubmitterKey is a second all-tenant key: jobs it submits can be
// approved with ctlTestKey (nobody approves their own job).
const ctlSubmitterKey = "ctl-submitter-key-0123456789abcdef"

// ctlHandler runs jobs for 300 ms, long enough for --wait to show
// progress; job-cli-cancel runs until it is cancelled.
func ctlHandler(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
	if req.JobId == "job-cli-cancel" {
		<-ctx.Done()
		return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_CANCELLED}
	}
	return worker.Sleep(300*time.Millisecond)(ctx, req)
}

// ctlNode starts a node with a worker and its admin API (key-protected);
// it returns the API's URL.
func ctlNode(t *testing.T) string {
	t.Helper()
	env := testenv.New(t)
	pools, err := troupe.ParsePools([]byte("topics:\n  job.echo: echo\npools:\n  echo: {requires: []}\n"))
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	node, err := troupe.NewNode(troupe.Config{NodeID: "node-ctl", NATSURL: env.NATSURL, RedisURL: env.RedisURL,
		KeyPrefix: env.KeyPrefix(), SubjectPrefix: env.Prefix, StreamPrefix: env.StreamPrefix(), Pools: pools,
		Tuning: troupe.Tuning{PermanentGrace: 100 * time.Millisecond}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := node.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Stop(context.Background()) })
	w, err := worker.Start(env.NATS, worker.Config{ID: "w1", Pool: "echo", Topics: []string{"job.echo"}, Direct: true,
		SubjectPrefix: inspect.Of(node).Subjects().Prefix(), Handler: ctlHandler, Heartbeat: time.Second, MaxParallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ws, _ := inspect.Of(node).Workers(); len(ws) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("router never saw the worker")
		}
	}
	srv, err := admin.NewServer(admin.Config{Node: inspect.Of(node), Registry: node.Metrics(), Listen: "127.0.0.1:0",
		APIKeys: map[string]string{ctlTestKey: admin.AllTenants}, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	return "http://" + srv.Addr()
}

// ctl runs one `troupe ctl` command line and returns its output.
func ctl(t *testing.T, api string, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	e := &ctlEnv{out: &out, errOut: &errOut}
	full := append(args, "--api", api, "--key", ctlTestKey)
	err := e.run(context.Background(), full)
	return out.String(), errOut.String(), err
}

func TestCtlDrivesTheAdminAPI(t *testing.T) {
	t.Parallel()
	api := ctlNode(t)

	// submit --wait shows the job's path as it goes, then the job.
	out, progress, err := ctl(t, api, "job", "submit", "--id", "job-cli-1", "--tenant", "acme", "--wait")
	if err != nil {
		t.Fatalf("submit --wait: %v\n%s%s", err, out, progress)
	}
	if !strings.Contains(out, "job job-cli-1  topic job.echo  state SUCCEEDED") || !strings.Contains(out, "tenant acme") {
		t.Fatalf("submit --wait printed:\n%s", out)
	}
	if !strings.Contains(progress, "PENDING → SCHEDULED → DISPATCHED") || !strings.Contains(progress, "SUCCEEDED") {
		t.Fatalf("no progress shown:\n%s", progress)
	}

	// status, in both forms.
	out, _, err = ctl(t, api, "job", "status", "job-cli-1")
	if err != nil || !strings.Contains(out, "state SUCCEEDED") || !strings.Contains(out, "worker w1") {
		t.Fatalf("status: %v\n%s", err, out)
	}
	out, _, err = ctl(t, api, "job", "status", "job-cli-1", "--json")
	var j admin.Job
	if err != nil || json.Unmarshal([]byte(out), &j) != nil || j.State != "SUCCEEDED" || j.Tenant != "acme" {
		t.Fatalf("status --json: %v\n%s", err, out)
	}

	// list as a table, with the header and the job's row.
	out, _, err = ctl(t, api, "job", "list", "--state", "succeeded")
	if err != nil || !regexp.MustCompile(`(?m)^JOB\s+STATE\s+TOPIC`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^job-cli-1\s+SUCCEEDED\s+job\.echo\s+acme\s+worker_completed\s+w1`).MatchString(out) {
		t.Fatalf("list: %v\n%s", err, out)
	}
	// Without a state: the newest jobs of every state.
	out, _, err = ctl(t, api, "job", "list")
	if err != nil || !regexp.MustCompile(`(?m)^job-cli-1\s+SUCCEEDED\s+job\.echo\s+acme`).MatchString(out) {
		t.Fatalf("list without --state: %v\n%s", err, out)
	}

	// A job that fails reaches the DLQ; the CLI lists and retries it.
	if _, _, err := ctl(t, api, "job", "submit", "--id", "job-cli-lost", "--topic", "job.nowhere", "--wait",
		"--timeout", "20s"); err == nil || !strings.Contains(err.Error(), "ended FAILED") {
		t.Fatalf("failing job: %v", err)
	}
	out, _, err = ctl(t, api, "dlq", "list")
	m := regexp.MustCompile(`(?m)^(\d+-\d+)\s+\S+ \S+\s+job-cli-lost\s+default\s+topic_unmapped`).FindStringSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("dlq list: %v\n%s", err, out)
	}
	out, _, err = ctl(t, api, "dlq", "retry", m[1])
	if err != nil || !strings.Contains(out, "retrying job-cli-lost as job-cli-lost-retry1") {
		t.Fatalf("dlq retry: %v\n%s", err, out)
	}
	if _, _, err := ctl(t, api, "dlq", "delete", m[1]); err != nil {
		t.Fatalf("dlq delete: %v", err)
	}

	// cancel a job in flight (once the node has recorded it: the API acts
	// on jobs it can see).
	if _, _, err := ctl(t, api, "job", "submit", "--id", "job-cli-cancel"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		out, _, _ = ctl(t, api, "job", "status", "job-cli-cancel")
		if strings.Contains(out, "state DISPATCHED") || strings.Contains(out, "state RUNNING") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job never dispatched:\n%s", out)
		}
	}
	if out, _, err = ctl(t, api, "job", "cancel", "job-cli-cancel", "--reason", "test"); err != nil ||
		!strings.Contains(out, "cancel requested") {
		t.Fatalf("cancel: %v\n%s", err, out)
	}
	if out, _, _ = ctl(t, api, "job", "list", "--state", "CANCELLED"); !strings.Contains(out, "job-cli-cancel") {
		// The cancel travels through JetStream; give it a moment.
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out, "job-cli-cancel"); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("job never CANCELLED:\n%s", out)
			}
			out, _, _ = ctl(t, api, "job", "list", "--state", "CANCELLED")
		}
	}

	// workers and pools.
	out, _, err = ctl(t, api, "workers")
	if err != nil || !regexp.MustCompile(`(?m)^echo\s+1\s+\d/2\s+\[`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^w1\s+echo\s+`).MatchString(out) {
		t.Fatalf("workers: %v\n%s", err, out)
	}
	if _, _, err := ctl(t, api, "pools", "set", "job.extra", "echo"); err != nil {
		t.Fatal(err)
	}
	out, _, err = ctl(t, api, "pools")
	if err != nil || !regexp.MustCompile(`(?m)^job\.extra\s+echo\s+runtime`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^job\.echo\s+echo\s+file`).MatchString(out) {
		t.Fatalf("pools: %v\n%s", err, out)
	}

	// trace answers even with tracing off, and says so.
	out, _, err = ctl(t, api, "trace", "job-cli-1")
	if err != nil || !strings.Contains(out, "mailbox tracing is off") {
		t.Fatalf("trace: %v\n%s", err, out)
	}

	// A wrong key is an error, not an empty table.
	var buf bytes.Buffer
	e := &ctlEnv{out: &buf, errOut: &buf}
	if err := e.run(context.Background(), []string{"workers", "--api", api, "--key", "wrong-key-0123456789"}); err == nil ||
		!strings.Contains(err.Error(), "401") {
		t.Fatalf("wrong key: %v", err)
	}
}

// The CLI's API commands look where a node serves its API by default, so
// `troupe ctl`, `troupe workers` and `troupe trace` need no --api.
func TestCtlDefaultAPIIsTheNodesListenAddress(t *testing.T) {
	t.Setenv("TROUPE_API_URL", "")
	t.Setenv("TROUPE_ADMIN_LISTEN", "")
	var e ctlEnv
	e.register(flag.NewFlagSet("ctl", flag.ContinueOnError))
	var af adminFlags
	af.register(flag.NewFlagSet("node", flag.ContinueOnError))
	if e.api != "http://"+af.listen {
		t.Fatalf("ctl --api defaults to %q, the node's --admin-listen to %q", e.api, af.listen)
	}
	if !strings.Contains(ctlUsage, e.api) {
		t.Fatalf("ctl usage does not name the default %s:\n%s", e.api, ctlUsage)
	}
}

// TestCtlJobShowsAWaitingJobsQueuePosition: `troupe ctl job status` prints
// where a waiting job stands in its pool's queue, and that a job with no
// record waits in a node's memory.
func TestCtlJobShowsAWaitingJobsQueuePosition(t *testing.T) {
	pos := 3
	var b bytes.Buffer
	printAPIJob(&b, admin.Job{ID: "job-q", State: "SCHEDULED", Topic: "job.echo", Reason: "pool_overloaded",
		QueuePosition: &pos, Unwritten: true, Node: "node-a", Created: time.Now()})
	out := b.String()
	if !strings.Contains(out, "waiting for capacity: 3 jobs ahead in the queue") ||
		!strings.Contains(out, "no record yet: waiting within its capacity grace in node node-a's memory") {
		t.Fatalf("printed:\n%s", out)
	}
}

// TestCtlJobListsItsAttempts: `troupe job <id>` prints each dispatch of the
// job, with its worker, how it ended and the last one's error.
func TestCtlJobListsItsAttempts(t *testing.T) {
	at := time.Date(2026, 11, 26, 13, 38, 40, 585e6, time.UTC)
	end := at.Add(13 * time.Millisecond)
	var b bytes.Buffer
	printAPIJob(&b, admin.Job{ID: "job-f", State: "FAILED", Topic: "job.echo", Reason: "worker_failed",
		AttemptList: []admin.Attempt{
			{N: 1, Worker: "w1", DispatchedAt: at, EndedAt: &end, State: "SCHEDULED", Reason: "worker_lost"},
			{N: 2, Worker: "w2", DispatchedAt: end, EndedAt: &end, State: "FAILED", Reason: "worker_failed", Error: "boom"},
			{N: 3, DispatchedAt: end}}})
	out := b.String()
	for _, want := range []string{
		"attempt 1: worker w1, dispatched 13:38:40.585, ended 13:38:40.598 SCHEDULED worker_lost\n",
		"attempt 2: worker w2, dispatched 13:38:40.598, ended 13:38:40.598 FAILED worker_failed: boom\n",
		"attempt 3: worker -, dispatched 13:38:40.598, still running\n",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("want %q in:\n%s", want, out)
		}
	}
}

// TestCtlWorkersShowsHeartbeatIntervals: `troupe workers` shows each
// worker's heartbeat interval, marks one too slow for the node's worker
// TTL and says what that costs and what to change.
func TestCtlWorkersShowsHeartbeatIntervals(t *testing.T) {
	t.Parallel()
	list := admin.WorkerList{Pools: []admin.PoolLoad{{Pool: "echo", Workers: 3}}, Workers: []admin.Worker{
		{ID: "fast", Pool: "echo", LastSeen: time.Now(), HeartbeatIntervalMS: 1000},
		{ID: "new", Pool: "echo", LastSeen: time.Now()},
		{ID: "slow", Pool: "echo", LastSeen: time.Now(), HeartbeatIntervalMS: 5000, HeartbeatTooSlow: true}}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/workers" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(list)
	}))
	t.Cleanup(srv.Close)
	out, _, err := ctl(t, srv.URL, "workers")
	if err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{`(?m)^WORKER\s.*\sBEATS EVERY\s+LAST SEEN$`, `(?m)^fast\s.*\s1s\s+\S+ ago$`,
		`(?m)^new\s.*\s-\s+\S+ ago$`, `(?m)^slow\s.*\s5s \(too slow\)\s+\S+ ago$`,
		`1 worker\(s\) beat too seldom for the node's worker TTL`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Fatalf("output lacks %s:\n%s", re, out)
		}
	}
}
