package lifecycle

import (
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// rateDriver is a driver whose jobs take one unit of bucket "b" and park
// their wait for it after a second.
func rateDriver(t *testing.T) *driver {
	d := newDriver(t)
	d.j.cfg.RateLimit = func(*capv1.JobRequest) (string, int, string) { return "b", 1, "" }
	d.j.cfg.RateParkAfter = time.Second
	return d
}

// parkedRecord is the record of job-1 parked on n1 waiting for its token.
func parkedRecord(t *testing.T) *WriteResult {
	raw, err := jobstate.EncodeRequest(&capv1.JobRequest{JobId: "job-1", Topic: "job.x"})
	if err != nil {
		t.Fatal(err)
	}
	return &WriteResult{Status: ActivateAdopted, State: jobstate.StateScheduled, Fence: 2, Holder: "n1|1|p",
		Fields: map[string]string{"s": string(jobstate.StateScheduled), "reason": string(jobstate.ReasonRateLimited),
			"rate_bucket": "b", "rate_units": "1", "req": string(raw), "created": "1"}}
}

// A cancel that wakes a parked wait for tokens cancels the job: its actor
// asks again (keeping the place), handles the cancel rather than parking
// again with the cancel held (which would hand it back for ever), and
// leaves the limiter's queue (found by TestRateLimitWaitingJobIsCancellable…).
func TestRateParkedWaitWokenByCancelIsCancelled(t *testing.T) {
	d := rateDriver(t)
	d.feed(&Cancel{C: &capv1.JobCancel{JobId: "job-1"}})
	fx := d.feed(&WriteDone{Epoch: d.step, Res: *parkedRecord(t)})
	take, ok := find[TakeTokens](fx)
	if !ok {
		t.Fatalf("the woken wait did not ask for its tokens again: %v", fx)
	}
	fx = d.feed(&Tokens{Epoch: take.Epoch, Bucket: "b", Units: 1})
	if w, ok := find[*Write](fx); ok && w.Op.Kind == OpPark {
		t.Fatalf("parked again with the cancel held: %v", fx)
	}
	leave, ok := find[LeaveTokens](fx)
	if !ok || leave.Epoch != take.Epoch {
		t.Fatalf("the cancelled job did not leave the queue under its ask's epoch: %v", fx)
	}
	w, ok := find[*Write](fx)
	if !ok || w.Op.T == nil || w.Op.T.Final() != jobstate.StateCancelled {
		t.Fatalf("no CANCELLED write: %v", fx)
	}
}

// A grant handed to a fresh actor (the wake of a parked wait) is used once:
// the job asks the router without asking the limiter again; if the job is
// no longer there to use it, the units go back.
func TestRateWakeGrantIsUsedOnceOrGivenBack(t *testing.T) {
	d := rateDriver(t)
	d.feed(&Tokens{Granted: true, Bucket: "b", Units: 1})
	fx := d.feed(&WriteDone{Epoch: d.step, Res: *parkedRecord(t)})
	if _, ok := find[TakeTokens](fx); ok {
		t.Fatalf("a woken job with its grant asked the limiter again: %v", fx)
	}
	if _, ok := find[*AskRouter](fx); !ok {
		t.Fatalf("a woken job with its grant did not ask the router: %v", fx)
	}

	d = rateDriver(t)
	d.feed(&Tokens{Granted: true, Bucket: "b", Units: 1})
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateBusy, Holder: "n2|5"}})
	leave, ok := find[LeaveTokens](fx)
	if !ok || leave.Return != 1 {
		t.Fatalf("a grant the job cannot use (another node holds it) was not given back: %v", fx)
	}
}

// rateRetryDriver is a rateDriver whose jobs retry (3 attempts, a 100 ms
// backoff doubling to 1 s).
func rateRetryDriver(t *testing.T) *driver {
	d := rateDriver(t)
	d.j.cfg.Retry = retryDriver(t).j.cfg.Retry
	return d
}

// retryAsksForTokens takes a rateRetryDriver's job to DISPATCHED, fails
// the attempt and lets its backoff pass: attempt 2 asks for its tokens.
func (d *driver) retryAsksForTokens() TakeTokens {
	d.t.Helper()
	d.rateDispatch()
	d.failAttempt()
	d.now = d.now.Add(2 * time.Second)
	take, ok := find[TakeTokens](d.feed(&Timer{Epoch: d.timer}))
	if !ok {
		d.t.Fatal("attempt 2 did not ask for its tokens")
	}
	return take
}

