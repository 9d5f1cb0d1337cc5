package lifecycle

import (
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Tests of the park decision of a retry wait (retry.go, waitRetry): a
// backoff with Config.RetryParkMin or more left parks, a shorter one keeps
// the actor and its timer.

// longRetryDriver is a driver whose jobs retry after 2–4 min and whose
// retry waits park from 30 s on.
func longRetryDriver(t *testing.T) *driver {
	d := newDriver(t)
	d.j.cfg.RetryParkMin = 30 * time.Second
	d.j.cfg.Retry = func(*capv1.JobRequest) jobstate.RetryPolicy {
		return jobstate.RetryPolicy{MaxAttempts: 3, BackoffMin: 4 * time.Minute, BackoffMax: 10 * time.Minute}
	}
	return d
}

// release reports the lock release among fx, if any.
func release(fx []Effect) (*Write, bool) {
	for _, e := range fx {
		if w, ok := e.(*Write); ok && w.Op.Kind == OpRelease {
			return w, true
		}
	}
	return nil, false
}

// A failed attempt whose backoff is long waits parked: once the retry wait
// is written the job releases its lock, arms no timer, and its actor
// finishes (not as a parked DISPATCHED job: nothing of it stays on the node).
func TestRetryPolicyLongBackoffParksTheWait(t *testing.T) {
	d := longRetryDriver(t)
	d.dispatch()
	d.result("job-1~a1", capv1.JobStatus_JOB_STATUS_FAILED)
	fx := d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	w, ok := release(fx)
	if !ok || w.Op.LockValue != "n1|1" || d.j.State != jobstate.StateScheduled {
		t.Fatalf("the retry wait did not release its lock: %s %v", d.j.State, fx)
	}
	if arm, armed := find[*Arm](fx); armed {
		t.Fatalf("a parking wait armed its timer for %v", arm.At)
	}
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Released: true}})
	fin, ok := find[Finish](fx)
	if !ok || fin.Parked || !d.j.Done() {
		t.Fatalf("the actor did not finish: %+v %v", fin, fx)
	}
}

// A short backoff (the 100 ms–1 s of a quick retry) keeps the actor, the
// lock and an exact timer, with the same threshold.
func TestRetryPolicyShortBackoffKeepsTheActor(t *testing.T) {
	d := retryDriver(t)
	d.j.cfg.RetryParkMin = 30 * time.Second
	d.dispatch()
	d.result("job-1~a1", capv1.JobStatus_JOB_STATUS_FAILED)
	fx := d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	if _, released := release(fx); released {
		t.Fatalf("a 100 ms backoff parked: %v", fx)
	}
	if arm, ok := find[*Arm](fx); !ok || !arm.At.Equal(d.j.retryAt) || d.j.LockValue == "" {
		t.Fatalf("no timer at the retry time %v: %v", d.j.retryAt, fx)
	}
	if fx = d.redispatch(); d.j.State != jobstate.StateDispatched || d.j.WorkerJobID() != "job-1~a2" {
		t.Fatalf("attempt 2 not dispatched: %v", fx)
	}
}

// No threshold (RetryParkMin ≤ 0) never parks, however long the backoff.
func TestRetryPolicyWithoutThresholdNeverParks(t *testing.T) {
	d := longRetryDriver(t)
	d.j.cfg.RetryParkMin = 0
	d.dispatch()
	d.result("job-1~a1", capv1.JobStatus_JOB_STATUS_FAILED)
	fx := d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	if _, released := release(fx); released {
		t.Fatalf("parked with parking off: %v", fx)
	}
	if _, ok := find[*Arm](fx); !ok {
		t.Fatalf("no timer: %v", fx)
	}
}

// wakeRetryWait activates the job from a record waiting for attempt 2 at
// at, as the due poller's wake (or an event) does for a parked wait.
func (d *driver) wakeRetryWait(ev any, at time.Time) []Effect {
	d.feed(ev)
	req, _ := jobstate.EncodeRequest(&capv1.JobRequest{JobId: "job-1", Topic: "job.x"})
	return d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateAdopted, State: jobstate.StateScheduled, Fence: 2,
		Fields: map[string]string{"s": "SCHEDULED", "reason": "retry_wait", "try": "2",
			jobstate.FieldRetryAt: itoa64(at.UnixMilli()), "req": string(req)}}})
}

// A parked wait woken at its time asks for a worker for attempt 2; woken
// with a long while left (an early event) it parks again; with less than
// the threshold left it keeps its actor until its time.
func TestRetryPolicyParkedWaitWokenByWhatIsLeft(t *testing.T) {
	for _, c := range []struct {
		name string
		left time.Duration
		want string
	}{
		{"due", 0, "ask"},
		{"overdue", -3 * time.Second, "ask"},
		{"short", 10 * time.Second, "arm"},
		{"long", 5 * time.Minute, "park"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := longRetryDriver(t)
			fx := d.wakeRetryWait(&Wake{}, d.now.Add(c.left))
			_, asked := find[*AskRouter](fx)
			arm, armed := find[*Arm](fx)
			_, parked := release(fx)
			got := map[bool]string{true: "ask"}[asked] + map[bool]string{true: "arm"}[armed] + map[bool]string{true: "park"}[parked]
			if got != c.want || d.j.Attempt() != 2 {
				t.Fatalf("woken with %v left: %q (armed %v), want %q; attempt %d; %v", c.left, got, arm.At, c.want, d.j.Attempt(), fx)
			}
		})
	}
}

