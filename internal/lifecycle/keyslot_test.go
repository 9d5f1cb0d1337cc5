package lifecycle

import (
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// keyedDispatch takes a fresh job of concurrency key k (limit 1) to its
// dispatch write, the write's outcome arriving after took.
func keyedDispatch(t *testing.T, took time.Duration) (*driver, []Effect) {
	d := newDriver(t)
	d.j.cfg.KeyLimit = func(string) (int, string) { return 1, KeyQueue }
	d.feed(&Submit{Req: &capv1.JobRequest{JobId: "job-1", Topic: "job.x",
		Meta: &capv1.JobMetadata{Labels: map[string]string{LabelConcurrencyKey: "k"}}}})
	d.feed(&PolicyDone{Epoch: d.step, Dec: &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}})
	fx := d.feed(&PickReply{Epoch: d.step, WorkerID: "w1", Subject: "worker.w1.jobs"})
	ask, ok := find[AskKeySlot](fx)
	if !ok {
		t.Fatalf("the pick asked for no key slot: %v", fx)
	}
	d.feed(&KeySlotDone{Epoch: ask.Epoch, Outcome: KeyAdmitted})
	if _, ok := find[*Write](d.fx); !ok {
		t.Fatalf("the slot granted, no dispatch write: %v", d.fx)
	}
	d.now = d.now.Add(took)
	return d, d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateCreated, State: jobstate.StateDispatched, Fence: 1}})
}

// A dispatch made durable KeySlotFresh or more after its key slot was
// asked for is not published (the node's repair may have given the slot to
// another job meanwhile): the job goes back to SCHEDULED (concurrency_key),
// its worker's pick released, and asks for a worker and the slot again. A
// prompt dispatch is published.
func TestConcurrencyKeyDispatchOnAStaleSlotIsNotPublished(t *testing.T) {
	d, fx := keyedDispatch(t, KeySlotFresh-time.Second)
	if _, ok := find[*PublishRequest](fx); !ok {
		t.Fatalf("a dispatch written %s after its slot was not published: %v", KeySlotFresh-time.Second, fx)
	}

	d, fx = keyedDispatch(t, KeySlotFresh)
	if _, ok := find[*PublishRequest](fx); ok {
		t.Fatalf("a dispatch written %s after its slot was published: %v", KeySlotFresh, fx)
	}
	w, ok := find[*Write](fx)
	if !ok || w.Op.T == nil || w.Op.T.Final() != jobstate.StateScheduled ||
		w.Op.T.Path[0].Reason != jobstate.ReasonConcurrencyKey {
		t.Fatalf("the stale dispatch was not taken back to SCHEDULED (concurrency_key): %v", fx)
	}
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	if d.j.State != jobstate.StateScheduled {
		t.Fatalf("state %s after the stale dispatch was taken back", d.j.State)
	}
	rel, ok := find[*ToRouter](fx)
	if r, isRel := rel.Msg.(*Released); !ok || !isRel || r.WorkerID != "w1" || !r.Done {
		t.Fatalf("the worker's pick was not released: %v", fx)
	}
	if _, ok := find[*Arm](fx); !ok {
		t.Fatalf("no retry armed: %v", fx)
	}
	d.now = d.now.Add(time.Second)
	fx = d.feed(&Timer{Epoch: d.timer})
	if _, ok := find[*AskRouter](fx); !ok {
		t.Fatalf("the retry asked for no worker: %v", fx)
	}
	fx = d.feed(&PickReply{Epoch: d.step, WorkerID: "w1", Subject: "worker.w1.jobs"})
	if _, ok := find[AskKeySlot](fx); !ok {
		t.Fatalf("the retry asked for no key slot: %v", fx)
	}
}
