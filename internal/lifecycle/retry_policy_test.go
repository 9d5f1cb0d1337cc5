package lifecycle

import (
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// retryDriver is a driver whose jobs retry: 3 attempts, 100 ms doubling to 1 s.
func retryDriver(t *testing.T) *driver {
	d := newDriver(t)
	d.j.cfg.Retry = func(*capv1.JobRequest) jobstate.RetryPolicy {
		return jobstate.RetryPolicy{MaxAttempts: 3, BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second}
	}
	return d
}

func (d *driver) result(id string, st capv1.JobStatus) []Effect {
	return d.feed(&Result{Res: &capv1.JobResult{JobId: id, Status: st, WorkerId: "w1", ErrorCode: "boom", ErrorMessage: "flaky"}})
}

// redispatch runs the retry's timer and places the job on w1 again.
func (d *driver) redispatch() []Effect {
	d.now = d.now.Add(2 * time.Second)
	d.feed(&Timer{Epoch: d.timer})
	d.feed(&PickReply{Epoch: d.step, WorkerID: "w1", Subject: "worker.w1.jobs"})
	return d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
}

// A worker's FAILED attempt is written as a wait (SCHEDULED retry_wait,
// due at its retry time, with the next attempt's number and the failed
// attempt's error), nobody is told anything, and at its time the job is
// dispatched again under the next attempt's id.
func TestRetryPolicyFailedAttemptWaitsThenRunsAgainUnderTheNextAttemptID(t *testing.T) {
	d := retryDriver(t)
	d.dispatch()
	if got := d.j.WorkerJobID(); got != "job-1~a1" {
		t.Fatalf("first attempt dispatched as %q", got)
	}
	fx := d.result("job-1~a1", capv1.JobStatus_JOB_STATUS_FAILED)
	w, ok := find[*Write](fx)
	if !ok || w.Op.T == nil || w.Op.T.Final() != jobstate.StateScheduled || w.Op.T.Path[0].Reason != jobstate.ReasonRetryWait {
		t.Fatalf("the failure is not a retry wait: %v", fx)
	}
	f := fieldMap(w.Op.T.Fields)
	if f[jobstate.FieldTry] != "2" || f["te1"] != "boom: flaky" || f[jobstate.FieldRetryAt] != itoa64(w.Op.T.Due) {
		t.Fatalf("retry fields: %v due %d", f, w.Op.T.Due)
	}
	if wait := time.UnixMilli(w.Op.T.Due).Sub(d.now); wait < 50*time.Millisecond || wait > 100*time.Millisecond {
		t.Fatalf("first backoff %v, want 50–100 ms", wait)
	}
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	if _, told := find[TellClient](fx); told {
		t.Fatal("the client was told of a failed attempt that is retried")
	}
	if _, armed := find[*Arm](fx); !armed || d.j.State != jobstate.StateScheduled {
		t.Fatalf("no wait armed: %s %v", d.j.State, fx)
	}
	fx = d.redispatch()
	if _, ok := find[*PublishRequest](fx); !ok || d.j.State != jobstate.StateDispatched || d.j.WorkerJobID() != "job-1~a2" {
		t.Fatalf("attempt 2 not dispatched: %s %s %v", d.j.State, d.j.WorkerJobID(), fx)
	}
}

// A result of an earlier attempt — a slow worker, a repeat — ends nothing:
// it is acked and the job goes on with its current attempt.
func TestRetryPolicyEarlierAttemptsResultEndsNothing(t *testing.T) {
	d := retryDriver(t)
	d.dispatch()
	d.result("job-1~a1", capv1.JobStatus_JOB_STATUS_FAILED)
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	d.redispatch()
	for _, st := range []capv1.JobStatus{capv1.JobStatus_JOB_STATUS_SUCCEEDED, capv1.JobStatus_JOB_STATUS_FAILED} {
		fx := d.result("job-1~a1", st)
		if _, wrote := find[*Write](fx); wrote || d.j.State != jobstate.StateDispatched {
			t.Fatalf("attempt 1's %s moved attempt 2: %s %v", st, d.j.State, fx)
		}
	}
	d.feed(&Progress{P: &capv1.JobProgress{JobId: "job-1~a1", Status: capv1.JobStatus_JOB_STATUS_RUNNING}, From: "w1"})
	if d.j.State != jobstate.StateDispatched || d.j.busy {
		t.Fatalf("attempt 1's progress started attempt 2: %s", d.j.State)
	}
}

// The last attempt's failure is final, and the client hears it once,
// relayed under the job's own id; so does a success after retries.
func TestRetryPolicyLastAttemptIsFinalAndTheClientHearsItOnce(t *testing.T) {
	d := retryDriver(t)
	d.dispatch()
	for n := 1; n < 3; n++ {
		d.result(jobstate.AttemptID("job-1", n), capv1.JobStatus_JOB_STATUS_TIMEOUT)
		d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
		d.redispatch()
	}
	fx := d.result("job-1~a3", capv1.JobStatus_JOB_STATUS_FAILED)
	w, ok := find[*Write](fx)
	if !ok || w.Op.T.Final() != jobstate.StateFailed {
		t.Fatalf("attempt 3 of 3 not final: %v", fx)
	}
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	tell, ok := find[TellClient](fx)
	if !ok || tell.Res == nil || tell.Res.JobId != "job-1" || tell.Res.WorkerId != "" ||
		tell.Res.Status != capv1.JobStatus_JOB_STATUS_FAILED {
		t.Fatalf("the final outcome is not relayed under the job's id: %+v", tell)
	}
}

// FAILED_FATAL, DENIED and CANCELLED from a worker are final at the first
// attempt.
func TestRetryPolicyFatalOutcomesAreFinal(t *testing.T) {
	for _, st := range []capv1.JobStatus{capv1.JobStatus_JOB_STATUS_FAILED_FATAL, capv1.JobStatus_JOB_STATUS_DENIED,
		capv1.JobStatus_JOB_STATUS_CANCELLED} {
		d := retryDriver(t)
		d.dispatch()
		w, ok := find[*Write](d.result("job-1~a1", st))
		if !ok || !w.Op.T.Final().Terminal() {
			t.Fatalf("%s retried: %+v", st, w.Op)
		}
	}
}

// A worker lost while running the job is a failed attempt: retried, not
// FAILED worker_lost, while attempts remain.
func TestRetryPolicyWorkerLostRetries(t *testing.T) {
	d := retryDriver(t)
	d.j.cfg.WorkerLostGrace = time.Minute
	d.dispatch()
	d.feed(&Progress{P: &capv1.JobProgress{JobId: "job-1~a1", Status: capv1.JobStatus_JOB_STATUS_RUNNING}, From: "w1"})
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	d.feed(&WorkerLost{WorkerID: "w1"})
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	d.now = d.now.Add(2 * time.Minute)
	w, ok := find[*Write](d.feed(&Timer{Epoch: d.timer}))
	if !ok || w.Op.T.Final() != jobstate.StateScheduled || w.Op.T.Path[0].Reason != jobstate.ReasonRetryWait {
		t.Fatalf("a lost worker's attempt is not retried: %+v", w.Op)
	}
}

// A job adopted in its retry wait (its node died) waits out the rest of
// its backoff before it asks for a worker.
func TestRetryPolicyAdoptedWaitKeepsItsTime(t *testing.T) {
	d := retryDriver(t)
	at := d.now.Add(500 * time.Millisecond)
	d.feed(&Wake{})
	req, _ := jobstate.EncodeRequest(&capv1.JobRequest{JobId: "job-1", Topic: "job.x"})
	fx := d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateAdopted, State: jobstate.StateScheduled, Fence: 2,
		Fields: map[string]string{"s": "SCHEDULED", "reason": "retry_wait", "try": "2", "retry_at": itoa64(at.UnixMilli()),
			"req": string(req)}}})
	arm, ok := find[*Arm](fx)
	if _, asked := find[*AskRouter](fx); asked || !ok || !arm.At.Equal(time.UnixMilli(at.UnixMilli())) || d.j.Attempt() != 2 {
		t.Fatalf("adopted wait: %v (attempt %d)", fx, d.j.Attempt())
	}
}

