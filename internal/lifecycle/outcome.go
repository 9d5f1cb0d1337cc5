package lifecycle

import (
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Outcome: a worker's result (and the output policy's check of it), a
// cancel, a deadline, the failure of the job's actor, and a workflow step's
// saga bookkeeping.

func (j *Job) onResult(m *Result) {
	res := m.Res
	if j.staleAttempt(res.JobId) {
		// The answer of an attempt the job is past (its worker was slow,
		// or repeats itself): it ends nothing.
		j.log(info, "result of an earlier attempt ignored", "attempt", res.JobId, "status", res.Status,
			"current", j.Attempt())
		j.count(MStaleAttempt, "")
		j.ack(m.Delivery)
		return
	}
	// A job sent back to SCHEDULED because its worker was evicted may have
	// been running there after all (the worker was alive): its result ends
	// the job rather than the job running a second time. Any worker's
	// result counts (on a pool subject NATS chose the receiver), but not one
	// naming no worker (the outcomes nodes publish for clients).
	earlier := j.State == jobstate.StateScheduled && j.lostWorkers != "" && res.WorkerId != ""
	if !active(j.State) && !earlier {
		j.log(info, "result ignored: job is not running", "state", j.State, "status", res.Status)
		j.count(MAbsorbed, "result")
		j.ack(m.Delivery)
		return
	}
	if !j.mayReport(m.By, res.WorkerId) {
		j.refuse(jobstate.ReasonNotJobWorker, "result from worker "+res.WorkerId+", not the job's", m.Refuse, m.Delivery)
		return
	}
	var to jobstate.State
	var reason jobstate.Reason
	switch res.Status {
	case capv1.JobStatus_JOB_STATUS_SUCCEEDED:
		to, reason = jobstate.StateSucceeded, jobstate.ReasonCompleted
	case capv1.JobStatus_JOB_STATUS_FAILED, capv1.JobStatus_JOB_STATUS_DENIED:
		to, reason = jobstate.StateFailed, jobstate.ReasonWorkerFailed
	case capv1.JobStatus_JOB_STATUS_FAILED_FATAL:
		to, reason = jobstate.StateFailed, jobstate.ReasonWorkerFailedFatal
	case capv1.JobStatus_JOB_STATUS_CANCELLED:
		to, reason = jobstate.StateCancelled, jobstate.ReasonWorkerCancelled
	case capv1.JobStatus_JOB_STATUS_TIMEOUT:
		to, reason = jobstate.StateTimeout, jobstate.ReasonWorkerTimeout
	default:
		// A non-terminal status is progress.
		if earlier {
			j.ack(m.Delivery) // of a dispatch the job no longer waits for
			return
		}
		j.acks = append(j.acks, m.Delivery)
		if j.State == jobstate.StateRunning {
			j.ackAll()
			return
		}
		j.markRunning(res.WorkerId)
		return
	}
	ofEarlier := earlier || active(j.State) && j.lostWorkers != "" && res.WorkerId != "" && res.WorkerId != j.Worker
	if !ofEarlier && j.retryAfterFailure(retryCause(res.Status), res.ErrorCode, res.ErrorMessage, m.Delivery) {
		return
	}
	// The worker ran it: record RUNNING even if no progress was sent.
	ranHop := j.State == jobstate.StateDispatched && to == jobstate.StateSucceeded
	j.acks = append(j.acks, m.Delivery)
	var extra []string
	var fx []Effect
	if ofEarlier {
		// The result of a dispatch before the current one: it ends the
		// job, and the later dispatch is cancelled at its worker.
		extra = append(extra, "result_of", "earlier_dispatch")
		fx = append(fx, j.logFx(warn, "result of an earlier dispatch ends the job", "worker_id", res.WorkerId,
			"state", j.State, "current_worker", j.Worker))
		if active(j.State) {
			fx = append(fx, CancelWorker{Reason: "result_of_earlier_dispatch"})
		}
	}
	j.withdraw()
	j.dropPick()
	if to == jobstate.StateSucceeded && j.cfg.Output {
		// The output policy's phase 1 runs before the result is called
		// SUCCEEDED (it may ask a remote checker or store a redacted copy).
		j.opEpoch++
		j.busy = true
		j.outputOwed = &owed{fields: extra, fx: fx}
		var path []jobstate.Hop
		if ranHop {
			path = append(make([]jobstate.Hop, 0, 2), jobstate.Hop{To: jobstate.StateRunning, Reason: jobstate.ReasonStarted})
		}
		j.emit(AskOutput{Epoch: j.opEpoch, Res: m, Path: path})
		return
	}
	t := newTransition(jobstate.Expect(j.State), 12)
	if ranHop {
		t.Path = append(t.Path, jobstate.Hop{To: jobstate.StateRunning, Reason: jobstate.ReasonStarted})
	}
	t.Path = append(t.Path, jobstate.Hop{To: to, Reason: reason})
	t.Fields = append(j.appendResultFields(t.Fields, res, res.ResultPtr), extra...)
	fx = append(fx, j.tellFinal(res, res.ResultPtr)...)
	j.sagaRecord(t, to, reason)
	if j.cfg.Debug {
		fx = append(fx, j.logFx(debug, "job finished", "topic", j.topic(), "state", to))
	}
	j.transition(t, nil, j.pend(pending{applied: fx}))
}

