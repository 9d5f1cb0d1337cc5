package lifecycle

import (
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// tenantDispatch takes a fresh job of tenant t (limit 1) to its dispatch
// write, the write's outcome arriving after took.
func tenantDispatch(t *testing.T, took time.Duration) (*driver, []Effect) {
	d := newDriver(t)
	d.j.cfg.TenantLimit = func(string) int { return 1 }
	d.feed(&Submit{Req: &capv1.JobRequest{JobId: "job-1", Topic: "job.x", TenantId: "t"}})
	d.feed(&PolicyDone{Epoch: d.step, Dec: &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}})
	fx := d.feed(&PickReply{Epoch: d.step, WorkerID: "w1", Subject: "worker.w1.jobs"})
	if w, ok := find[*Write](fx); !ok || w.Op.Kind != OpAdmit {
		t.Fatalf("the pick asked for no tenant slot: %v", fx)
	}
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Admitted: true}})
	if w, ok := find[*Write](fx); !ok || w.Op.Kind != OpActivate {
		t.Fatalf("the slot granted, no dispatch write: %v", fx)
	}
	d.now = d.now.Add(took)
	return d, d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateCreated, State: jobstate.StateDispatched, Fence: 1}})
}

// A dispatch made durable TenantSlotFresh or more after its tenant slot
// was asked for is not published (the node's repair may have given the
// slot to another job of the tenant meanwhile): the job goes back to
// SCHEDULED (tenant_limit), giving its slot back and releasing its
// worker's pick, and asks for a worker and a slot again. A prompt
// dispatch is published.
func TestTenantLimitDispatchOnAStaleSlotIsNotPublished(t *testing.T) {
	d, fx := tenantDispatch(t, TenantSlotFresh-time.Second)
	if _, ok := find[*PublishRequest](fx); !ok {
		t.Fatalf("a dispatch written %s after its slot was not published: %v", TenantSlotFresh-time.Second, fx)
	}

	d, fx = tenantDispatch(t, TenantSlotFresh)
	if _, ok := find[*PublishRequest](fx); ok {
		t.Fatalf("a dispatch written %s after its slot was published: %v", TenantSlotFresh, fx)
	}
	w, ok := find[*Write](fx)
	if !ok || w.Op.T == nil || w.Op.T.Final() != jobstate.StateScheduled ||
		w.Op.T.Path[0].Reason != jobstate.ReasonTenantLimit {
		t.Fatalf("the stale dispatch was not taken back to SCHEDULED (tenant_limit): %v", fx)
	}
	if w.Op.TenantRelease != "t" {
		t.Fatalf("the stale dispatch's write gives the tenant slot back to %q, want t", w.Op.TenantRelease)
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
	if w, ok := find[*Write](fx); !ok || w.Op.Kind != OpAdmit {
		t.Fatalf("the retry asked for no tenant slot: %v", fx)
	}
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Admitted: true}})
	d.now = d.now.Add(time.Second)
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	if _, ok := find[*PublishRequest](fx); !ok {
		t.Fatalf("the dispatch on a slot asked for anew was not published: %v", fx)
	}
}

// A job adopted SCHEDULED asks for its tenant slot again before its
// dispatch, whatever its record's tslot flag says: the write that took it
// back from DISPATCHED gave the slot back and left the flag.
func TestTenantLimitAdoptedScheduledJobAsksForItsSlotAgain(t *testing.T) {
	d := newDriver(t)
	d.j.cfg.TenantLimit = func(string) int { return 1 }
	d.feed(&Wake{})
	req, _ := jobstate.EncodeRequest(&capv1.JobRequest{JobId: "job-1", Topic: "job.x", TenantId: "t"})
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateAdopted, State: jobstate.StateScheduled, Fence: 2,
		Fields: map[string]string{"s": "SCHEDULED", "reason": string(jobstate.ReasonWorkerLost), "tslot": "1", "worker": "w0",
			"req": string(req)}}})
	if d.j.admitted {
		t.Fatalf("a SCHEDULED record's tslot flag taken as a slot held")
	}
	fx := d.j.Step(&PickReply{Epoch: d.j.opEpoch, WorkerID: "w1", Subject: "worker.w1.jobs"}, d)
	if w, ok := find[*Write](fx); !ok || w.Op.Kind != OpAdmit {
		t.Fatalf("the adopted job's pick asked for no tenant slot: %v", fx)
	}
}
