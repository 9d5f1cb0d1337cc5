package lifecycle

import (
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// submitDelivery is a held submit whose acks and naks a test counts.
type submitDelivery struct{ acked, naked int }

func (d *submitDelivery) Ack() error                       { d.acked++; return nil }
func (d *submitDelivery) NakWithDelay(time.Duration) error { d.naked++; return nil }
func (d *submitDelivery) InProgress() error                { return nil }

// waitUnwritten takes a fresh job into a wait for room within its capacity
// grace (nothing written, its submit held), past the wait's first timer,
// where it looked for its record and found none.
func (d *driver) waitUnwritten(sub *submitDelivery) bool {
	if !d.beginUnwritten(sub) {
		return false
	}
	d.now = d.j.timerAt
	fx := d.feed(&Timer{Epoch: d.timer})
	if w, ok := find[*Write](fx); !ok || w.Op.Kind != OpActivate || w.Op.Create {
		return false // no look for the record at the first timer
	}
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateNotFound}})
	return d.j.res == Unwritten && !d.j.busy && !d.j.timerAt.IsZero()
}

// beginUnwritten takes a fresh job into a wait for room within its grace.
func (d *driver) beginUnwritten(sub *submitDelivery) bool {
	d.j.cfg.CapacityGrace, d.j.cfg.AdmissionHold = time.Minute, 2*time.Second
	d.feed(&Submit{Req: &capv1.JobRequest{JobId: "job-1", Topic: "job.x"}, Delivery: sub})
	d.feed(&PolicyDone{Epoch: d.step, Dec: &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}})
	fx := d.feed(&PickReply{Epoch: d.step, Queued: true, Reason: jobstate.ReasonPoolOverloaded})
	g, ok := find[*Grace](fx)
	return ok && g.Delta == 1 && d.j.res == Unwritten
}

// A job waiting for room within its grace looks for its record once, at
// the wait's first timer (one activation that creates nothing; none as the
// wait begins, so a wait a burst's drain ends sooner costs no read): a
// repeated submit of a job that exists — owned elsewhere, taken over here,
// or ended — is then no longer held as a new wait for up to the grace, with
// its submit and a grace budget, but acked, and the wait ended.
func TestRepeatedSubmitFindsTheRecordAtItsWaitsFirstTimer(t *testing.T) {
	found := map[string]*WriteResult{
		"owned elsewhere": {Status: ActivateBusy, State: jobstate.StateRunning, Holder: "n2|4"},
		"taken over": {Status: ActivateAdopted, State: jobstate.StateRunning, Fence: 3,
			Fields: map[string]string{"reason": string(jobstate.ReasonStarted), "worker": "w2",
				"deadline": "9999999999999", "deadline_kind": string(jobstate.ReasonRunningTimeout)}},
		"ended": {Status: ActivateTerminal, State: jobstate.StateSucceeded},
	}
	for name, r := range found {
		t.Run(name, func(t *testing.T) {
			d := newDriver(t)
			sub := &submitDelivery{}
			if !d.beginUnwritten(sub) {
				t.Fatalf("no wait within the grace: %v", d.fx)
			}
			if _, ok := find[*Write](d.fx); ok {
				t.Fatalf("a read as the wait began: %v", d.fx)
			}
			if at := d.j.timerAt; at.After(d.now.Add(2 * time.Second)) {
				t.Fatalf("first timer %v after the wait began, want the admission hold's end", at.Sub(d.now))
			}
			d.now = d.j.timerAt
			fx := d.feed(&Timer{Epoch: d.timer})
			w, ok := find[*Write](fx)
			if !ok || w.Op.Kind != OpActivate || w.Op.Create {
				t.Fatalf("no look for the record at the wait's first timer: %v", fx)
			}
			fx = d.feed(&WriteDone{Epoch: d.step, Res: *r})
			if g, ok := find[*Grace](fx); !ok || g.Delta != -1 || d.j.res == Unwritten {
				t.Errorf("the job of an existing record still waits unwritten (%s): %v", d.j.res, fx)
			}
			if a, ok := find[*Ack](fx); !ok || a.D != sub {
				t.Errorf("the repeated submit was not acked: %v", fx)
			}
			if d.j.queued {
				t.Errorf("still queued for room, the record %s", r.State)
			}
		})
	}
}