// A cancel for a parked retry wait activates the job and cancels it: one
// CANCELLED write, no park first, and the client told once.
func TestRetryPolicyParkedWaitIsCancelled(t *testing.T) {
	d := longRetryDriver(t)
	fx := d.wakeRetryWait(&Cancel{C: &capv1.JobCancel{JobId: "job-1", Reason: "operator"}}, d.now.Add(5*time.Minute))
	if _, parked := release(fx); parked {
		t.Fatalf("parked again before the cancel: %v", fx)
	}
	w, ok := find[*Write](fx)
	for _, e := range fx {
		if e, isW := e.(*Write); isW && e.Op.T != nil {
			w, ok = e, true
		}
	}
	if !ok || w.Op.T == nil || w.Op.T.Final() != jobstate.StateCancelled {
		t.Fatalf("the cancel is not written: %v", fx)
	}
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	if _, told := find[TellClient](fx); !told || d.j.State != jobstate.StateCancelled || !d.j.Done() {
		t.Fatalf("cancelled: %s, done %v, %v", d.j.State, d.j.Done(), fx)
	}
	if _, parked := release(fx); parked {
		t.Fatalf("a cancelled job parked: %v", fx)
	}
}

// A late result of the failed attempt that reaches the parked wait is
// absorbed, and the wait parks again.
func TestRetryPolicyParkedWaitParksAgainAfterAnEarlierAttemptsResult(t *testing.T) {
	d := longRetryDriver(t)
	fx := d.wakeRetryWait(&Result{Res: &capv1.JobResult{JobId: "job-1~a1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED,
		WorkerId: "w1"}}, d.now.Add(5*time.Minute))
	if _, wrote := find[*Write](fx); wrote || d.j.State != jobstate.StateScheduled {
		t.Fatalf("attempt 1's result moved the wait: %s %v", d.j.State, fx)
	}
	arm, ok := find[*Arm](fx)
	if !ok || !arm.At.Equal(d.now) {
		t.Fatalf("no timer to park at once: %v", fx)
	}
	fx = d.feed(&Timer{Epoch: d.timer})
	if _, parked := release(fx); !parked {
		t.Fatalf("the wait did not park again: %v", fx)
	}
}

// A live retry wait whose record Redis lost is written back due at its
// retry time (not at the rescue time a plain recreate gets), so that once
// it parks it is brought back when its attempt is to run.
func TestRetryPolicyRecreatedWaitIsDueAtItsRetryTime(t *testing.T) {
	d := newDriver(t)
	d.j.cfg.RetryParkMin = 30 * time.Second
	d.j.cfg.Retry = func(*capv1.JobRequest) jobstate.RetryPolicy {
		return jobstate.RetryPolicy{MaxAttempts: 3, BackoffMin: 20 * time.Second, BackoffMax: 20 * time.Second}
	}
	d.dispatch()
	d.result("job-1~a1", capv1.JobStatus_JOB_STATUS_FAILED)
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	at := d.j.retryAt
	if at.IsZero() || d.j.LockValue == "" {
		t.Fatalf("no live retry wait: retry at %v, lock %q", at, d.j.LockValue)
	}
	d.now = d.now.Add(time.Second)
	d.feed(&LockLost{LockValue: d.j.LockValue, Vanished: true})
	fx := d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateNotFound}})
	w, ok := find[*Write](fx)
	if !ok || w.Op.Kind != OpActivate || !w.Op.Create || w.Op.T == nil || w.Op.T.Final() != jobstate.StateScheduled {
		t.Fatalf("the lost retry wait is not written back: %v", fx)
	}
	if w.Op.T.Due != at.UnixMilli() {
		t.Fatalf("written back due at %d, want its retry time %d", w.Op.T.Due, at.UnixMilli())
	}
}

// A retry wait that parks says so once its release applied (Alone, due at
// its retry time): the node indexes it, as nothing but its record will wake
// it; a short wait, which keeps its actor, says nothing.
func TestLostRecordRetryWaitThatParksIsReportedAlone(t *testing.T) {
	d := longRetryDriver(t)
	d.dispatch()
	d.result("job-1~a1", capv1.JobStatus_JOB_STATUS_FAILED)
	fx := d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	if _, ok := find[Alone](fx); ok {
		t.Fatalf("reported alone before its release applied: %v", fx)
	}
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Released: true}})
	a, ok := find[Alone](fx)
	if !ok || a.Kind != WaitRetry || !a.Due.Equal(d.j.retryAt) {
		t.Fatalf("parked retry wait not reported alone at %v: %+v %v", d.j.retryAt, a, fx)
	}

	s := retryDriver(t)
	s.j.cfg.RetryParkMin = 30 * time.Second
	s.dispatch()
	s.result("job-1~a1", capv1.JobStatus_JOB_STATUS_FAILED)
	if fx = s.feed(&WriteDone{Epoch: s.step, Res: WriteResult{Step: StepOK}}); len(fx) > 0 {
		if _, ok := find[Alone](fx); ok {
			t.Fatalf("a short wait (actor kept) reported alone: %v", fx)
		}
	}
}

