package lifecycle

import (
	"strconv"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Retries: a job whose worker failed an attempt (a FAILED or TIMEOUT
// result, or the worker lost while running it) runs again under its retry
// policy (Config.Retry), as the same job.
//
// The rule:
//   - Only those outcomes retry; FAILED_FATAL, DENIED, CANCELLED, an output
//     quarantined, and every outcome Troupe decides itself (deadlines,
//     cancels, scheduling failures) are final.
//   - A retry is DISPATCHED or RUNNING → SCHEDULED (retry_wait), written
//     with the next attempt's number (try), when it runs (retry_at, also
//     the job's due time, so a replica adopts the wait if this node dies)
//     and the failed attempt's error (te<n>). The job keeps its lock and a
//     timer; at retry_at it asks for a worker like any SCHEDULED job —
//     a rate-limited job first takes its units again (every attempt calls
//     the API the bucket protects), and waits for them as a first attempt
//     does (ratewait.go).
//   - A retry is only made while attempts remain and it would start before
//     the job's budget deadline; otherwise the failure is final.
//   - A job that may retry is dispatched under its attempt's id
//     (jobstate.AttemptID, "<id>~a<n>"), and told its attempt number in its
//     env (the shell): a result or progress naming another attempt than the
//     job's is ignored, so an earlier attempt never ends a later one; and
//     the worker's results never reach a client waiting on the job's own
//     id — the node tells the client the job's one final outcome
//     (TellClient, relaying the worker's result).

// EnvAttempt is the env entry a dispatched request tells its worker the
// attempt number in ("1", "2", ...), for jobs that may retry.
const EnvAttempt = "TROUPE_ATTEMPT"

// retryPolicy is the job's retry policy (read once its request is known).
func (j *Job) retryPolicy() jobstate.RetryPolicy {
	if !j.retrySet && j.Req != nil {
		j.retrySet = true
		if j.cfg.Retry != nil {
			j.retry = j.cfg.Retry(j.Req)
		}
	}
	return j.retry
}

// Attempt is the number of the job's current (or next) attempt, from 1.
func (j *Job) Attempt() int { return max(j.try, 1) }

// Retries reports whether the job may run more than once (its dispatches
// carry attempt ids).
func (j *Job) Retries() bool { return j.retryPolicy().Retries() }

// WorkerJobID is the id the job's current attempt is dispatched under: its
// attempt id for a job that may retry, else its own id.
func (j *Job) WorkerJobID() string {
	if j.Retries() {
		return jobstate.AttemptID(j.ID, j.Attempt())
	}
	return j.ID
}

// staleAttempt reports whether id (a result's or progress's job id) names
// an attempt other than the job's current one.
func (j *Job) staleAttempt(id string) bool {
	_, n := jobstate.SplitAttempt(id)
	return n != 0 && n != j.Attempt()
}

// retryCause is the outcome a worker's result status retries for ("": it
// does not retry).
func retryCause(s capv1.JobStatus) jobstate.Reason {
	switch s {
	case capv1.JobStatus_JOB_STATUS_FAILED:
		return jobstate.ReasonWorkerFailed
	case capv1.JobStatus_JOB_STATUS_TIMEOUT:
		return jobstate.ReasonWorkerTimeout
	}
	return ""
}

// retryAfterFailure runs the job again if its policy allows, after the
// attempt failed for cause with the worker's code and msg; d is the
// delivery that brought the failure (acked once the retry is durable). It
// reports whether it did (false: the failure is final).
func (j *Job) retryAfterFailure(cause jobstate.Reason, code, msg string, d Delivery) bool {
	pol := j.retryPolicy()
	if cause == "" || !active(j.State) || j.Attempt() >= pol.MaxAttempts {
		return false
	}
	next := j.Attempt() + 1
	at := j.now().Add(pol.Backoff(next, j.in.OpID()))
	if ms := j.Req.GetBudget().GetDeadlineMs(); ms > 0 && !j.created.IsZero() &&
		!at.Before(j.created.Add(time.Duration(ms)*time.Millisecond)) {
		return false // it could not run before its deadline
	}
	if code == "" {
		code = string(cause)
	}
	j.disarm()
	j.withdraw()
	j.dropPick()
	if d != nil {
		j.acks = append(j.acks, d)
	}
	j.transition(&jobstate.Transition{Expect: jobstate.Expect(jobstate.StateDispatched, jobstate.StateRunning),
		Path: []jobstate.Hop{{To: jobstate.StateScheduled, Reason: jobstate.ReasonRetryWait}}, Due: at.UnixMilli(),
		Fields: []string{jobstate.FieldTry, strconv.Itoa(next), jobstate.FieldRetryAt, strconv.FormatInt(at.UnixMilli(), 10),
			jobstate.FieldAttemptErr + strconv.Itoa(j.Attempt()), jobstate.AttemptErr(code, msg),
			"error_code", code, "error_message", msg, "lost_workers", ""}},
		nil, j.pend(pending{then: nRetry, at: at, applied: []Effect{
			Count{M: MRetried, Label: string(cause)},
			j.logFx(info, "attempt failed; retrying", "topic", j.topic(), "attempt", j.Attempt(), "of", pol.MaxAttempts,
				"cause", cause, "error_code", code, "retry_at", at),
		}}))
	return true
}

// retrying: the retry is durable; the next attempt waits for its time.
// What the job knew of the failed attempt's dispatch goes, its rate limit
// grant too: the failed attempt used it, and the next one calls the API
// again, so it takes its units again before its dispatch (rateGate also
// drops a grant made for another attempt than the job's).
func (j *Job) retrying(at time.Time) {
	j.try = j.Attempt() + 1
	j.retryAt = at
	j.lostWorkers, j.runnerKnown, j.lostNoted, j.recall = "", false, false, false
	j.deadline, j.deadlineWhy = time.Time{}, ""
	j.parkAt, j.resendAt, j.resends = time.Time{}, time.Time{}, 0
	j.rate.granted, j.rate.woken = false, false
	j.waitRetry()
}

// waitRetry waits out the rest of the retry's backoff: parked if
// RetryParkMin or more is left, else on the job's timer. A wait with
// events still to handle (they came during the retry's write) handles
// them first: its timer is armed for now, and the decision is made again
// when it fires.
func (j *Job) waitRetry() {
	if !j.retryParks() {
		j.arm(j.retryAt)
		return
	}
	if len(j.deferred) > 0 {
		j.arm(j.now())
		return
	}
	j.disarm()
	j.log(debug, "retry wait parks", "retry_at", j.retryAt)
	j.passivate()
}

// retryParks reports whether the job's retry wait is long enough to park,
// and the job in a state to: live with its lock, no step outstanding and
// no delivery left to ack.
func (j *Job) retryParks() bool {
	return j.cfg.RetryParkMin > 0 && j.State == jobstate.StateScheduled && !j.retryAt.IsZero() &&
		j.retryAt.Sub(j.now()) >= j.cfg.RetryParkMin && j.live() && j.LockValue != "" && !j.busy && len(j.acks) == 0
}

// tellFinal relays res, the worker's result that ended a job dispatched
// under attempt ids, to the job's client (nil: nothing owed).
func (j *Job) tellFinal(res *capv1.JobResult, ptr string) []Effect {
	if !j.Retries() {
		return nil
	}
	out := &capv1.JobResult{JobId: j.ID, Status: res.Status, ResultPtr: ptr, ErrorCode: res.ErrorCode,
		ErrorMessage: res.ErrorMessage, ExecutionMs: res.ExecutionMs, ArtifactPtrs: res.ArtifactPtrs}
	return []Effect{TellClient{Status: res.Status, Code: jobstate.Reason(res.ErrorCode), Msg: res.ErrorMessage, Res: out}}
}
