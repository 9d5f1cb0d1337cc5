package admin_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/testhook"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// searchIDs follows a filtered listing's cursors (bounded) and returns the
// ids listed.
func searchIDs(t *testing.T, c *admin.Client, f admin.JobFilter) []string {
	t.Helper()
	var ids []string
	cursor := ""
	for page := 0; page < 20; page++ {
		l, err := c.SearchJobs(context.Background(), f, 2, cursor)
		if err != nil {
			t.Fatalf("search %+v: %v", f, err)
		}
		for _, j := range l.Jobs {
			ids = append(ids, j.ID)
		}
		if cursor = l.Next; cursor == "" {
			return ids
		}
	}
	t.Fatalf("search %+v never ended", f)
	return nil
}

// TestSearchFiltersByTopicWorkerLabelTimeAndID: GET /v1/jobs narrows by
// topic, tenant, worker, label, created time and id substring, each line
// carries labels and attempts, a tenant key sees its tenant only, and bad
// filters are 400.
func TestSearchFiltersByTopicWorkerLabelTimeAndID(t *testing.T) {
	t.Parallel()
	b := setup(t, options{keys: testKeys})
	ctx := context.Background()
	all, ca := b.client(keyAll), b.client(keyA)
	b.startWorker("w-search", worker.Echo)
	submit := func(id, tenant, topic, team, want string) {
		req := echoReq(id, tenant)
		req.Topic = topic
		req.Labels = map[string]string{"cordum.team": team}
		if _, err := all.Submit(ctx, req); err != nil {
			t.Fatal(err)
		}
		b.waitState(all, id, want)
	}
	submit("sf-a1", "a", "job.echo", "red", "SUCCEEDED")
	submit("sf-b1", "b", "job.echo", "blue", "SUCCEEDED")
	// Created times are milliseconds: the boundary sits between two jobs.
	time.Sleep(5 * time.Millisecond)
	mid := time.Now().UTC()
	time.Sleep(5 * time.Millisecond)
	submit("sf-a2", "a", "job.nope", "red", "FAILED")
	submit("sf-b2", "b", "job.echo", "red", "SUCCEEDED")
	for _, c := range []struct {
		name string
		f    admin.JobFilter
		want []string
	}{
		{"topic", admin.JobFilter{Topic: "job.nope"}, []string{"sf-a2"}},
		{"tenant", admin.JobFilter{Tenant: "b"}, []string{"sf-b2", "sf-b1"}},
		{"worker", admin.JobFilter{Worker: "w-search", Q: "sf-"}, []string{"sf-b2", "sf-b1", "sf-a1"}},
		{"label", admin.JobFilter{Labels: []string{"cordum.team=red"}}, []string{"sf-b2", "sf-a2", "sf-a1"}},
		{"label and state", admin.JobFilter{Labels: []string{"cordum.team=red"}, State: "SUCCEEDED"}, []string{"sf-b2", "sf-a1"}},
		{"since", admin.JobFilter{Since: mid.Format(time.RFC3339Nano), Q: "sf-"}, []string{"sf-b2", "sf-a2"}},
		{"until", admin.JobFilter{Until: mid.Format(time.RFC3339Nano), Q: "sf-"}, []string{"sf-b1", "sf-a1"}},
		{"q", admin.JobFilter{Q: "-b"}, []string{"sf-b2", "sf-b1"}},
	} {
		if got := searchIDs(t, all, c.f); !slices.Equal(got, c.want) {
			t.Errorf("%s: listed %v, want %v", c.name, got, c.want)
		}
	}
	if got := searchIDs(t, ca, admin.JobFilter{Labels: []string{"cordum.team=red"}}); !slices.Equal(got, []string{"sf-a2", "sf-a1"}) {
		t.Errorf("tenant a's key listed %v", got)
	}
	l, err := all.SearchJobs(ctx, admin.JobFilter{Q: "sf-a1"}, 5, "")
	if err != nil || len(l.Jobs) != 1 || l.Jobs[0].Labels["cordum.team"] != "red" || l.Jobs[0].Attempts != 1 ||
		l.Jobs[0].Worker != "w-search" || l.Jobs[0].Created.IsZero() {
		t.Fatalf("summary %+v, %v: want labels, attempts 1, worker, created", l.Jobs, err)
	}
	for _, f := range []admin.JobFilter{{Labels: []string{"nokey"}}, {Since: "yesterday"}, {State: "DONE"}} {
		if _, err := all.SearchJobs(ctx, f, 5, ""); apiStatus(err) != 400 {
			t.Errorf("filter %+v: %v, want 400", f, err)
		}
	}
	if _, err := ca.SearchJobs(ctx, admin.JobFilter{Tenant: "b"}, 5, ""); apiStatus(err) != 403 {
		t.Errorf("tenant a listing tenant b: %v, want 403", err)
	}
}

