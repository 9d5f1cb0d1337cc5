package troupe_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
	"github.com/troupe-run/troupe/worker"
)

// labelPolicy decides by the job's "cordum.policy" label (not a placement
// label): deny, approve (require a
// human) or anything else → allow.
type labelPolicy struct{}

func (labelPolicy) Check(_ context.Context, req *capv1.PolicyCheckRequest) (*capv1.PolicyCheckResponse, error) {
	switch req.Labels["cordum.policy"] {
	case "deny":
		return &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_DENY, Reason: "no", RuleId: "r-deny"}, nil
	case "approve":
		return &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_REQUIRE_HUMAN, Reason: "ask", RuleId: "r-human"}, nil
	}
	return &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}, nil
}

// hang never finishes a job (until the worker stops).
func hang(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
	<-ctx.Done()
	return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_CANCELLED}
}

func reasons(h []store.HistoryEntry) string {
	var b strings.Builder
	for _, e := range h {
		b.WriteString(string(e.To) + ":" + string(e.Reason) + " ")
	}
	return b.String()
}

// cancels collects job ids of JobCancel packets on the cancel subject.
func (f *fixture) cancels() chan string {
	ch := make(chan string, 100)
	sub, err := f.env.NATS.Subscribe(f.subj.Cancel, func(m *nats.Msg) {
		if p, err := bus.Decode(m.Data); err == nil && p.GetJobCancel() != nil {
			ch <- p.GetJobCancel().JobId
		}
	})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = sub.Unsubscribe() })
	_ = f.env.NATS.Flush()
	return ch
}

func waitFor(t *testing.T, ch chan string, want string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case got := <-ch:
			if got == want {
				return
			}
		case <-timeout:
			t.Fatalf("never saw %s", want)
		}
	}
}

func TestDispatchTimeoutCancelsTheWorker(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		c.Tuning.Timeouts = &troupe.Timeouts{Dispatch: 300 * time.Millisecond, Running: time.Hour}
	})
	cancels := f.cancels()
	// A worker that says it reports starts, and never starts the job.
	w, err := worker.Start(f.env.NATS, worker.Config{ID: "w1", Pool: "echo", Topics: []string{"job.echo"},
		Direct: true, SubjectPrefix: f.subj.Prefix(), Handler: hang, Heartbeat: time.Second,
		Labels: map[string]string{registry.LabelProgress: registry.ProgressStarted}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	f.waitWorkers(1)
	f.submit(echoReq("job-dto"))
	r := f.waitState("job-dto", jobstate.StateTimeout)
	if r.Reason != jobstate.ReasonDispatchTimeout {
		t.Fatalf("reason %s: %s", r.Reason, reasons(r.History))
	}
	waitFor(t, cancels, "job-dto")
}

// TestStockCAPLongJobIsBoundedByItsRun: a worker that sends no
// progress (a stock CAP worker) runs a job longer than the dispatch
// timeout; the job counts as started on delivery, so it SUCCEEDS, bounded
// by the running timeout instead.
func TestStockCAPLongJobIsBoundedByItsRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		c.Tuning.Timeouts = &troupe.Timeouts{Dispatch: 300 * time.Millisecond, Running: time.Minute}
	})
	f.startWorker("stock", false, nil, func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		select {
		case <-time.After(time.Second): // over three dispatch timeouts
		case <-ctx.Done():
		}
		return worker.Echo(ctx, req)
	})
	f.submit(echoReq("job-long"))
	r := f.waitState("job-long", jobstate.StateSucceeded)
	if r.Reason != jobstate.ReasonCompleted {
		t.Fatalf("reason %s: %s", r.Reason, reasons(r.History))
	}
	// The same with the running timeout short: that is what bounds it.
	g := newFixture(t, func(c *troupe.Config) {
		c.Tuning.Timeouts = &troupe.Timeouts{Dispatch: time.Minute, Running: 300 * time.Millisecond}
	})
	g.startWorker("stock", false, nil, hang)
	g.submit(echoReq("job-stuck"))
	if r := g.waitState("job-stuck", jobstate.StateTimeout); r.Reason != jobstate.ReasonRunningTimeout {
		t.Fatalf("reason %s: %s", r.Reason, reasons(r.History))
	}
}