func (j *Job) resultFields(res *capv1.JobResult, ptr string) []string {
	return j.appendResultFields(make([]string, 0, 10), res, ptr)
}

// appendResultFields appends a result's record fields to f. The record
// holds the job's worker already (j.Worker: written by the dispatch, by
// markRunning when another worker speaks for it, and read back by an
// adoption), so "worker" is written only when the result's worker differs
// (the result of an earlier dispatch, a pool's other worker, a result naming
// none); "execution_ms" only when the worker reported a time (a missing
// one reads 0: store.ExpandRecord puts the "0" back for readers of a
// record with a result). Each field a write leaves out is Redis time saved
// on every job (issue 33).
func (j *Job) appendResultFields(f []string, res *capv1.JobResult, ptr string) []string {
	f = append(f, "result_ptr", ptr)
	if res.WorkerId != j.Worker {
		f = append(f, "worker", res.WorkerId)
	}
	if res.ExecutionMs != 0 {
		f = append(f, "execution_ms", j.formatInt(res.ExecutionMs))
	}
	if res.ErrorCode != "" || res.ErrorMessage != "" {
		f = append(f, "error_code", res.ErrorCode, "error_message", res.ErrorMessage)
	}
	return f
}

// sagaRecord has the shell add a workflow step's saga bookkeeping to its
// terminal write t, in the same atomic step (Config.Saga): a succeeded
// step with a compensation records its template next to its workflow's
// stack; a step failed fatally triggers the workflow's rollback.
func (j *Job) sagaRecord(t *jobstate.Transition, to jobstate.State, reason jobstate.Reason) {
	if j.cfg.Saga == nil || j.Req.GetWorkflowId() == "" {
		return
	}
	switch {
	case to == jobstate.StateSucceeded:
		j.cfg.Saga(t, j.Req, j.ID, j.now(), false)
	case reason == jobstate.ReasonWorkerFailedFatal:
		j.cfg.Saga(t, j.Req, j.ID, j.now(), true)
	}
}

// noneOwed stands in when no result left anything owed (every AskOutput
// records its own; this only keeps onOutput total).
var noneOwed owed