// A placement the router gave the job's wait for capacity, held while
// the job was busy, is not used once the job has moved on to another
// attempt: here the wait's write found the job dispatched by another node
// (attempt 1, adopted), whose worker failed it; the retry waits for its
// time (and its rate limit tokens), and the held placement's slot goes
// back (simulator seed 2001243 dispatched attempt 2 at once on it).
func TestRetryPolicyPlacementHeldAcrossARetryIsGivenBack(t *testing.T) {
	d := retryDriver(t)
	d.feed(&Submit{Req: &capv1.JobRequest{JobId: "job-1", Topic: "job.x"}})
	d.feed(&PolicyDone{Epoch: d.step, Dec: &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}})
	fx := d.feed(&PickReply{Epoch: d.step, Queued: true, Reason: jobstate.ReasonPoolOverloaded})
	if _, ok := find[*Write](fx); !ok || !d.j.queued {
		t.Fatalf("the wait for capacity is not written: %v", fx)
	}
	// While the wait's write is under way, the other node's worker fails
	// attempt 1 and the router places the job: both wait for the write.
	d.result("job-1~a1", capv1.JobStatus_JOB_STATUS_FAILED)
	d.feed(&Placed{JobID: "job-1", Ticket: d.j.ticket, Reply: &PickReply{WorkerID: "w2", Subject: "worker.w2.jobs"}})
	req, _ := jobstate.EncodeRequest(&capv1.JobRequest{JobId: "job-1", Topic: "job.x"})
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateAdopted, State: jobstate.StateDispatched, Fence: 3,
		Fields: map[string]string{"s": "DISPATCHED", "reason": "dispatched", "worker": "w3", "subj": "worker.w3.jobs",
			"try": "1", "req": string(req), "created": itoa64(d.now.UnixMilli())}}})
	if w, ok := find[*Write](fx); !ok || w.Op.T == nil || w.Op.T.Path[0].Reason != jobstate.ReasonRetryWait {
		t.Fatalf("the adopted attempt's failure is not retried: %v", fx)
	}
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	if d.j.State != jobstate.StateScheduled || d.j.Attempt() != 2 {
		t.Fatalf("attempt 1's failure is not a retry: %s attempt %d %v", d.j.State, d.j.Attempt(), fx)
	}
	if w, ok := find[*Write](fx); ok {
		t.Fatalf("the retry was dispatched on the held placement before its time: %+v", w.Op)
	}
	freed := false
	for _, e := range fx {
		if m, ok := e.(*ToRouter); ok {
			if r, ok := m.Msg.(*Released); ok && r.WorkerID == "w2" && r.Done {
				freed = true
			}
		}
	}
	if !freed {
		t.Fatalf("the held placement's slot was not given back: %v", fx)
	}
}

func fieldMap(kv []string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func itoa64(n int64) string { return strconvI(n) }

func strconvI(n int64) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}
