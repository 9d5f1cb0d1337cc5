package lifecycle

import (
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// driver feeds a job scripted events and keeps what it needs to answer
// them: the epoch of its outstanding step and of its timer.
type driver struct {
	t     *testing.T
	j     *Job
	now   time.Time
	fx    []Effect
	step  uint64 // epoch of the last Write / AskPolicy / AskRouter
	timer uint64
	lost  bool // DataLost: Redis lost its data recently
}

func newDriver(t *testing.T) *driver {
	cfg := &Config{NodeID: "n1", IdemKey: func(a, b string) string { return a + b },
		TenantKey: func(t string) string { return t }, Dispatch: 5 * time.Minute,
		RunningFor: func(string) time.Duration { return time.Hour },
		Backoff:    func(int) time.Duration { return time.Second }, MaxSchedulingAttempts: 5,
		ParkAfter: 10 * time.Second, ResendAfter: -1}
	return &driver{t: t, j: New(cfg, "job-1", 0), now: time.Unix(1_000_000, 0)}
}

// driver is the core's Inputs: a fixed clock, a fixed write id.
func (d *driver) Now() time.Time          { return d.now }
func (d *driver) OpID() uint64            { return 7 }
func (d *driver) GraceRoom() bool         { return true }
func (d *driver) DataLost() bool          { return d.lost }
func (d *driver) Connected() bool         { return true }
func (d *driver) Count(Metric, string)    {}
func (d *driver) Observe(Metric, float64) {}

func (d *driver) feed(ev any) []Effect {
	d.fx = append(d.fx[:0], d.j.Step(ev, d)...)
	for _, e := range d.fx {
		switch e := e.(type) {
		case *Write:
			d.step = e.Epoch
		case *AskPolicy:
			d.step = e.Epoch
		case *AskRouter:
			d.step = e.Req.(*PickRequest).Epoch
		case *Arm:
			d.timer = e.Epoch
		}
	}
	return d.fx
}

func find[T Effect](fx []Effect) (T, bool) {
	for _, e := range fx {
		if v, ok := e.(T); ok {
			return v, true
		}
	}
	var zero T
	return zero, false
}

// dispatch takes a fresh job to DISPATCHED on worker w1.
func (d *driver) dispatch() {
	d.feed(&Submit{Req: &capv1.JobRequest{JobId: "job-1", Topic: "job.x"}})
	d.feed(&PolicyDone{Epoch: d.step, Dec: &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}})
	d.feed(&PickReply{Epoch: d.step, WorkerID: "w1", Subject: "worker.w1.jobs"})
	fx := d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateCreated, State: jobstate.StateDispatched, Fence: 1}})
	if _, ok := find[*PublishRequest](fx); !ok || d.j.State != jobstate.StateDispatched {
		d.t.Fatalf("not dispatched: %s %v", d.j.State, fx)
	}
}

// A job's worker's first progress (or its eviction) that reaches the actor
// after it parked the job — before the supervisor stopped it — is passed on
// to the job's next actor, not dropped (issue 16, defect 5).
func TestParkedJobPassesOnLateProgress(t *testing.T) {
	d := newDriver(t)
	d.dispatch()
	d.now = d.now.Add(10 * time.Second)
	fx := d.feed(&Timer{Epoch: d.timer})
	if w, ok := find[*Write](fx); !ok || w.Op.Kind != OpPark {
		t.Fatalf("no park after ParkAfter: %v", fx)
	}
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Parked: true}})
	if f, ok := find[Finish](fx); !ok || !f.Parked {
		t.Fatalf("parked job did not finish parked: %v", fx)
	}
	for _, ev := range []any{&Progress{P: &capv1.JobProgress{JobId: "job-1"}}, &WorkerLost{WorkerID: "w1"}} {
		fx = d.feed(ev)
		r, ok := find[Redeliver](fx)
		if !ok || len(r.Msgs) != 1 || r.Msgs[0] != ev {
			t.Fatalf("%T after parking: effects %v, want it passed on", ev, fx)
		}
	}
}

// A pick answered after the job stopped waiting for it (a stale epoch)
// frees the slot the router counted for it — unless it names the worker
// the job is dispatched to, whose slot is the job's (issue 16, defect 7).
func TestStalePickReplyFreesItsSlot(t *testing.T) {
	d := newDriver(t)
	d.dispatch()
	fx := d.feed(&PickReply{Epoch: d.step - 1, WorkerID: "w9", Subject: "worker.w9.jobs"})
	if m, ok := find[*ToRouter](fx); !ok || m.Msg.(*Released).WorkerID != "w9" || !m.Msg.(*Released).Done {
		t.Fatalf("stale pick of w9: %v, want its slot released", fx)
	}
	fx = d.feed(&PickReply{Epoch: d.step - 1, WorkerID: "w1", Subject: "worker.w1.jobs"})
	if _, ok := find[*ToRouter](fx); ok {
		t.Fatalf("stale pick naming the job's own worker released its slot: %v", fx)
	}
}