// rateDispatch takes a fresh rate-limited job through its token ask (granted
// at once) to DISPATCHED on w1.
func (d *driver) rateDispatch() {
	d.feed(&Submit{Req: &capv1.JobRequest{JobId: "job-1", Topic: "job.x"}})
	fx := d.feed(&PolicyDone{Epoch: d.step, Dec: &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}})
	take, ok := find[TakeTokens](fx)
	if !ok {
		d.t.Fatalf("the first attempt did not ask for its tokens: %v", fx)
	}
	d.feed(&Tokens{Epoch: take.Epoch, Granted: true, Bucket: "b", Units: 1})
	d.feed(&PickReply{Epoch: d.step, WorkerID: "w1", Subject: "worker.w1.jobs"})
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateCreated, State: jobstate.StateDispatched, Fence: 1}})
	if _, ok := find[*PublishRequest](fx); !ok {
		d.t.Fatalf("not dispatched: %s %v", d.j.State, fx)
	}
}

// failAttempt fails the current attempt and lets the retry's write apply.
func (d *driver) failAttempt() {
	d.result(d.j.WorkerJobID(), capv1.JobStatus_JOB_STATUS_FAILED)
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	if d.j.State != jobstate.StateScheduled || d.j.LastReason != jobstate.ReasonRetryWait {
		d.t.Fatalf("the failed attempt is not waiting to be retried: %s %s", d.j.State, d.j.LastReason)
	}
}

// A live retry takes the job's units again before its dispatch (each
// attempt calls the API the bucket protects; reusing the first attempt's
// grant let retries exceed the limit), once: a publish of the same attempt
// that failed and is made again takes none.
func TestRateLimitLiveRetryTakesItsUnitsAgain(t *testing.T) {
	d := rateRetryDriver(t)
	d.rateDispatch()
	d.failAttempt()
	d.now = d.now.Add(2 * time.Second)
	fx := d.feed(&Timer{Epoch: d.timer})
	take, ok := find[TakeTokens](fx)
	if !ok || take.Bucket != "b" || take.Units != 1 {
		t.Fatalf("attempt 2 did not ask for its tokens: %v", fx)
	}
	if _, asked := find[*AskRouter](fx); asked {
		t.Fatalf("attempt 2 asked for a worker before its tokens: %v", fx)
	}
	fx = d.feed(&Tokens{Epoch: take.Epoch, Granted: true, Bucket: "b", Units: 1})
	if _, ok := find[*AskRouter](fx); !ok {
		t.Fatalf("attempt 2's grant did not ask the router: %v", fx)
	}
	d.feed(&PickReply{Epoch: d.step, WorkerID: "w1", Subject: "worker.w1.jobs"})
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	if _, ok := find[*PublishRequest](fx); !ok || d.j.WorkerJobID() != "job-1~a2" {
		t.Fatalf("attempt 2 not dispatched: %s %v", d.j.WorkerJobID(), fx)
	}

	// The same attempt published again: no more units.
	d.feed(&PublishFailed{})
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	d.now = d.now.Add(time.Minute)
	fx = d.feed(&Timer{Epoch: d.timer})
	if _, took := find[TakeTokens](fx); took {
		t.Fatalf("attempt 2 placed again took its units twice: %v", fx)
	}
	if _, ok := find[*AskRouter](fx); !ok {
		t.Fatalf("attempt 2 was not placed again: %v", fx)
	}
}

// A retry that finds no tokens waits as a first attempt does: written
// SCHEDULED rate_limited (its attempt number kept), parked after
// RateParkAfter with its place in the queue, and the grant that wakes it
// dispatches the retry's attempt, taking no units again.
func TestRateLimitRetryWithoutTokensWaitsAndParksAsAFirstAttempt(t *testing.T) {
	d := rateRetryDriver(t)
	take := d.retryAsksForTokens()
	fx := d.feed(&Tokens{Epoch: take.Epoch, Bucket: "b", Units: 1})
	w, ok := find[*Write](fx)
	if !ok || w.Op.T == nil || w.Op.T.Final() != jobstate.StateScheduled || w.Op.T.Path[0].Reason != jobstate.ReasonRateLimited {
		t.Fatalf("attempt 2's wait for tokens is not written: %v", fx)
	}
	if f := fieldMap(w.Op.T.Fields); f[jobstate.FieldTry] != "" || f["rate_bucket"] != "b" {
		t.Fatalf("the wait's fields %v (the attempt number is the retry's, left as written)", f)
	}
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	d.now = d.now.Add(time.Second)
	// The park time asks again in memory (keeping the place), then parks.
	again, ok := find[TakeTokens](d.feed(&Timer{Epoch: d.timer}))
	if !ok {
		t.Fatal("attempt 2's wait did not ask again at its park time")
	}
	fx = d.feed(&Tokens{Epoch: again.Epoch, Bucket: "b", Units: 1})
	park, ok := find[ParkTokens](fx)
	if !ok || park.Epoch != again.Epoch {
		t.Fatalf("attempt 2's wait did not park with its place: %v", fx)
	}
	if w, ok := find[*Write](fx); !ok || w.Op.Kind != OpPark {
		t.Fatalf("no park write: %v", fx)
	}

	// The grant wakes the parked wait in a fresh actor.
	d = rateRetryDriver(t)
	d.feed(&Tokens{Granted: true, Bucket: "b", Units: 1})
	rec := parkedRecord(t)
	rec.Fields[jobstate.FieldTry] = "2"
	rec.Fields[jobstate.FieldRetryAt] = itoa64(d.now.Add(-time.Second).UnixMilli())
	fx = d.feed(&WriteDone{Epoch: d.step, Res: *rec})
	if _, took := find[TakeTokens](fx); took {
		t.Fatalf("the woken retry with its grant asked the limiter again: %v", fx)
	}
	d.feed(&PickReply{Epoch: d.step, WorkerID: "w1", Subject: "worker.w1.jobs"})
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	if _, ok := find[*PublishRequest](fx); !ok || d.j.WorkerJobID() != "job-1~a2" {
		t.Fatalf("the woken retry not dispatched as attempt 2: %s %v", d.j.WorkerJobID(), fx)
	}
}

