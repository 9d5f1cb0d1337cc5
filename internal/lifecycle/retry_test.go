package lifecycle

import (
	"errors"
	"testing"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// A write that failed (the store could not be asked) is tried again as the
// very same write, marked Retry — the shell then resubmits what it
// submitted, so the store rewrites the same DLQ outbox entry; every other
// write is a new one, not marked.
func TestRetriedWriteIsTheSameWriteMarkedRetry(t *testing.T) {
	d := newDriver(t)
	d.feed(&Submit{Req: &capv1.JobRequest{JobId: "job-1", Topic: "job.x"}})
	d.feed(&PolicyDone{Epoch: d.step, Dec: &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}})
	first, ok := find[*Write](d.feed(&PickReply{Epoch: d.step, WorkerID: "w1", Subject: "worker.w1.jobs"}))
	if !ok || first.Retry || first.Op.Kind != OpActivate {
		t.Fatalf("the create: %+v", first)
	}
	retry, ok := find[RetryWrite](d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Err: errors.New("redis: i/o timeout")}}))
	if !ok {
		t.Fatal("a failed write is not retried")
	}
	again, ok := find[*Write](d.feed(&RetryNow{Epoch: retry.Epoch}))
	if !ok || !again.Retry || again.Op != first.Op || again.Epoch == first.Epoch {
		t.Fatalf("the retry: %+v, first %+v", again, first)
	}
	d.step = again.Epoch
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateCreated, State: jobstate.StateDispatched, Fence: 1}})
	next, ok := find[*Write](d.feed(&Progress{P: &capv1.JobProgress{JobId: "job-1"}, From: "w1"}))
	if !ok || next.Retry || next.Op.Kind != OpTransition {
		t.Fatalf("the next write: %+v", next)
	}
}
