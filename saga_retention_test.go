package troupe_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/saga"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// A step's record expires 24 h after it ends; its compensation must not:
// a step that fails fatally later still gets the earlier step compensated.
func TestSagaCompensationRetainedWhileStackLives(t *testing.T) {
	t.Parallel()
	w := newSagaWorld(t, 2)
	w.startSagas("node-a", safety.AllowAll{})
	const wf = "wf-retained"
	w.runSteps([]*capv1.JobRequest{step(wf, 1, "job.echo")}, 2)

	// The first step's record expires, as its retention would have it.
	ctx, keys := context.Background(), w.node.Store().Keys()
	if err := w.env.Redis.PExpire(ctx, keys.Job(wf+"-s1"), time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if n, _ := w.env.Redis.Exists(ctx, keys.Job(wf+"-s1")).Result(); n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the step's record did not expire")
		}
	}
	w.runSteps([]*capv1.JobRequest{step(wf, 2, "job.echo")}, 2)

	p := w.waitRollback(wf)
	if sp := p.Steps[wf+"-s1"]; p.Status != saga.StatusCompleted || sp.Outcome != saga.OutcomeSucceeded {
		t.Fatalf("status %s, step 1 %+v", p.Status, sp)
	}
	if got, c1 := w.compIDs(), saga.CompensationJobID(wf, wf+"-s1"); !sameIDs(got, []string{c1}) {
		t.Fatalf("compensations received %v, want [%s]", got, c1)
	}
	w.mu.Lock()
	undo := w.comps[0].Env["UNDO"]
	w.mu.Unlock()
	if undo != wf+"-s1" {
		t.Fatalf("compensation env UNDO=%q", undo)
	}
	rep, err := saga.Describe(ctx, w.node.Store(), wf)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Steps) != 1 || rep.Steps[0].Topic != "job.echo" {
		t.Fatalf("report steps %+v", rep.Steps)
	}
}

// Every saga key a workflow leaves behind expires: those of a workflow that
// completed without a rollback, and those of one rolled back.
func TestSagaKeysExpire(t *testing.T) {
	t.Parallel()
	const retention = time.Hour
	f := newFixture(t, func(c *troupe.Config) {
		c.Tuning.SagaPoll = 100 * time.Millisecond
		c.Tuning.SagaRetention = retention
	})
	f.startWorker("w1", true, nil, func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		if req.Labels[saga.LabelIsCompensation] != "true" && req.StepIndex == 3 {
			return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_FAILED_FATAL}
		}
		return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED}
	})
	run := func(wf string, n int32) {
		for i := int32(1); i <= n; i++ {
			s := step(wf, i, "job.echo")
			f.submit(s)
			want := jobstate.StateSucceeded
			if i == 3 {
				want = jobstate.StateFailed
			}
			f.waitState(s.JobId, want)
		}
	}
	run("wf-done", 2) // completes: no rollback ever reads its stack
	run("wf-rb", 3)
	ctx, st := context.Background(), f.node.Store()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		rep, err := saga.Describe(ctx, st, "wf-rb")
		if err != nil {
			t.Fatal(err)
		}
		p := rep.Progress
		if p.Status == saga.StatusCompleted && !rep.Triggered && rep.LockHolder == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rollback of wf-rb: %+v", rep)
		}
	}

	var found []string
	iter := f.env.Redis.Scan(ctx, 0, f.env.KeyPrefix()+"*saga:*", 1000).Iterator()
	for iter.Next(ctx) {
		found = append(found, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"saga:stack:wf-done", "saga:stack:wf-rb", "saga:progress:wf-rb"} {
		ok := false
		for _, k := range found {
			ok = ok || strings.HasSuffix(k, want)
		}
		if !ok {
			t.Fatalf("no key *%s among %v", want, found)
		}
	}
	for _, k := range found {
		ttl, err := f.env.Redis.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 || ttl > retention {
			t.Errorf("key %s: ttl %v, want in (0, %v]", k, ttl, retention)
		}
	}
}
