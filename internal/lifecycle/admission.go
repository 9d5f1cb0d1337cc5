package lifecycle

import (
	"log/slog"
	"strconv"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Admission: a submit, its idempotency key, the input policy's decision
// (allow, constraints, approval, throttle, deny; unavailable means wait),
// approvals, and the failures decided before a job reaches a worker.

func (j *Job) onSubmit(m *Submit) {
	if j.TraceID == "" {
		j.TraceID = m.TraceID
	}
	if j.live() {
		// A duplicate submit of a live job: nothing changes.
		j.count(MAbsorbed, "submit")
		j.ack(m.Delivery)
		return
	}
	if j.Req == nil {
		j.Req = m.Req
	}
	if !m.Published.IsZero() && (j.submitted.IsZero() || m.Published.Before(j.submitted)) {
		j.submitted = m.Published
	}
	j.acks = append(j.acks, m.Delivery)
	if key := m.Req.GetMeta().GetIdempotencyKey(); key != "" && !j.idemChecked {
		j.write(j.pend(pending{kind: wClaim, op: Op{Kind: OpClaim, JobID: j.ID,
			IdemKey: j.cfg.IdemKey(jobstate.TenantOf(j.Req), key)}}))
		return
	}
	j.decideFresh()
}

// claimed: a submit whose idempotency key another job holds is that job.
func (j *Job) claimed(r *WriteResult) {
	j.idemChecked = true
	if r.Holder != j.ID {
		j.count(MIdemDuplicates, "")
		j.log(info, "submit is an idempotent duplicate", "existing_job_id", r.Holder,
			"reason", jobstate.ReasonIdempotentDuplicate)
		j.ackAll()
		j.finishIn(Ended)
		return
	}
	j.decideFresh()
}

// decideFresh makes the first decision about a submitted job before its
// record exists — policy, then placement — so that creating the record and
// applying that decision (typically PENDING → SCHEDULED → DISPATCHED) is
// one script call. If the job exists already, the decision is dropped and
// the job continues from its record.
func (j *Job) decideFresh() {
	j.State = jobstate.StatePending
	j.checkPolicy()
}

// checkPolicy asks the input policy about a PENDING job (or a submitted job
// not yet created).
func (j *Job) checkPolicy() {
	if j.Req == nil {
		j.fail(jobstate.ReasonInvalidRequest, "job record has no request", "")
		return
	}
	j.opEpoch++
	j.busy = true
	j.emitAskPolicy(AskPolicy{Epoch: j.opEpoch, Req: j.Req})
}

// onDecision acts on the input policy's answer.
func (j *Job) onDecision(pd *PolicyDone) {
	dec := pd.Dec
	if pd.Err != nil || dec == nil {
		// Unavailable (or an open circuit): never a denial, never a
		// failure, always a retry — not a scheduling attempt.
		j.waitForPolicy()
		return
	}
	j.policyTries = 0
	if j.cfg.PolicyWaiters {
		j.emit(WakePolicyWaiters{})
	}
	if m := dec.GetConstraints().GetBudgets().GetMaxConcurrentJobs(); m > 0 {
		j.policyLimit = int(m)
	}
	// The decision is recorded with the job's next write.
	j.decision = pd.Record
	switch dec.Decision {
	case capv1.DecisionType_DECISION_TYPE_ALLOW_WITH_CONSTRAINTS:
		// The constraints travel to the worker in the request's env and
		// cap budget.deadline_ms.
		if pd.Constrain != nil {
			pd.Constrain(j.Req)
		}
		j.askRouter()
	case capv1.DecisionType_DECISION_TYPE_ALLOW:
		j.askRouter()
	case capv1.DecisionType_DECISION_TYPE_REQUIRE_HUMAN:
		j.requestApproval(dec)
	case capv1.DecisionType_DECISION_TYPE_THROTTLE:
		j.retryIn(jobstate.ReasonSafetyThrottled, ThrottleDelay)
	default: // DENY and anything unknown
		j.deny(jobstate.ReasonSafetyDenied, dec.Reason,
			[]string{"rule_id", dec.RuleId, "policy_reason", dec.Reason, "policy_snapshot", dec.PolicySnapshot})
	}
}

// waitForPolicy waits on the backoff to ask an unavailable input policy
// again. The wait never ends the job: an outage of the kernel, however
// long, is not the job's failure (policyTries only shapes the backoff). A
// job not yet created is created first (PENDING), so its submit can be
// acked and its wait survives this node.
func (j *Job) waitForPolicy() {
	if !j.live() {
		j.activate(true, nil) // then advance() asks again
		return
	}
	j.policyTries++
	j.count(MRetries, string(jobstate.ReasonSafetyUnavailable))
	j.arm(j.now().Add(j.cfg.Backoff(j.policyTries)))
	if j.cfg.PolicyWaiters {
		j.waitingPolicy = true
		j.emit(WaitPolicy{On: true})
	}
}

// requestApproval records APPROVAL_REQUIRED with the job hash and
// passivates: the lock is released and the actor stops. An approval makes
// the job due, and whichever replica's due poller sees it wakes the job.
func (j *Job) requestApproval(dec *capv1.PolicyCheckResponse) {
	j.apply(&jobstate.Transition{Expect: jobstate.Expect(jobstate.StatePending),
		Path:    []jobstate.Hop{{To: jobstate.StateApprovalRequired, Reason: jobstate.ReasonApprovalRequired}},
		Release: true, Due: -1,
		Fields: []string{"job_hash", jobstate.HashRequest(j.Req), "rule_id", dec.RuleId,
			"policy_reason", dec.Reason, "policy_snapshot", dec.PolicySnapshot}},
		nil, j.pend(pending{applied: []Effect{j.logFx(info, "job waits for approval", "topic", j.topic(), "rule_id", dec.RuleId)}}))
}

// resumeApproval acts on the decision recorded for an APPROVAL_REQUIRED job.
func (j *Job) resumeApproval() {
	f := j.record
	by := []string{"approved_by", f["approval_by"], "approval_reason", f["approval_reason"]}
	switch jobstate.Decision(f["approval_decision"]) {
	case jobstate.DecisionApproved:
		if j.Req == nil || jobstate.HashRequest(j.Req) != f["job_hash"] || f["approval_hash"] != f["job_hash"] {
			j.deny(jobstate.ReasonApprovalHashMismatch, "the job changed after approval was requested", by)
			return
		}
		j.transition(&jobstate.Transition{Expect: jobstate.Expect(jobstate.StateApprovalRequired),
			Path: []jobstate.Hop{{To: jobstate.StateScheduled, Reason: jobstate.ReasonApprovalGranted}}, Due: -1, Fields: by},
			nil, j.pend(pending{then: nAskRouter}))
	case jobstate.DecisionRejected:
		j.deny(jobstate.ReasonApprovalRejected, f["approval_reason"], by)
	default:
		// Woken without a decision: wait again with no actor — unless a
		// cancel reached the job meanwhile: it is applied first.
		for _, m := range j.deferred {
			if _, ok := m.(*Cancel); ok {
				return
			}
		}
		j.passivate()
	}
}

func (j *Job) deny(reason jobstate.Reason, detail string, fields []string) {
	entry := j.dlqEntry(reason, detail, "")
	j.apply(&jobstate.Transition{Expect: jobstate.Expect(jobstate.StatePending, jobstate.StateScheduled, jobstate.StateApprovalRequired),
		Path:   []jobstate.Hop{{To: jobstate.StateDenied, Reason: reason}},
		Fields: append(fields, "error_code", string(reason), "error_message", detail)}, entry,
		j.pend(pending{applied: []Effect{
			j.logFx(info, "job denied", "topic", j.topic(), "reason", reason, "detail", detail),
			PublishDLQ{Entry: entry},
			TellClient{Status: capv1.JobStatus_JOB_STATUS_DENIED, Code: reason, Msg: detail},
		}}))
}

// fail moves the job to FAILED with reason and dead-letters it.
func (j *Job) fail(reason jobstate.Reason, detail string, last jobstate.Reason) {
	entry := j.dlqEntry(reason, detail, last)
	fields := []string{"error_code", string(reason), "error_message", detail}
	if last != "" {
		fields = append(fields, "last_reason", string(last))
	}
	j.apply(&jobstate.Transition{Expect: jobstate.Expect(jobstate.StatePending, jobstate.StateScheduled, jobstate.StateApprovalRequired),
		Path: []jobstate.Hop{{To: jobstate.StateFailed, Reason: reason}}, Fields: fields}, entry,
		j.pend(pending{applied: []Effect{
			j.logFx(warn, "job failed", "topic", j.topic(), "reason", reason, "last_reason", last, "detail", detail),
			PublishDLQ{Entry: entry},
			TellClient{Status: capv1.JobStatus_JOB_STATUS_FAILED, Code: reason, Msg: detail},
		}}))
}

// retryIn waits d (a throttling policy's answer) and decides again.
func (j *Job) retryIn(why jobstate.Reason, d time.Duration) {
	if !j.live() {
		j.activate(true, nil)
		return
	}
	j.count(MRetries, string(why))
	j.arm(j.now().Add(d))
}

// retryLater waits and advances again without a state change, counting a
// scheduling attempt. A job not yet created is created first.
func (j *Job) retryLater(why jobstate.Reason) {
	if !j.live() {
		j.activate(true, nil)
		return
	}
	j.attempts++
	if j.attempts >= j.cfg.MaxSchedulingAttempts {
		j.fail(jobstate.ReasonMaxSchedulingRetries, "gave up after "+strconv.Itoa(j.attempts)+" attempts", why)
		return
	}
	j.count(MRetries, string(why))
	j.log(debug, "job retry", "reason", why, "attempt", j.attempts)
	j.arm(j.now().Add(j.cfg.Backoff(j.attempts)))
}

func (j *Job) dlqEntry(reason jobstate.Reason, detail string, last jobstate.Reason) *jobstate.DLQEntry {
	return &jobstate.DLQEntry{JobID: j.ID, Topic: j.topic(), Reason: reason, Message: detail,
		LastReason: last, TraceID: j.TraceID, Subject: j.cfg.SubmitSubject}
}

// logFx is a log line to emit later (once a write applied).
func (j *Job) logFx(level slog.Level, msg string, args ...any) Effect {
	return Log{Level: level, Msg: msg, Args: append([]any{"job_id", j.ID, "trace_id", j.TraceID}, args...)}
}