// A write refused as fenced emits none of the effects it was for (issue
// 16, defect 3, the core's half): the job stops.
func TestFencedWriteEmitsNoEffects(t *testing.T) {
	d := newDriver(t)
	d.dispatch()
	d.feed(&Cancel{C: &capv1.JobCancel{JobId: "job-1", Reason: "stop"}})
	fx := d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepFenced, Before: "n2|7"}})
	for _, e := range fx {
		switch e.(type) {
		case TellClient, PublishDLQ, CancelWorker, *PublishRequest, *Ack:
			t.Fatalf("fenced cancel emitted %T: %v", e, fx)
		}
	}
	if _, ok := find[Finish](fx); !ok {
		t.Fatalf("fenced job did not stop: %v", fx)
	}
}

// A worker evicted while it was in fact running the job answers after the
// job went back to SCHEDULED, or after it was dispatched again elsewhere:
// the answer ends the job (recorded as the result of an earlier dispatch),
// and a later dispatch is cancelled at its worker — the job does not run to
// the end twice, nor wait for a worker that already finished it (issue 20,
// item 1).
//
// With an output policy, the result waits for its phase 1 first and still
// carries both (the outcome was once written without them).
func TestResultOfAnEarlierDispatchEndsTheJob(t *testing.T) {
	for _, c := range []struct{ redispatched, progressFirst, output bool }{
		{false, false, false}, {true, false, false}, {true, true, false}, {false, false, true}, {true, false, true},
	} {
		redispatched := c.redispatched
		d := newDriver(t)
		d.j.cfg.Output = c.output
		d.dispatch()
		d.feed(&WorkerLost{WorkerID: "w1"})
		fx := d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
		if d.j.State != jobstate.StateScheduled {
			t.Fatalf("after worker_lost: %s %v", d.j.State, fx)
		}
		if redispatched {
			d.feed(&PickReply{Epoch: d.step, WorkerID: "w2", Subject: "worker.w2.jobs"})
			d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
			if d.j.State != jobstate.StateDispatched || d.j.Worker != "w2" {
				t.Fatalf("not dispatched again: %s on %s", d.j.State, d.j.Worker)
			}
			if c.progressFirst {
				// The evicted worker, alive after all, reports it runs the
				// job: the job's worker stays the later dispatch's.
				d.feed(&Progress{P: &capv1.JobProgress{JobId: "job-1"}, From: "w1"})
				d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
				if d.j.Worker != "w2" {
					t.Fatalf("progress of the earlier dispatch's worker took the job to %s", d.j.Worker)
				}
			}
		} else {
			d.feed(&PickReply{Epoch: d.step, Queued: true, Reason: jobstate.ReasonPoolOverloaded})
			d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
		}
		fx = d.feed(&Result{Res: &capv1.JobResult{JobId: "job-1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, WorkerId: "w1"}})
		if c.output {
			ask, ok := find[AskOutput](fx)
			if !ok {
				t.Fatalf("output on: the result did not ask the output policy: %v", fx)
			}
			fx = d.feed(&OutputDone{Epoch: ask.Epoch, Outcome: OutputOutcome{Phase: "meta", ContentChecked: true}, Res: ask.Res, Path: ask.Path})
		}
		w, ok := find[*Write](fx)
		if !ok || w.Op.T == nil || w.Op.T.Final() != jobstate.StateSucceeded {
			t.Fatalf("redispatched=%v: the earlier dispatch's result was not applied: %v", redispatched, fx)
		}
		if !strings.Contains(strings.Join(w.Op.T.Fields, " "), "result_of earlier_dispatch") {
			t.Fatalf("not recorded as an earlier dispatch's result: %v", w.Op.T.Fields)
		}
		fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
		_, cancelled := find[CancelWorker](fx)
		if d.j.State != jobstate.StateSucceeded || cancelled != redispatched {
			t.Fatalf("redispatched=%v output=%v: state %s, later dispatch cancelled %v: %v", redispatched, c.output, d.j.State, cancelled, fx)
		}
	}
}

// A RUNNING job on a worker that dedupes, told its result stream was
// recreated, repeats its dispatch until the worker answers (with a progress
// here; with its kept result, the job would end) — and a job on a worker
// that does not dedupe repeats nothing (issue 20, item 5).
func TestResultsLostAsksADedupingWorkerAgain(t *testing.T) {
	d := newDriver(t)
	d.j.cfg.ResendAfter = 5 * time.Second
	d.feed(&Submit{Req: &capv1.JobRequest{JobId: "job-1", Topic: "job.x"}})
	d.feed(&PolicyDone{Epoch: d.step, Dec: &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}})
	d.feed(&PickReply{Epoch: d.step, WorkerID: "w1", Subject: "worker.w1.jobs", Resend: true})
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateCreated, State: jobstate.StateDispatched, Fence: 1}})
	d.feed(&Progress{P: &capv1.JobProgress{JobId: "job-1", Status: capv1.JobStatus_JOB_STATUS_RUNNING}, From: "w1"})
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	if d.j.State != jobstate.StateRunning {
		t.Fatalf("state %s, want RUNNING", d.j.State)
	}

	fx := d.feed(&ResultsLost{})
	if p, ok := find[*PublishRequest](fx); !ok || !p.Resend || p.Subject != "worker.w1.jobs" {
		t.Fatalf("results lost: effects %v, want the dispatch repeated to w1", fx)
	}
	d.now = d.now.Add(10 * time.Second) // ResendAfter doubled
	if p, ok := find[*PublishRequest](d.feed(&Timer{Epoch: d.timer})); !ok || !p.Resend {
		t.Fatalf("no second repeat while the worker is silent: %v", d.fx)
	}
	d.feed(&Progress{P: &capv1.JobProgress{JobId: "job-1", Status: capv1.JobStatus_JOB_STATUS_RUNNING}, From: "w1"})
	for i := 0; i < 3; i++ {
		d.now = d.now.Add(30 * time.Second)
		if _, ok := find[*PublishRequest](d.feed(&Timer{Epoch: d.timer})); ok {
			t.Fatalf("dispatch repeated after the worker answered: %v", d.fx)
		}
	}

	plain := newDriver(t)
	plain.j.cfg.ResendAfter = 5 * time.Second
	plain.dispatch() // its pick does not allow a resend: the worker does not dedupe
	if _, ok := find[*PublishRequest](plain.feed(&ResultsLost{})); ok {
		t.Fatalf("dispatch repeated to a worker that does not dedupe: %v", plain.fx)
	}
}