func TestRunningTimeoutUsesTheTopicOverride(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		c.Tuning.Timeouts = &troupe.Timeouts{Dispatch: time.Hour, Running: time.Hour,
			PerTopic: map[string]time.Duration{"job.echo": 300 * time.Millisecond}}
	})
	cancels := f.cancels()
	w, err := worker.Start(f.env.NATS, worker.Config{ID: "wp", Pool: "echo", Topics: []string{"job.echo"}, Direct: true,
		SubjectPrefix: f.subj.Prefix(), Progress: true, Heartbeat: time.Second, Handler: hang})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	f.waitWorkers(1)
	f.submit(echoReq("job-rto"))
	r := f.waitState("job-rto", jobstate.StateTimeout)
	if r.Reason != jobstate.ReasonRunningTimeout || r.History[len(r.History)-2].To != jobstate.StateRunning {
		t.Fatalf("history %s", reasons(r.History))
	}
	waitFor(t, cancels, "job-rto")
}

func TestBudgetDeadlineWinsOverTheDispatchTimeout(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil) // default timeouts: 300 s dispatch
	f.startWorker("w1", true, nil, hang)
	req := echoReq("job-budget")
	req.Budget = &capv1.Budget{DeadlineMs: 300}
	f.submit(req)
	r := f.waitState("job-budget", jobstate.StateTimeout)
	if r.Reason != jobstate.ReasonDeadlineExceeded {
		t.Fatalf("reason %s", r.Reason)
	}
}

func TestPolicyDenyGoesToDLQ(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) { c.Policy = labelPolicy{} })
	req := echoReq("job-deny")
	req.Labels = map[string]string{"cordum.policy": "deny"}
	f.submit(req)
	r := f.waitState("job-deny", jobstate.StateDenied)
	if r.Reason != jobstate.ReasonSafetyDenied || r.Fields["rule_id"] != "r-deny" {
		t.Fatalf("record %+v", r.Fields)
	}
	f.waitDLQ(func(e store.DLQEntry) bool { return e.JobID == "job-deny" && e.Reason == jobstate.ReasonSafetyDenied })
}