// An event that needs the job's record (a result, a progress, a worker's
// loss, a lost result stream) reaching a job that waits unwritten within
// its grace is none of this actor's — it never dispatched the job — and is
// absorbed as its SCHEDULED wait would absorb it (a result is offered
// again, for the node that did dispatch a job of this id): nothing is activated, the job's held
// submit is neither acked nor dead-lettered, and the wait goes on (issue
// 27, item 1; simulator seed 201626).
func TestUnwrittenWaitAbsorbsEventsThatNeedTheRecord(t *testing.T) {
	events := []any{
		&Result{Res: &capv1.JobResult{JobId: "job-1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, WorkerId: "w1"},
			Delivery: &submitDelivery{}, Published: time.Unix(1_000_000, 0)},
		&Progress{P: &capv1.JobProgress{JobId: "job-1", Status: capv1.JobStatus_JOB_STATUS_RUNNING}, From: "w1"},
		&WorkerLost{WorkerID: "w1"},
		&ResultsLost{},
	}
	for _, ev := range events {
		d := newDriver(t)
		sub := &submitDelivery{}
		if !d.waitUnwritten(sub) {
			t.Fatalf("no wait within the grace: %v", d.fx)
		}
		timer := d.timer
		fx := d.feed(ev)
		if w, ok := find[*Write](fx); ok {
			t.Errorf("%T: the unwritten wait wrote %v", ev, w.Op.Kind)
		}
		if _, ok := find[PublishDLQ](fx); ok || sub.acked+sub.naked > 0 {
			t.Errorf("%T: the job's held submit was answered (acked %d, naked %d) or dead-lettered: %v",
				ev, sub.acked, sub.naked, fx)
		}
		if r, ok := ev.(*Result); ok {
			// Its submit may repeat a job another node dispatched (CI's
			// TestFaultStreamDeletedMidDeletion/submit lost 50 results
			// acked here): the result is offered again, not taken.
			if n, ok := find[Nak](fx); !ok || n.D != r.Delivery || n.Delay != UnwrittenResultRetry {
				t.Errorf("result of no dispatch of this actor: %v, want it offered again in %v", fx, UnwrittenResultRetry)
			}
			if _, ok := find[*Ack](fx); ok {
				t.Errorf("result of no dispatch of this actor acked (lost if another node dispatched the job): %v", fx)
			}
		}
		if !(d.j.res == Unwritten) || !d.j.queued || d.j.busy || d.timer != timer {
			t.Errorf("%T: the wait did not go on (unwritten %v, queued %v, busy %v, timer %d→%d)",
				ev, (d.j.res == Unwritten), d.j.queued, d.j.busy, timer, d.timer)
		}
	}
}

// An activation that finds the record of a job waiting unwritten moved on
// (another node created and ran it: ADOPTED RUNNING) ends the wait: the
// grace is left, the queue place withdrawn, and no capacity recheck of the
// old wait is left to ask the router for a worker for a RUNNING job (issue
// 27, item 1; simulator seed 212048).
func TestAdoptedActivationEndsTheUnwrittenWait(t *testing.T) {
	d := newDriver(t)
	sub := &submitDelivery{}
	if !d.waitUnwritten(sub) {
		t.Fatalf("no wait within the grace: %v", d.fx)
	}
	// The recheck: the router now refuses the topic, so the failure is
	// written — the job's record exists already, RUNNING elsewhere.
	d.now = d.now.Add(CapacityRecheck)
	fx := d.feed(&Timer{Epoch: d.timer})
	if _, ok := find[*AskRouter](fx); !ok {
		t.Fatalf("no recheck at CapacityRecheck: %v", fx)
	}
	picked := d.feed(&PickReply{Epoch: d.step, Reason: jobstate.ReasonTopicUnmapped, Detail: "no route"})
	if w, ok := find[*Write](picked); !ok || w.Op.Kind != OpActivate {
		t.Fatalf("placement failure of an unwritten job: %v, want an activation", picked)
	}
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateAdopted, State: jobstate.StateRunning,
		Fence: 2, Fields: map[string]string{"reason": string(jobstate.ReasonStarted), "worker": "w2",
			"deadline": "9999999999999", "deadline_kind": string(jobstate.ReasonRunningTimeout)}}})
	// The grace ends once, when the recheck is answered or at the latest
	// when the activation's outcome arrives.
	var left int64
	for _, e := range append(append([]Effect(nil), picked...), fx...) {
		if g, ok := e.(*Grace); ok {
			left += g.Delta
		}
	}
	if left != -1 || (d.j.res == Unwritten) {
		t.Errorf("adopted RUNNING: grace not left once (delta %d, unwritten %v): %v then %v", left, (d.j.res == Unwritten), picked, fx)
	}
	if a, ok := find[*Ack](fx); !ok || a.D != sub {
		t.Errorf("adopted: the held submit was not acked (the job exists): %v", fx)
	}
	if d.j.queued {
		t.Errorf("adopted RUNNING: still queued for room")
	}
	if d.j.State != jobstate.StateRunning || d.j.timerAt.IsZero() {
		t.Fatalf("state %s, timer %v: want RUNNING with its wait armed", d.j.State, d.j.timerAt)
	}
	d.now = d.j.timerAt
	if _, ok := find[*AskRouter](d.feed(&Timer{Epoch: d.timer})); ok {
		t.Fatalf("a RUNNING job asked the router for a worker: %v", d.fx)
	}
}