// fieldsOf returns the record fields of the job's last write as a map.
func fieldsOf(t *testing.T, fx []Effect) map[string]string {
	t.Helper()
	w, ok := find[*Write](fx)
	if !ok || w.Op.T == nil {
		t.Fatalf("no write with a transition in %v", fx)
	}
	out := map[string]string{}
	for i := 0; i+1 < len(w.Op.T.Fields); i += 2 {
		out[w.Op.T.Fields[i]] = w.Op.T.Fields[i+1]
	}
	return out
}

// A new job's record is written without the dispatch flags that are not
// set (a missing flag reads as not set), but a dispatch of a job whose
// record exists writes all of them: an earlier dispatch may have set one.
func TestDispatchWritesUnsetFlagsOnlyOverAnExistingRecord(t *testing.T) {
	d := newDriver(t)
	d.feed(&Submit{Req: &capv1.JobRequest{JobId: "job-1", Topic: "job.x"}})
	d.feed(&PolicyDone{Epoch: d.step, Dec: &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}})
	fx := d.feed(&PickReply{Epoch: d.step, WorkerID: "w1", Subject: "worker.w1.jobs", StartsOnDelivery: true})
	f := fieldsOf(t, fx)
	if _, ok := f["tslot"]; ok {
		t.Errorf("a fresh record got tslot %q", f["tslot"])
	}
	if _, ok := f["resend"]; ok {
		t.Errorf("a fresh record got resend %q", f["resend"])
	}
	if f["sod"] != "1" || f["worker"] != "w1" || f["attempts"] != "1" {
		t.Errorf("fresh record fields %v", f)
	}
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateCreated, State: jobstate.StateDispatched, Fence: 1}})
	// The publish fails: back to SCHEDULED, then a new pick over the
	// existing record.
	d.feed(&PublishFailed{})
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	if d.j.State != jobstate.StateScheduled {
		t.Fatalf("state %s after a failed publish, want SCHEDULED", d.j.State)
	}
	d.now = d.now.Add(time.Minute)
	d.feed(&Timer{Epoch: d.timer})
	fx = d.feed(&PickReply{Epoch: d.step, WorkerID: "w2", Subject: "worker.w2.jobs"})
	f = fieldsOf(t, fx)
	if f["tslot"] != "0" || f["resend"] != "0" || f["sod"] != "0" || f["worker"] != "w2" {
		t.Errorf("a dispatch over an existing record wrote %v, want every flag", f)
	}
}

// A result heard on the result subject (the owner's own copy, issue 33)
// for a job with no record is dropped: the stream's copy of it is
// dead-lettered in its turn, once. The stream's copy itself is
// dead-lettered.
func TestHeardResultForAJobWithNoRecordIsNotDeadLettered(t *testing.T) {
	for _, heard := range []bool{true, false} {
		d := newDriver(t)
		res := &capv1.JobResult{JobId: "job-1", WorkerId: "w1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED}
		fx := d.feed(&Result{Res: res, Heard: heard})
		if w, ok := find[*Write](fx); !ok || w.Op.Kind != OpActivate || w.Op.Create {
			t.Fatalf("heard %v: effects %v, want an activation that creates nothing", heard, fx)
		}
		fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateNotFound}})
		w, wrote := find[*Write](fx)
		dlq := wrote && w.Op.Kind == OpDLQ
		if dlq == heard {
			t.Fatalf("heard %v: dead-lettered %v (effects %v)", heard, dlq, fx)
		}
		if _, done := find[Finish](fx); heard && !done {
			t.Fatalf("heard: the actor did not stop after dropping it: %v", fx)
		}
	}
}