func TestApprovalPassivatesAndResumesOnlyWithTheRightHash(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		c.Policy = labelPolicy{}
		c.Tuning.DuePoll = 50 * time.Millisecond
		c.Tuning.DueSlack = time.Millisecond
	})
	rec := newReceipts()
	f.startWorker("w1", true, rec, worker.Echo)
	ctx := context.Background()
	for _, id := range []string{"job-approve", "job-reject"} {
		req := echoReq(id)
		req.Labels = map[string]string{"cordum.policy": "approve"}
		f.submit(req)
		f.waitState(id, jobstate.StateApprovalRequired)
	}
	// Waiting for a human holds no live actor and no lock.
	deadline := time.Now().Add(10 * time.Second)
	for n, _ := f.node.LiveJobActors(); n != 0; n, _ = f.node.LiveJobActors() {
		if time.Now().After(deadline) {
			t.Fatalf("%d job actors still live while jobs wait for approval", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	r, _ := f.node.Record(ctx, "job-approve")
	hash := r.Fields["job_hash"]
	if len(hash) != 64 || r.LockHolder != "" {
		t.Fatalf("job hash %q, lock %q", hash, r.LockHolder)
	}
	if err := f.node.Decide(ctx, "job-approve", troupe.DecisionApproved, "alice", "looks fine", "not-the-hash"); !errors.Is(err, troupe.ErrHashMismatch) {
		t.Fatalf("approval with a stale hash: %v", err)
	}
	if err := f.node.Decide(ctx, "job-approve", troupe.DecisionApproved, "alice", "looks fine", hash); err != nil {
		t.Fatal(err)
	}
	if err := f.node.Decide(ctx, "job-reject", troupe.DecisionRejected, "bob", "too risky", ""); err != nil {
		t.Fatal(err)
	}
	r = f.waitState("job-approve", jobstate.StateSucceeded)
	if !strings.Contains(reasons(r.History), "APPROVAL_REQUIRED:approval_required SCHEDULED:approval_granted DISPATCHED") ||
		r.Fields["approved_by"] != "alice" || r.Fields["approval_reason"] != "looks fine" {
		t.Fatalf("history %s fields %v", reasons(r.History), r.Fields)
	}
	r = f.waitState("job-reject", jobstate.StateDenied)
	if r.Reason != jobstate.ReasonApprovalRejected || r.Fields["approved_by"] != "bob" {
		t.Fatalf("rejected job: %s %v", r.Reason, r.Fields)
	}
	if rec.count("job-reject") != 0 {
		t.Fatal("rejected job reached a worker")
	}
}

func TestCancelBeforeAndDuringRunAndLateResultIgnored(t *testing.T) {
	t.Parallel()
	// A result for a job with no record is dead-lettered at once here (see
	// TestResultForAMissingRecordIsHeld for the hold).
	f := newFixture(t, func(c *troupe.Config) { c.Tuning.UnknownHold = -1 })
	ctx := context.Background()
	// Before dispatch: no worker yet.
	f.submit(echoReq("job-c1"))
	f.waitState("job-c1", jobstate.StateScheduled)
	if err := f.node.Cancel(ctx, "job-c1", "changed my mind", "tester"); err != nil {
		t.Fatal(err)
	}
	r := f.waitState("job-c1", jobstate.StateCancelled)
	if r.Reason != jobstate.ReasonCancelRequested || r.Fields["cancelled_by"] != "tester" {
		t.Fatalf("%s %v", r.Reason, r.Fields)
	}
	// While the worker holds it; a late SUCCEEDED (a worker that hears no
	// cancel, as stock CAP workers) is ignored. (troupe worker stops the
	// job on the cancel and sends nothing; the late result is sent here.)
	rec := newReceipts()
	release := make(chan struct{})
	defer close(release)
	f.startWorker("w1", true, rec, func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return worker.Echo(ctx, req)
	})
	f.submit(echoReq("job-c2"))
	<-rec.ch
	f.waitState("job-c2", jobstate.StateDispatched)
	if err := f.node.Cancel(ctx, "job-c2", "stop", "tester"); err != nil {
		t.Fatal(err)
	}
	f.waitState("job-c2", jobstate.StateCancelled)
	before := counter(t, f.node, "troupe_duplicates_absorbed_total", "result")
	late, _ := bus.EncodeResult("trace-job-c2", "w1", &capv1.JobResult{JobId: "job-c2",
		Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, WorkerId: "w1"})
	f.publishRaw(f.subj.Result, late)
	deadline := time.Now().Add(10 * time.Second)
	for counter(t, f.node, "troupe_duplicates_absorbed_total", "result") == before {
		if time.Now().After(deadline) {
			t.Fatal("late result was not counted as absorbed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	r, _ = f.node.Record(ctx, "job-c2")
	if r.State != jobstate.StateCancelled || r.History[len(r.History)-1].To != jobstate.StateCancelled {
		t.Fatalf("terminal job changed: %s", reasons(r.History))
	}
	// A cancel for a job that has no record (yet) is recorded for it: its
	// submit may still be held in the stream.
	_ = f.node.Cancel(ctx, "job-ghost", "x", "tester")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if tenants, _, _ := f.node.Store().CancelMarked(ctx, "job-ghost"); len(tenants) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cancel of a job with no record was not recorded")
		}
	}
}

func TestIdempotencyKeyReturnsTheFirstJob(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	rec := newReceipts()
	f.startWorker("w1", true, rec, worker.Echo)
	for _, id := range []string{"job-i1", "job-i2"} {
		req := echoReq(id)
		req.TenantId = "acme"
		req.Meta = &capv1.JobMetadata{IdempotencyKey: "order-42"}
		f.submit(req)
	}
	// Same key under another tenant is a different job.
	other := echoReq("job-i3")
	other.TenantId = "globex"
	other.Meta = &capv1.JobMetadata{IdempotencyKey: "order-42"}
	f.submit(other)
	f.waitState("job-i3", jobstate.StateSucceeded)
	deadline := time.Now().Add(10 * time.Second)
	for counter(t, f.node, "troupe_idempotent_duplicates_total", "") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("duplicate not counted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The two submits race to claim the key (their actors run in parallel):
	// exactly one of them becomes the job, the other is that job.
	ctx := context.Background()
	_, err1 := f.node.Record(ctx, "job-i1")
	_, err2 := f.node.Record(ctx, "job-i2")
	winner, loser := "job-i1", "job-i2"
	if err1 != nil {
		winner, loser = loser, winner
	}
	if (err1 == nil) == (err2 == nil) {
		t.Fatalf("want exactly one job for the key: job-i1 %v, job-i2 %v", err1, err2)
	}
	f.waitState(winner, jobstate.StateSucceeded)
	if rec.count(loser) != 0 || rec.count(winner) != 1 {
		t.Fatalf("receipts: %s %d, %s %d", winner, rec.count(winner), loser, rec.count(loser))
	}
}

func TestDurableRetryIsWokenByAnotherNode(t *testing.T) {
	t.Parallel()
	// Both nodes' warnings are kept and printed should the test fail (it
	// failed once, under a loaded CI machine, with node B never waking the
	// job: a release at stop that failed leaves the lock to its 60 s TTL,
	// and says so now).
	var logs lockedBuffer
	warn := func(c *troupe.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("nodes' warnings:\n%s", logs.String())
		}
	})
	env := newFixture(t, func(c *troupe.Config) {
		troupe.SetBackoff(c, func(int) time.Duration { return 200 * time.Millisecond })
		c.Tuning.DueSlack = 50 * time.Millisecond
		c.Tuning.DuePoll = 50 * time.Millisecond
		warn(c)
	})
	env.submit(echoReq("job-durable"))
	env.waitState("job-durable", jobstate.StateScheduled)
	// Node A goes away with the job waiting for a retry.
	_ = env.node.Stop(context.Background())
	// Node B, same Redis and streams, a worker this time.
	b := newNodeOn(t, env, "node-b", warn)
	w, err := worker.Start(env.env.NATS, worker.Config{ID: "wb", Pool: "echo", Topics: []string{"job.echo"},
		Direct: true, SubjectPrefix: env.subj.Prefix(), Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	r := env.waitState("job-durable", jobstate.StateSucceeded)
	if r.History[len(r.History)-1].Node != "node-b" || b.ID() != "node-b" {
		t.Fatalf("history %+v", r.History)
	}
	if got := counter(t, b, "troupe_orphan_replayed_total", "job.echo"); got < 1 {
		t.Fatalf("adoption by the due poller not counted: %v", got)
	}
}

// failFirstActivate fails the first pipeline that activates a job.
type failFirstActivate struct{ failed atomic.Bool }

func (h *failFirstActivate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failFirstActivate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (h *failFirstActivate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			args := c.Args()
			if len(args) > 3 && args[0] == "evalsha" && strings.HasSuffix(argString(args[3]), "job:fail-closed-job") &&
				h.failed.CompareAndSwap(false, true) {
				err := errors.New("injected: redis unavailable")
				for _, c := range cmds {
					c.SetErr(err)
				}
				return err
			}
		}
		return next(ctx, cmds)
	}
}

// The regression test of the fail-closed rule: the first state read fails →
// nothing is published; the second read says RUNNING → still nothing.
func TestFailClosedOnUnknownState(t *testing.T) {
	t.Parallel()
	hook := &failFirstActivate{}
	var published atomic.Int32
	f := newFixture(t, func(c *troupe.Config) {})
	env := f.env
	// Node under test: its Redis client fails the first activation.
	_ = f.node.Stop(context.Background())
	rdb := redis.NewClient(&redis.Options{Addr: strings.TrimPrefix(env.RedisURL, "redis://")})
	rdb.AddHook(hook)
	defer rdb.Close()
	sub, err := env.NATS.Subscribe(f.subj.Prefix()+">", func(m *nats.Msg) {
		if strings.HasSuffix(m.Subject, ".jobs") || strings.HasSuffix(m.Subject, "job.echo") {
			published.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	// The job is RUNNING on a node that died (record present, lock expired).
	ctx := context.Background()
	keys := store.NewKeys(env.KeyPrefix())
	rdb.HSet(ctx, keys.Job("fail-closed-job"), "s", "RUNNING", "fence", 3, "topic", "job.echo", "worker", "w1")
	n := newNodeOn(t, f, "node-c", func(c *troupe.Config) { c.Redis = rdb })
	startWorkerOn(t, f, "w1")
	f.submit(echoReq("fail-closed-job")) // a redelivered submit of the running job
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := n.Record(ctx, "fail-closed-job")
		if err == nil && strings.HasPrefix(r.LockHolder, "node-c|") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("job never re-activated after the failed read")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !hook.failed.Load() {
		t.Fatal("the first read did not fail")
	}
	if got := counter(t, n, "troupe_state_read_fail_closed_total", "job.echo"); got < 1 {
		t.Fatalf("fail-closed metric %v", got)
	}
	_ = env.NATS.Flush()
	f.submit(echoReq("marker-after")) // flows through the same stream after the duplicate
	f.waitState("marker-after", jobstate.StateSucceeded)
	if got := published.Load(); got != 1 { // the marker only
		t.Fatalf("%d publishes; the running job was dispatched again", got-1)
	}
	r, _ := n.Record(ctx, "fail-closed-job")
	if r.State != jobstate.StateRunning {
		t.Fatalf("state %s", r.State)
	}
}

func startWorkerOn(t *testing.T, f *fixture, id string) {
	w, err := worker.Start(f.env.NATS, worker.Config{ID: id, Pool: "echo", Topics: []string{"job.echo"},
		Direct: true, SubjectPrefix: f.subj.Prefix(), Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
}

// newNodeOn starts another node on the fixture's servers and prefixes.
func newNodeOn(t *testing.T, f *fixture, id string, mutate ...func(*troupe.Config)) *troupe.Node {
	t.Helper()
	old := f.node
	_ = old
	pools, _ := parseTestPools()
	cfg := troupe.Config{NodeID: id, NATSURL: f.env.NATSURL, RedisURL: f.env.RedisURL,
		KeyPrefix: f.env.KeyPrefix(), SubjectPrefix: f.env.Prefix, StreamPrefix: f.env.StreamPrefix(), Pools: pools,
		Tuning: troupe.Tuning{DuePoll: 50 * time.Millisecond, DueSlack: 50 * time.Millisecond}, Logger: quietLogger()}
	troupe.SetBackoff(&cfg, func(int) time.Duration { return 50 * time.Millisecond })
	for _, m := range mutate {
		m(&cfg)
	}
	n, err := troupe.NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	f.node = n
	return n
}

// counter reads a counter, a gauge or a histogram's sample count from the
// node's registry; label is the value of its only label, or "" for none.
func counter(t testing.TB, n *troupe.Node, name, label string) float64 {
	t.Helper()
	mfs, err := n.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			if label != "" && (len(m.Label) == 0 || m.Label[0].GetValue() != label) {
				continue
			}
			return value(m)
		}
	}
	return 0
}

// waitCounter waits (bounded) until counter reads at least min: a metric is
// counted by the actor after Redis shows the change it counts.
func waitCounter(t testing.TB, n *troupe.Node, name, label string, min float64) float64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := counter(t, n, name, label)
		if got >= min || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func value(m *dto.Metric) float64 {
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	if m.Gauge != nil {
		return m.Gauge.GetValue()
	}
	if m.Histogram != nil {
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

// With the built-in engine, ALLOW_WITH_CONSTRAINTS reaches the worker as
// CAP's env entries, caps the deadline, and the decision is on the record.
func TestPolicyConstraintsTravelToTheWorker(t *testing.T) {
	t.Parallel()
	engine, err := safety.NewEngine([]byte(`
version: "t1"
rules:
  - id: echo-constrained
    match: {topics: ["job.echo"]}
    decision: allow
    constraints: {budgets: {max_runtime_ms: 60000}, redaction_level: "strict"}
`))
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *troupe.Config) { c.Policy = engine })
	got := make(chan *capv1.JobRequest, 1)
	w, err := worker.Start(f.env.NATS, worker.Config{ID: "wc", Pool: "echo", Topics: []string{"job.echo"}, Direct: true,
		SubjectPrefix: f.subj.Prefix(), Heartbeat: time.Second,
		OnReceive: func(_ string, req *capv1.JobRequest) { got <- req }})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	f.waitWorkers(1)
	f.submit(echoReq("job-constrained"))
	req := <-got
	if req.Env["CORDUM_REDACTION_LEVEL"] != "strict" || !strings.Contains(req.Env["CORDUM_POLICY_CONSTRAINTS"], "60000") ||
		req.GetBudget().GetDeadlineMs() != 60000 {
		t.Fatalf("worker got env %v budget %v", req.Env, req.Budget)
	}
	r := f.waitState("job-constrained", jobstate.StateSucceeded)
	if r.Fields["policy_decision"] != "allow_with_constraints" || r.Fields["rule_id"] != "echo-constrained" ||
		!strings.HasPrefix(r.Fields["policy_snapshot"], "t1:") {
		t.Fatalf("decision not recorded: %v", r.Fields)
	}
}

// results collects the JobResults Troupe itself publishes on the result
// subject (no worker_id), by job id, as a CAP client waiting for its job
// sees them; the returned func waits (bounded) for one job's.
func (f *fixture) results() func(id string) *capv1.JobResult {
	var mu sync.Mutex
	got := map[string]*capv1.JobResult{}
	sub, err := f.env.NATS.Subscribe(f.subj.Result, func(m *nats.Msg) {
		if p, err := bus.Decode(m.Data); err == nil && p.GetJobResult() != nil && p.GetJobResult().WorkerId == "" {
			mu.Lock()
			if got[p.GetJobResult().JobId] != nil {
				f.t.Errorf("two outcomes published for %s", p.GetJobResult().JobId)
			}
			got[p.GetJobResult().JobId] = p.GetJobResult()
			mu.Unlock()
		}
	})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = sub.Unsubscribe() })
	_ = f.env.NATS.Flush()
	return func(id string) *capv1.JobResult {
		f.t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			mu.Lock()
			r := got[id]
			mu.Unlock()
			if r != nil {
				return r
			}
			time.Sleep(5 * time.Millisecond)
		}
		f.t.Fatalf("no JobResult from Troupe for %s on %s", id, f.subj.Result)
		return nil
	}
}

// TestStockCAPClientsHearOutcomesTroupeDecides: a job Troupe denies, fails to
// place, times out or cancels gets a JobResult on the result subject, with
// the status and the reason as error_code — a CAP client waiting there
// hears how its job ended even though no worker answered.
func TestStockCAPClientsHearOutcomesTroupeDecides(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		c.Policy = labelPolicy{}
		c.Tuning.PermanentGrace = 100 * time.Millisecond
		c.Tuning.Timeouts = &troupe.Timeouts{Dispatch: time.Minute, Running: 500 * time.Millisecond}
	})
	result := f.results()
	f.startWorker("w1", true, nil, hang)
	denied := echoReq("out-denied")
	denied.Labels = map[string]string{"cordum.policy": "deny"}
	f.submit(denied)
	f.submit(&capv1.JobRequest{JobId: "out-unmapped", Topic: "job.nowhere"})
	f.submit(echoReq("out-timeout"))
	cases := []struct {
		id     string
		status capv1.JobStatus
		code   jobstate.Reason
	}{
		{"out-denied", capv1.JobStatus_JOB_STATUS_DENIED, jobstate.ReasonSafetyDenied},
		{"out-unmapped", capv1.JobStatus_JOB_STATUS_FAILED, jobstate.ReasonTopicUnmapped},
		{"out-timeout", capv1.JobStatus_JOB_STATUS_TIMEOUT, jobstate.ReasonRunningTimeout},
	}
	for _, c := range cases {
		r := result(c.id)
		if r.Status != c.status || r.ErrorCode != string(c.code) || r.WorkerId != "" {
			t.Errorf("%s: result %v %q (worker %q), want %v %q", c.id, r.Status, r.ErrorCode, r.WorkerId, c.status, c.code)
		}
	}
	f.submit(echoReq("out-cancel"))
	f.waitState("out-cancel", jobstate.StateDispatched)
	if err := f.node.Cancel(context.Background(), "out-cancel", "not needed", "test"); err != nil {
		t.Fatal(err)
	}
	if r := result("out-cancel"); r.Status != capv1.JobStatus_JOB_STATUS_CANCELLED ||
		r.ErrorCode != string(jobstate.ReasonCancelRequested) {
		t.Errorf("out-cancel: result %v %q", r.Status, r.ErrorCode)
	}
	// Read back from the result stream, these change nothing, and the node
	// does not take its own outcomes for workers' results: it skips them
	// without activating the jobs.
	for _, c := range cases {
		if r := f.waitState(c.id, jobstate.State(strings.TrimPrefix(c.status.String(), "JOB_STATUS_"))); r == nil {
			t.Fatal(c.id)
		}
	}
	// (The worker's own answers to the cancel and the timeout — it stops
	// the job on the JobCancel — are absorbed as late results.)
	if n := waitCounter(t, f.node, "troupe_own_outcomes_skipped_total", "", float64(len(cases)+1)); n != float64(len(cases)+1) {
		t.Fatalf("%v of the node's %d own outcomes skipped", n, len(cases)+1)
	}
}