// TestRetryAnEndedJobUnderALinkedID: POST /v1/jobs/{id}/retry submits a
// FAILED job again (label retry_of, links both ways), refuses a live job
// (409) and a SUCCEEDED one (422); the job's detail lists its attempts.
func TestRetryAnEndedJobUnderALinkedID(t *testing.T) {
	t.Parallel()
	b := setup(t, options{keys: testKeys})
	ctx := context.Background()
	all := b.client(keyAll)
	b.startWorker("w-retry", func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		if req.Labels["cordum.hang"] == "1" {
			return hang(ctx, req)
		}
		return worker.Echo(ctx, req)
	})
	req := echoReq("rt-failed", "a")
	req.Topic = "job.nope"
	if _, err := all.Submit(ctx, req); err != nil {
		t.Fatal(err)
	}
	b.waitState(all, "rt-failed", "FAILED")
	res, err := all.RetryJob(ctx, "rt-failed")
	if err != nil || res.RetryOf != "rt-failed" || res.JobID != "rt-failed-retry1" {
		t.Fatalf("retry: %+v, %v", res, err)
	}
	retried := b.waitState(all, res.JobID, "FAILED") // still unmapped: it fails again, as itself
	if retried.RetryOf != "rt-failed" {
		t.Fatalf("retried job: retry_of %q", retried.RetryOf)
	}
	orig, err := all.Job(ctx, "rt-failed")
	if err != nil || orig.RetriedAs != res.JobID {
		t.Fatalf("original: retried_as %q, %v", orig.RetriedAs, err)
	}
	if l, err := all.SearchJobs(ctx, admin.JobFilter{Labels: []string{"retry_of=rt-failed"}}, 5, ""); err != nil ||
		len(l.Jobs) != 1 || l.Jobs[0].ID != res.JobID {
		t.Fatalf("the retry carries label retry_of: %+v, %v", l.Jobs, err)
	}

	if _, err := all.Submit(ctx, echoReq("rt-ok", "a")); err != nil {
		t.Fatal(err)
	}
	ok := b.waitState(all, "rt-ok", "SUCCEEDED")
	if len(ok.AttemptList) != 1 || ok.AttemptList[0].Worker != "w-retry" || ok.AttemptList[0].State != "SUCCEEDED" ||
		ok.AttemptList[0].EndedAt == nil {
		t.Fatalf("attempts of a succeeded job: %+v", ok.AttemptList)
	}
	if _, err := all.RetryJob(ctx, "rt-ok"); apiStatus(err) != 422 {
		t.Fatalf("retry of a SUCCEEDED job: %v, want 422", err)
	}
	live := echoReq("rt-live", "a")
	live.Labels = map[string]string{"cordum.hang": "1"}
	if _, err := all.Submit(ctx, live); err != nil {
		t.Fatal(err)
	}
	b.waitState(all, "rt-live", "DISPATCHED")
	if _, err := all.RetryJob(ctx, "rt-live"); apiStatus(err) != 409 {
		t.Fatalf("retry of a DISPATCHED job: %v, want 409", err)
	}
	if _, err := b.client(keyB).RetryJob(ctx, "rt-failed"); apiStatus(err) != 404 {
		t.Fatalf("retry of another tenant's job: %v, want 404", err)
	}
}