// A retry wait that parked (or was adopted) asks for its tokens when its
// time comes, before a worker.
func TestRateLimitParkedRetryWaitTakesItsUnitsAtItsTime(t *testing.T) {
	d := rateRetryDriver(t)
	fx := d.wakeRetryWait(&Wake{}, d.now)
	if _, ok := find[TakeTokens](fx); !ok {
		t.Fatalf("a woken retry wait did not ask for its tokens: %v", fx)
	}
	if _, asked := find[*AskRouter](fx); asked {
		t.Fatalf("a woken retry wait asked for a worker before its tokens: %v", fx)
	}
}

// An actor whose lock lapsed after its attempt's grant, re-activating the
// job, finds a later attempt (another node ran the job and retried it
// meanwhile): that attempt takes its own units, not this actor's grant.
func TestRateLimitAttemptAdoptedByTheActorOfAnEarlierOneTakesItsUnits(t *testing.T) {
	d := rateRetryDriver(t)
	d.rateDispatch()
	d.feed(&LockLost{LockValue: d.j.LockValue, Vanished: true})
	req, _ := jobstate.EncodeRequest(&capv1.JobRequest{JobId: "job-1", Topic: "job.x"})
	fx := d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateAdopted, State: jobstate.StateScheduled, Fence: 3,
		Fields: map[string]string{"s": "SCHEDULED", "reason": "retry_wait", "try": "2",
			jobstate.FieldRetryAt: itoa64(d.now.Add(-time.Second).UnixMilli()), "req": string(req)}}})
	if d.j.Attempt() != 2 {
		t.Fatalf("adopted attempt %d, want 2", d.j.Attempt())
	}
	if _, ok := find[TakeTokens](fx); !ok {
		t.Fatalf("attempt 2 went on attempt 1's grant: %v", fx)
	}
	if _, asked := find[*AskRouter](fx); asked {
		t.Fatalf("attempt 2 asked for a worker before its tokens: %v", fx)
	}
}

// An actor restarted by supervision while its wait for tokens parks (the
// ask handed to the limiter with ParkTokens, the park write not yet
// answered) leaves the parked ask in the limiter's queue: the limiter's
// answer is the job's next actor's, through the node. Withdrawing it left
// the job parked with nothing to wake it (simulator seed 9400285).
func TestRestartDuringATokenParkLeavesTheAskToTheLimiter(t *testing.T) {
	d := rateRetryDriver(t)
	take := d.retryAsksForTokens()
	d.feed(&Tokens{Epoch: take.Epoch, Bucket: "b", Units: 1})
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	d.now = d.now.Add(time.Second)
	again, ok := find[TakeTokens](d.feed(&Timer{Epoch: d.timer}))
	if !ok {
		t.Fatal("the wait did not ask again at its park time")
	}
	fx := d.feed(&Tokens{Epoch: again.Epoch, Bucket: "b", Units: 1})
	if _, ok := find[ParkTokens](fx); !ok {
		t.Fatalf("the wait did not park: %v", fx)
	}
	fx = d.feed(&Restarting{})
	if leave, ok := find[LeaveTokens](fx); ok {
		t.Fatalf("the restart withdrew the parked ask from the limiter: %+v in %v", leave, fx)
	}

	// Before the park, a restart still leaves the queue (the ask is the
	// actor's own).
	d = rateRetryDriver(t)
	take = d.retryAsksForTokens()
	d.feed(&Tokens{Epoch: take.Epoch, Bucket: "b", Units: 1})
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	if leave, ok := find[LeaveTokens](d.feed(&Restarting{})); !ok || leave.Epoch != take.Epoch {
		t.Fatalf("a restart of a live wait did not leave the limiter's queue under its ask's epoch")
	}
}