// The grace of a job waiting unwritten ends while the job's record, created
// by another node, has moved on: the wait's write finds it RUNNING, and the
// job's place in the router's queue is given up rather than left to be
// placed (issue 27, item 1).
func TestAdoptedAtGraceEndWithdrawsTheQueuePlace(t *testing.T) {
	d := newDriver(t)
	if !d.waitUnwritten(&submitDelivery{}) {
		t.Fatalf("no wait within the grace: %v", d.fx)
	}
	d.j.graceEnd = d.now.Add(5 * time.Second)
	var fx []Effect
	for range 3 {
		d.now = d.j.timerAt
		if fx = d.feed(&Timer{Epoch: d.timer}); d.j.busy {
			break
		}
	}
	if w, ok := find[*Write](fx); !ok || w.Op.Kind != OpActivate || !w.Op.Create {
		t.Fatalf("grace over: %v, want the wait written (a create)", fx)
	}
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateAdopted, State: jobstate.StateRunning,
		Fence: 2, Fields: map[string]string{"reason": string(jobstate.ReasonStarted), "worker": "w2",
			"deadline": "9999999999999", "deadline_kind": string(jobstate.ReasonRunningTimeout)}}})
	withdrawn := false
	for _, e := range fx {
		if m, ok := e.(*ToRouter); ok {
			if _, ok := m.Msg.(*Withdraw); ok {
				withdrawn = true
			}
		}
	}
	if !withdrawn || d.j.queued || (d.j.res == Unwritten) {
		t.Errorf("adopted RUNNING at the grace's end: queue place kept (withdrawn %v, queued %v, unwritten %v): %v",
			withdrawn, d.j.queued, (d.j.res == Unwritten), fx)
	}
}

// A job waiting unwritten whose previous actor failed for good (Abandon)
// has its wait written first, so the failure lands on a record: SCHEDULED
// is created, the held submit acked with it, then FAILED actor_failed.
func TestAbandonedUnwrittenWaitIsRecordedThenFailed(t *testing.T) {
	d := newDriver(t)
	sub := &submitDelivery{}
	if !d.waitUnwritten(sub) {
		t.Fatalf("no wait within the grace: %v", d.fx)
	}
	fx := d.feed(&Abandon{Detail: "actor failed"})
	w, ok := find[*Write](fx)
	if !ok || w.Op.Kind != OpActivate || !w.Op.Create || w.Op.T == nil || w.Op.T.Final() != jobstate.StateScheduled {
		t.Fatalf("abandoned unwritten wait: %v, want its wait written (created SCHEDULED)", fx)
	}
	if g, ok := find[*Grace](fx); !ok || g.Delta != -1 {
		t.Errorf("abandoned unwritten wait: grace not left: %v", fx)
	}
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateCreated, State: jobstate.StateScheduled, Fence: 1}})
	if a, ok := find[*Ack](fx); !ok || a.D != sub {
		t.Errorf("wait written: held submit not acked: %v", fx)
	}
	w, ok = find[*Write](fx)
	if !ok || w.Op.Kind != OpTransition || w.Op.T.Final() != jobstate.StateFailed ||
		w.Op.T.Path[0].Reason != jobstate.ReasonActorFailed {
		t.Fatalf("after the wait was written: %v, want FAILED actor_failed", fx)
	}
}