// TestBulkCancelAndRetryByFilter: POST /v1/jobs/bulk cancels the jobs a
// label selects, then retries the cancelled ones within a limit (saying
// truncated), and lists the jobs the action does not apply to.
func TestBulkCancelAndRetryByFilter(t *testing.T) {
	t.Parallel()
	b := setup(t, options{keys: testKeys})
	ctx := context.Background()
	all := b.client(keyAll)
	b.startWorker("w-bulk", hang)
	ids := []string{"bk-1", "bk-2", "bk-3"}
	for _, id := range ids {
		req := echoReq(id, "a")
		req.Labels = map[string]string{"cordum.batch": "x"}
		if _, err := all.Submit(ctx, req); err != nil {
			t.Fatal(err)
		}
		b.waitState(all, id, "DISPATCHED")
	}
	f := admin.JobFilter{Labels: []string{"cordum.batch=x"}}
	res, err := all.Bulk(ctx, admin.BulkRequest{Action: "cancel", Filter: f, Reason: "bulk test"})
	if err != nil || res.Matched != 3 || res.Done != 3 || len(res.Failed) != 0 || res.Truncated {
		t.Fatalf("bulk cancel: %+v, %v", res, err)
	}
	for _, id := range ids {
		b.waitState(all, id, "CANCELLED")
	}
	f.State = "CANCELLED"
	res, err = all.Bulk(ctx, admin.BulkRequest{Action: "retry", Filter: f, Limit: 2})
	if err != nil || res.Matched != 2 || res.Done != 2 || !res.Truncated || len(res.Retried) != 2 {
		t.Fatalf("bulk retry, limit 2: %+v, %v", res, err)
	}
	for old, id := range res.Retried {
		if j := b.waitState(all, id, "DISPATCHED"); j.RetryOf != old {
			t.Fatalf("%s retries %q, want %s", id, j.RetryOf, old)
		}
	}
	res, err = all.Bulk(ctx, admin.BulkRequest{Action: "cancel", Filter: admin.JobFilter{Labels: []string{"cordum.batch=x"}, Q: "bk-1"}})
	if err != nil || res.Matched < 1 || len(res.Failed) == 0 {
		t.Fatalf("bulk cancel of ended jobs: %+v, %v (want them in failed)", res, err)
	}
	for _, body := range []admin.BulkRequest{{Action: "delete"}, {Action: "cancel", Limit: 5000}} {
		if _, err := all.Bulk(ctx, body); apiStatus(err) != 400 {
			t.Errorf("bulk %+v: %v, want 400", body, err)
		}
	}
}

// TestPauseHoldsATopicOnEveryReplicaUntilResumed: a topic paused through
// one replica's API holds on a replica started after the pause too: the
// jobs submitted to it wait SCHEDULED pool_paused, no worker gets one, a
// waiting one can be cancelled; resumed through the other replica, the
// rest run.
func TestPauseHoldsATopicOnEveryReplicaUntilResumed(t *testing.T) {
	t.Parallel()
	// One scheduling attempt: a wait that counted attempts would fail the
	// job at its first pool_paused answer.
	const keyAllClient = "all-tenants-client-key-0123"
	b := setup(t, options{keys: testKeys, node: func(c *troupe.Config) { c.Tuning.MaxSchedulingAttempts = 1 },
		admin: func(c *admin.Config) {
			c.Keys = map[string]admin.Key{keyAllClient: {Tenant: admin.AllTenants, Role: admin.RoleClient}}
		}})
	ctx := context.Background()
	all := b.client(keyAll)
	var ran atomic.Int64
	b.startWorker("w-pause", func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		ran.Add(1)
		return worker.Echo(ctx, req)
	})
	if p, err := all.PauseTopic(ctx, "job.echo", true); err != nil || !p.Paused {
		t.Fatalf("pause: %+v, %v", p, err)
	}
	if _, err := b.client(keyA).PauseTopic(ctx, "job.echo", false); apiStatus(err) != 403 {
		t.Fatalf("a tenant key resuming: %v, want 403", err)
	}
	if _, err := b.client(keyAllClient).PauseTopic(ctx, "job.echo", false); apiStatus(err) != 403 {
		t.Fatalf("an all-tenant client key resuming: %v, want 403", err)
	}
	pl, err := all.Pools(ctx)
	if err != nil || !slices.ContainsFunc(pl.Topics, func(m admin.TopicMapping) bool { return m.Topic == "job.echo" && m.Paused }) {
		t.Fatalf("pools: %+v, %v: want job.echo paused", pl.Topics, err)
	}
	// A second replica, started after the pause (as after a restart).
	pools, _ := troupe.ParsePools([]byte(testPools))
	cfg := troupe.Config{NodeID: "node-b", NATSURL: b.env.NATSURL, RedisURL: b.env.RedisURL,
		KeyPrefix: b.env.KeyPrefix(), SubjectPrefix: b.env.Prefix, StreamPrefix: b.env.StreamPrefix(),
		Pools: pools, Tuning: troupe.Tuning{PermanentGrace: 100 * time.Millisecond, MaxSchedulingAttempts: 1}, Logger: quiet()}
	testhook.SetBackoff(&cfg, func(int) time.Duration { return 50 * time.Millisecond })
	nb, err := troupe.NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := nb.Start(sctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nb.Stop(context.Background()) })
	for _, n := range []*troupe.Node{b.node, nb} {
		waitFor(t, "pause applied on "+n.ID(), func() bool { return inspect.Of(n).PoolConfig().Paused["job.echo"] })
	}
	ids := []string{"pz-1", "pz-2", "pz-3", "pz-4"}
	for _, id := range ids {
		req := echoReq(id, "a")
		req.Labels = map[string]string{"cordum.batch": "pz"} // not a placement label
		if err := nb.Submit(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		if j := b.waitState(all, id, "SCHEDULED"); j.Reason != "pool_paused" {
			waitFor(t, id+" waits pool_paused", func() bool { j, err := all.Job(ctx, id); return err == nil && j.Reason == "pool_paused" })
		}
	}
	if n := ran.Load(); n != 0 {
		t.Fatalf("a paused topic's job ran (%d)", n)
	}
	if l, err := all.SearchJobs(ctx, admin.JobFilter{State: "SCHEDULED", Q: "pz-"}, 10, ""); err != nil || len(l.Jobs) != 4 {
		t.Fatalf("paused jobs listed: %+v, %v", l.Jobs, err)
	}
	// A label filter finds them too, waiting with a record or without one
	// (the router's queue keeps each waiting job's labels).
	if l, err := all.SearchJobs(ctx, admin.JobFilter{Labels: []string{"cordum.batch=pz"}}, 10, ""); err != nil || len(l.Jobs) != 4 {
		t.Fatalf("paused jobs by label: %+v, %v", l.Jobs, err)
	}
	if _, err := all.Cancel(ctx, "pz-4", "not needed", ""); err != nil {
		t.Fatal(err)
	}
	b.waitState(all, "pz-4", "CANCELLED")
	waitFor(t, "node-b hears the worker", func() bool {
		ws, err := inspect.Of(nb).Workers()
		return err == nil && slices.ContainsFunc(ws, func(w router.WorkerInfo) bool { return w.ID == "w-pause" })
	})
	if err := inspect.Of(nb).ResumeTopic(ctx, "job.echo"); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids[:3] {
		b.waitState(all, id, "SUCCEEDED")
	}
	if n := ran.Load(); n != 3 {
		t.Fatalf("%d jobs ran after the resume, want 3", n)
	}
	if pl, err := all.Pools(ctx); err != nil || slices.ContainsFunc(pl.Topics, func(m admin.TopicMapping) bool { return m.Paused }) {
		t.Fatalf("pools after resume: %+v, %v", pl.Topics, err)
	}
}