// The wake a node sends, after Redis lost its data, to a wait it left
// alone: finding no record, the job is dead-lettered state_lost and its
// client told once — where a plain wake of a job with no record records
// nothing (a wake of a job that ended and expired).
func TestLostRecordWakeOfAWaitLeftAloneEndsStateLost(t *testing.T) {
	for _, c := range []struct {
		name       string
		lost, data bool
		dlq        bool
	}{{"lost wake, data lost", true, true, true}, {"plain wake, data lost", false, true, false},
		{"lost wake, no loss known", true, false, false}} {
		t.Run(c.name, func(t *testing.T) {
			d := newDriver(t)
			d.lost = c.data
			fx := d.feed(&Wake{Lost: c.lost})
			if w, ok := find[*Write](fx); !ok || w.Op.Kind != OpActivate || w.Op.Create {
				t.Fatalf("the wake did not read the record first: %v", fx)
			}
			fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateNotFound}})
			w, ok := find[*Write](fx)
			if !c.dlq {
				if ok {
					t.Fatalf("%s wrote %v", c.name, w.Op.Kind)
				}
				if !d.j.Done() {
					t.Fatalf("the actor did not finish: %v", fx)
				}
				return
			}
			if !ok || w.Op.Kind != OpDLQ || w.Op.DLQ.Reason != jobstate.ReasonStateLost {
				t.Fatalf("no state_lost DLQ write: %v", fx)
			}
			fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{}})
			tell, ok := find[TellClient](fx)
			if !ok || tell.Code != jobstate.ReasonStateLost || tell.Status != capv1.JobStatus_JOB_STATUS_FAILED || !tell.Once {
				t.Fatalf("client not told once, state_lost: %+v %v", tell, fx)
			}
			if _, ok := find[PublishDLQ](fx); !ok || !d.j.Done() {
				t.Fatalf("DLQ entry not announced or actor not done: %v", fx)
			}
		})
	}
}

// A lost wait's wake is owed to no one else (the sweep that sent it has
// dropped the wait from its node's index): an actor restarted by
// supervision before the job ends hands it back for its fresh instance
// (simulator seed 9103562: the restart lost it and the job never ended); a
// plain wake's actor hands nothing back.
func TestLostRecordWakeIsHandedOnAcrossAnActorRestart(t *testing.T) {
	for _, lost := range []bool{true, false} {
		d := newDriver(t)
		d.lost = true
		d.feed(&Wake{Lost: lost})
		fx := d.feed(&Restarting{})
		r, ok := find[Redeliver](fx)
		if !lost {
			if ok {
				t.Fatalf("a plain wake's restart handed back %v", r.Msgs)
			}
			continue
		}
		if !ok || len(r.Msgs) != 1 {
			t.Fatalf("the restart handed back no lost wake: %v", fx)
		}
		if w, ok := r.Msgs[0].(*Wake); !ok || !w.Lost {
			t.Fatalf("handed back %#v, want a lost wake", r.Msgs[0])
		}
		// The fresh instance, woken with it, ends the job state_lost.
		f := newDriver(t)
		f.lost = true
		f.feed(r.Msgs[0])
		fx = f.feed(&WriteDone{Epoch: f.step, Res: WriteResult{Status: ActivateNotFound}})
		if w, ok := find[*Write](fx); !ok || w.Op.Kind != OpDLQ || w.Op.DLQ.Reason != jobstate.ReasonStateLost {
			t.Fatalf("the fresh instance did not dead-letter the job state_lost: %v", fx)
		}
	}
}

// A lost wait's wake that reaches the actor while its activation (for
// another event) is outstanding is deferred, and still counts when the
// activation finds no record (simulator seed 2891: it was dropped).
func TestLostRecordWakeDeferredDuringAnActivationStillEndsStateLost(t *testing.T) {
	d := newDriver(t)
	d.lost = true
	d.feed(&Wake{})
	if fx := d.feed(&Wake{Lost: true}); len(fx) != 0 {
		t.Fatalf("the second wake was not deferred: %v", fx)
	}
	fx := d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateNotFound}})
	if w, ok := find[*Write](fx); !ok || w.Op.Kind != OpDLQ || w.Op.DLQ.Reason != jobstate.ReasonStateLost {
		t.Fatalf("no state_lost DLQ write: %v", fx)
	}
}
