package troupe_test

import (
	"context"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// A kernel outage never fails a job, however long it lasts: a check the
// policy could not answer is not a scheduling attempt. Here the job is
// refused checks many times more than MaxSchedulingAttempts and stays
// PENDING, then runs once the kernel answers.
func TestKernelOutageNeverFailsALoneJob(t *testing.T) {
	t.Parallel()
	pol := &downPolicy{}
	f := newFixture(t, func(c *troupe.Config) {
		c.Policy = pol
		c.Tuning.MaxSchedulingAttempts = 3
		troupe.SetBackoff(c, func(int) time.Duration { return 20 * time.Millisecond })
	})
	f.startWorker("w1", true, newReceipts(), worker.Echo)
	f.waitWorkers(1)
	f.submit(echoReq("lone-outage"))
	deadline := time.Now().Add(20 * time.Second)
	for pol.checks.Load() < 12 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d checks in 20 s", pol.checks.Load())
		}
		r, err := f.node.Record(context.Background(), "lone-outage")
		if err == nil && r.State.Terminal() {
			t.Fatalf("job %s (%s) after %d refused checks with the kernel down", r.State, r.Reason, pol.checks.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	r, err := f.node.Record(context.Background(), "lone-outage")
	if err != nil || r.State != jobstate.StatePending {
		t.Fatalf("after %d refused checks: %v %v", pol.checks.Load(), r, err)
	}
	pol.up.Store(true)
	f.waitState("lone-outage", jobstate.StateSucceeded)
}

// A job waiting for a human can be cancelled: the cancel is applied (the
// job is CANCELLED), not handed back to JetStream by a passivating actor
// until it is dead-lettered.
func TestCancelOfJobAwaitingApproval(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) { c.Policy = labelPolicy{} })
	req := echoReq("approve-then-cancel")
	req.Labels = map[string]string{"cordum.policy": "approve"}
	f.submit(req)
	f.waitState("approve-then-cancel", jobstate.StateApprovalRequired)
	if err := f.node.Cancel(context.Background(), "approve-then-cancel", "no longer needed", "carol"); err != nil {
		t.Fatal(err)
	}
	r := f.waitStateWithin("approve-then-cancel", jobstate.StateCancelled, 10*time.Second)
	if r.Fields["cancelled_by"] != "carol" {
		t.Fatalf("cancelled record %v", r.Fields)
	}
}

// A result for a job with no record is not dead-lettered at once: a
// replica that lost the record with Redis recreates it a moment later, and
// the result must still find it. Here the result comes first and the job's
// submit within the hold: the result is handed back meanwhile (no DLQ entry)
// and, once the job exists, is not lost: the job runs and its own result
// ends it; the early result is never dead-lettered as unknown_job.
func TestResultForAMissingRecordIsHeld(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) { c.Tuning.UnknownHold = time.Minute })
	res, _ := bus.EncodeResult("", "w-early", &capv1.JobResult{JobId: "held-result", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED,
		WorkerId: "w-early"})
	f.publishRaw(f.subj.Result, res)
	f.startWorker("w1", true, newReceipts(), worker.Echo)
	f.waitWorkers(1)
	// The result has been offered and handed back at least once.
	deadline := time.Now().Add(15 * time.Second)
	for counter(t, f.node, "troupe_unknown_job_events_held_total", "") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the early result was never held")
		}
		time.Sleep(10 * time.Millisecond)
	}
	es, _ := f.node.Store().ListDLQ(context.Background(), 100)
	for _, e := range es {
		if e.JobID == "held-result" {
			t.Fatalf("dead-lettered within the hold: %+v", e)
		}
	}
	f.submit(echoReq("held-result"))
	f.waitState("held-result", jobstate.StateSucceeded)
}

// Node.Wait returns a job's record once it is terminal — at once for a job
// that ends on this node, within waitPoll for one that ends on another
// replica — and ctx's error while it is not.
func TestWaitReturnsTheTerminalRecord(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	other := newNodeOn(t, f, "node-b")
	rec := newReceipts()
	f.startWorker("w1", true, rec, worker.Echo)
	if err := f.node.WaitForWorkers(context.Background(), "echo", 1); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := f.node.Wait(short, "wait-never-submitted"); err != context.DeadlineExceeded {
		t.Fatalf("wait for a job that never ends: %v", err)
	}
	ctx, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	for _, n := range []*troupe.Node{f.node, other} {
		done := make(chan *store.JobRecord, 2)
		for _, waiter := range []*troupe.Node{f.node, other} {
			go func() {
				r, err := waiter.WaitRecord(ctx, "wait-"+n.ID())
				if err != nil {
					t.Error(err)
				}
				done <- r
			}()
		}
		if err := n.Submit(ctx, echoReq("wait-"+n.ID())); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			if r := <-done; r == nil || r.State != jobstate.StateSucceeded {
				t.Fatalf("waited record %+v", r)
			}
		}
	}
}