// waitFor polls cond for up to 15 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out waiting: %s", what)
}

// TestSeriesAndSagaList: GET /v1/series shows the jobs just run (queue
// counts, outcomes, dispatch latency) and GET /v1/sagas lists a workflow
// whose step recorded a compensation.
func TestSeriesAndSagaList(t *testing.T) {
	t.Parallel()
	b := setup(t, options{keys: testKeys, admin: func(c *admin.Config) {
		c.SampleEvery, c.SeriesStep = 100*time.Millisecond, 100*time.Millisecond
	}})
	ctx := context.Background()
	all := b.client(keyAll)
	b.startWorker("w-series", worker.Echo)
	for _, id := range []string{"se-1", "se-2"} {
		req := echoReq(id, "a")
		req.WorkflowId = "wf-series"
		req.Compensation = &capv1.Compensation{Topic: "job.echo"}
		if _, err := all.Submit(ctx, req); err != nil {
			t.Fatal(err)
		}
		b.waitState(all, id, "SUCCEEDED")
	}
	waitFor(t, "a series point with the two successes", func() bool {
		s, err := all.Series(ctx, "1m")
		if err != nil {
			t.Fatal(err)
		}
		var ok int64
		p95 := 0.0
		for _, p := range s.Points {
			ok += p.Succeeded
			p95 = max(p95, p.DispatchP95)
		}
		return ok == 2 && p95 > 0
	})
	if _, err := b.client(keyA).Series(ctx, ""); apiStatus(err) != 403 {
		t.Fatalf("series with a tenant key: %v, want 403", err)
	}
	if _, err := all.Series(ctx, "soon"); apiStatus(err) != 400 {
		t.Fatalf("series window soon: %v, want 400", err)
	}
	l, err := all.Sagas(ctx, 10, "")
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(l.Sagas, func(s admin.SagaSummary) bool { return s.ID == "wf-series" })
	if i < 0 || l.Sagas[i].Steps != 2 || l.Sagas[i].State != "recorded" || l.Sagas[i].UpdatedAt.IsZero() {
		t.Fatalf("sagas: %+v, want wf-series with 2 steps, recorded", l.Sagas)
	}
}