// onOutput writes what phase 1 decided: OUTPUT_QUARANTINED (with a DLQ
// entry and an audit line), or SUCCEEDED with the (possibly redacted)
// result pointer — and then hands the content scan to the scan pool.
func (j *Job) onOutput(m *OutputDone) {
	o := m.Outcome
	owed := j.outputOwed
	j.outputOwed = nil
	if owed == nil {
		owed = &noneOwed
	}
	fields := append(append(j.resultFields(m.Res.Res, o.ResultPtr), owed.fields...), o.Fields...)
	expect := jobstate.Expect(j.State)
	if o.Quarantine {
		entry := j.dlqEntry(jobstate.ReasonOutputQuarantined, o.Reason, "")
		path := append(m.Path, jobstate.Hop{To: jobstate.StateOutputQuarantined, Reason: jobstate.ReasonOutputQuarantined})
		j.transition(&jobstate.Transition{Expect: expect, Path: path, Fields: fields}, entry, j.pend(pending{applied: append(owed.fx,
			Count{M: MQuarantined, Label: o.Phase},
			j.logFx(warn, "audit: output quarantined", "topic", j.topic(), "phase", o.Phase,
				"rule_id", o.RuleID, "reason", o.Reason),
			PublishDLQ{Entry: entry},
			TellClient{Status: capv1.JobStatus_JOB_STATUS_OUTPUT_QUARANTINED, Code: jobstate.ReasonOutputQuarantined, Msg: o.Reason},
		)}))
		return
	}
	reason := jobstate.ReasonCompleted
	if o.Redacted {
		reason = jobstate.ReasonOutputRedacted
	}
	path := append(m.Path, jobstate.Hop{To: jobstate.StateSucceeded, Reason: reason})
	t := &jobstate.Transition{Expect: expect, Path: path, Fields: fields}
	j.sagaRecord(t, jobstate.StateSucceeded, reason)
	p := j.pend(pending{applied: append(owed.fx, j.tellFinal(m.Res.Res, o.ResultPtr)...)})
	if !o.ContentChecked {
		res := m.Res.Res
		p.applied = append(p.applied, ScanContent{Res: &capv1.JobResult{JobId: j.ID,
			Status: res.Status, ResultPtr: o.ResultPtr, WorkerId: res.WorkerId, ArtifactPtrs: res.ArtifactPtrs}})
	}
	j.transition(t, nil, p)
}

// cancelUnwritten cancels a fresh job waiting for capacity within its
// grace: it leaves the queue and is created CANCELLED, in one write.
func (j *Job) cancelUnwritten(m *Cancel) {
	j.disarm()
	j.withdraw()
	j.leaveGrace()
	j.acks = append(j.acks, m.Delivery)
	j.apply(&jobstate.Transition{Expect: jobstate.Expect(jobstate.StatePending),
		Path: []jobstate.Hop{{To: jobstate.StateScheduled, Reason: j.capReason},
			{To: jobstate.StateCancelled, Reason: jobstate.ReasonCancelRequested}},
		Fields: []string{"cancel_reason", m.C.GetReason(), "cancelled_by", m.C.GetRequestedBy()}}, nil,
		j.pend(pending{applied: []Effect{
			j.logFx(info, "job cancelled while waiting for capacity", "topic", j.topic(), "by", m.C.GetRequestedBy()),
			TellClient{Status: capv1.JobStatus_JOB_STATUS_CANCELLED, Code: jobstate.ReasonCancelRequested, Msg: m.C.GetReason()},
		}}))
}

// onCancel moves a live job to CANCELLED. Workers listen on sys.job.cancel
// themselves, so a cancel from the bus has already reached the worker; the
// node publishes one only for the cancels it decides itself (timeouts).
func (j *Job) onCancel(m *Cancel) {
	if by := m.By; by != nil && !j.State.Terminal() && !by.ForTenant(jobstate.TenantOf(j.Req)) {
		// A client key cancels its tenants' jobs only (intake let it
		// through: the tenant is the job's, known here).
		j.refuse(jobstate.ReasonOutOfScope, "cancel from a client key outside the job's tenant", m.Refuse, m.Delivery)
		return
	}
	if j.State.Terminal() {
		j.count(MAbsorbed, "cancel")
		j.ack(m.Delivery)
		return
	}
	j.disarm()
	j.stopWaitingPolicy()
	j.withdraw()
	j.acks = append(j.acks, m.Delivery)
	fx := []Effect{
		j.logFx(info, "job cancelled", "topic", j.topic(), "by", m.C.GetRequestedBy()),
		TellClient{Status: capv1.JobStatus_JOB_STATUS_CANCELLED, Code: jobstate.ReasonCancelRequested, Msg: m.C.GetReason()},
	}
	if active(j.State) && j.Retries() {
		// The worker knows the job by its attempt's id: the client's
		// cancel, naming the job's, did not reach it.
		fx = append(fx, CancelWorker{Reason: string(jobstate.ReasonCancelRequested)})
	}
	j.transition(&jobstate.Transition{Expect: jobstate.Expect(j.State),
		Path:   []jobstate.Hop{{To: jobstate.StateCancelled, Reason: jobstate.ReasonCancelRequested}},
		Fields: []string{"cancel_reason", m.C.GetReason(), "cancelled_by", m.C.GetRequestedBy()}}, nil,
		j.pend(pending{applied: fx}))
}

