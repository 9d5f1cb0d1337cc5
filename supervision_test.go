package troupe_test

import (
	"context"
	"strings"
	"testing"

	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/supervisor"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// A job actor that fails with an error a restart cannot fix is stopped by
// its supervisor, and the job is marked FAILED (actor_failed), dead-lettered,
// and its worker told to cancel.
func TestFatalActorFailureMarksTheJobFailed(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	cancels := f.cancels()
	rec := newReceipts()
	f.startWorker("w1", true, rec, hang)
	f.submit(echoReq("job-fatal"))
	waitFor(t, rec.ch, "job-fatal") // the worker holds it: DISPATCHED
	f.node.DeliverToJob("job-fatal", &jobactor.Crash{Fatal: true})

	r := f.waitState("job-fatal", jobstate.StateFailed)
	if r.Reason != jobstate.ReasonActorFailed {
		t.Fatalf("reason %s: %s", r.Reason, reasons(r.History))
	}
	if !strings.Contains(r.ErrorMessage, "injected fatal crash") {
		t.Fatalf("error message %q does not say why", r.ErrorMessage)
	}
	f.waitDLQ(func(e store.DLQEntry) bool { return e.JobID == "job-fatal" && e.Reason == jobstate.ReasonActorFailed })
	waitFor(t, cancels, "job-fatal")
}

// A transient failure restarts the actor, which recovers the job from Redis
// and completes it; past the restart budget the job is failed instead of
// restarted for ever.
func TestTransientFailuresRestartWithinTheBudget(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	rec := newReceipts()
	release := make(chan struct{})
	f.startWorker("w1", true, rec, holdUntil(release))

	f.submit(echoReq("job-blip"))
	waitFor(t, rec.ch, "job-blip")
	f.node.DeliverToJob("job-blip", &jobactor.Crash{})
	f.submit(echoReq("job-flaky"))
	waitFor(t, rec.ch, "job-flaky")
	for i := 0; i <= supervisor.RestartBudget; i++ {
		f.node.DeliverToJob("job-flaky", &jobactor.Crash{})
	}
	r := f.waitState("job-flaky", jobstate.StateFailed)
	if r.Reason != jobstate.ReasonActorFailed || !strings.Contains(r.ErrorMessage, "transient") {
		t.Fatalf("past the budget: %s %q: %s", r.Reason, r.ErrorMessage, reasons(r.History))
	}
	close(release)
	r = f.waitState("job-blip", jobstate.StateSucceeded)
	if n := rec.count("job-blip"); n != 1 {
		t.Fatalf("the restarted job reached the worker %d times", n)
	}
}

// holdUntil answers each job once release is closed.
func holdUntil(release chan struct{}) worker.Handler {
	return func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return worker.Echo(ctx, req)
	}
}
