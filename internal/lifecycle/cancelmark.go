package lifecycle

import (
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// createdCancelled: the job had no record and a cancel mark for its tenant
// (its cancel came while its submit was held in the stream, taken by no
// node; see store.Store.MarkCancel), so the activation created it
// CANCELLED instead of applying the plan. None of the plan's effects run:
// it is never dispatched. The client is told, once, like any cancelled job.
func (j *Job) createdCancelled(r *WriteResult) {
	j.created = j.now()
	j.count(MReceived, "")
	j.State, j.Fence = jobstate.StateCancelled, r.Fence
	j.LastReason = jobstate.ReasonCancelRequested
	if j.cfg.Trace {
		j.emit(Moved{Created: true, Path: []jobstate.Hop{{To: jobstate.StateCancelled, Reason: jobstate.ReasonCancelRequested}}})
	}
	if j.Worker != "" {
		// A record Redis lost, written back (recreate): the job is with its
		// worker, which hears the cancel on the bus; its slot stays counted
		// until the worker lets go, as for any job cancelled there.
		j.toRouter(&Released{WorkerID: j.Worker, JobID: j.ID, Done: true, Linger: true})
	}
	j.ended()
	j.ackAll()
	by, why := r.Fields["cancelled_by"], r.Fields["cancel_reason"]
	j.log(info, "job cancelled before it was admitted (its cancel came while its submit was held in the stream)",
		"topic", j.topic(), "by", by)
	j.emit(TellClient{Status: capv1.JobStatus_JOB_STATUS_CANCELLED, Code: jobstate.ReasonCancelRequested, Msg: why})
	j.finish()
}