// timeout moves a DISPATCHED or RUNNING job to TIMEOUT and tells its worker.
func (j *Job) timeout() {
	why := j.deadlineWhy
	if why == "" {
		why = jobstate.ReasonDispatchTimeout
	}
	if why == jobstate.ReasonWorkerLost {
		// Its worker was evicted and never answered within the grace.
		detail := "worker " + j.Worker + " was lost while running the job and did not come back"
		if j.retryAfterFailure(jobstate.ReasonWorkerLost, string(jobstate.ReasonWorkerLost), detail, nil) {
			return
		}
		entry := j.dlqEntry(jobstate.ReasonWorkerLost, detail, "")
		j.transition(&jobstate.Transition{Expect: jobstate.Expect(jobstate.StateDispatched, jobstate.StateRunning),
			Path:   []jobstate.Hop{{To: jobstate.StateFailed, Reason: jobstate.ReasonWorkerLost}},
			Fields: []string{"error_code", string(why), "error_message", detail}}, entry,
			j.pend(pending{applied: []Effect{
				j.logFx(warn, "job failed: its worker was lost", "topic", j.topic(), "worker_id", j.Worker),
				PublishDLQ{Entry: entry},
				TellClient{Status: capv1.JobStatus_JOB_STATUS_FAILED, Code: why, Msg: detail},
			}}))
		return
	}
	j.transition(&jobstate.Transition{Expect: jobstate.Expect(jobstate.StateDispatched, jobstate.StateRunning),
		Path: []jobstate.Hop{{To: jobstate.StateTimeout, Reason: why}}, Fields: []string{"error_code", string(why)}}, nil,
		j.pend(pending{applied: []Effect{
			Count{M: MTimeouts, Label: string(why)},
			j.logFx(info, "job timed out", "topic", j.topic(), "reason", why, "worker_id", j.Worker),
			CancelWorker{Reason: string(why)},
			TellClient{Status: capv1.JobStatus_JOB_STATUS_TIMEOUT, Code: why, Msg: "the job passed its " + string(why)},
		}}))
}

// onAbandon: the job's previous actor failed for good; the job is FAILED
// actor_failed, dead-lettered, and its worker told to cancel.
func (j *Job) onAbandon(m *Abandon) {
	if j.State.Terminal() {
		j.finish()
		return
	}
	entry := j.dlqEntry(jobstate.ReasonActorFailed, m.Detail, j.LastReason)
	fx := []Effect{
		j.logFx(errL, "job failed: its actor failed", "topic", j.topic(), "detail", m.Detail),
		PublishDLQ{Entry: entry},
	}
	if active(j.State) {
		fx = append(fx, CancelWorker{Reason: string(jobstate.ReasonActorFailed)})
	}
	j.transition(&jobstate.Transition{Expect: jobstate.Expect(j.State),
		Path:   []jobstate.Hop{{To: jobstate.StateFailed, Reason: jobstate.ReasonActorFailed}},
		Fields: []string{"error_code", string(jobstate.ReasonActorFailed), "error_message", m.Detail}}, entry,
		j.pend(pending{applied: fx}))
}
