package lifecycle

import (
	"fmt"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// legal is the job state machine: legal[from] lists every state a job may
// move to from `from`. Every transition the job actor makes is checked here
// before it is written, and the write itself is a compare-and-set in Redis on
// the from state, so memory and Redis agree on the same table.
//
// SCHEDULED → SUCCEEDED (or another outcome) is a result of an earlier
// dispatch arriving after the job went back to SCHEDULED because its worker
// was evicted: the worker was alive after all, and its answer ends the job.
//
// Self-loops on DISPATCHED and RUNNING record that the job's worker was
// lost (worker_lost: it fails after a grace unless the worker answers) or
// answered after all (worker_started).
//
// Self-loops on PENDING and SCHEDULED record a retry (a new attempt with its
// reason) without a state change. SUCCEEDED → OUTPUT_QUARANTINED is the one
// exit from a terminal state: the asynchronous output scan may downgrade a
// result after it was released.
var legal = map[jobstate.State][]jobstate.State{
	jobstate.StatePending: {jobstate.StatePending, jobstate.StateScheduled, jobstate.StateApprovalRequired, jobstate.StateDenied,
		jobstate.StateCancelled, jobstate.StateFailed, jobstate.StateTimeout},
	jobstate.StateApprovalRequired: {jobstate.StatePending, jobstate.StateScheduled, jobstate.StateDenied, jobstate.StateCancelled,
		jobstate.StateTimeout, jobstate.StateFailed},
	jobstate.StateScheduled: {jobstate.StateScheduled, jobstate.StateDispatched, jobstate.StateDenied, jobstate.StateCancelled,
		jobstate.StateFailed, jobstate.StateTimeout, jobstate.StateSucceeded, jobstate.StateOutputQuarantined},
	jobstate.StateDispatched: {jobstate.StateRunning, jobstate.StateScheduled, jobstate.StateSucceeded, jobstate.StateFailed,
		jobstate.StateCancelled, jobstate.StateTimeout, jobstate.StateOutputQuarantined, jobstate.StateDispatched},
	jobstate.StateRunning: {jobstate.StateSucceeded, jobstate.StateFailed, jobstate.StateCancelled, jobstate.StateTimeout,
		jobstate.StateOutputQuarantined, jobstate.StateScheduled, jobstate.StateRunning},
	jobstate.StateSucceeded: {jobstate.StateOutputQuarantined},
}

// Legal reports whether a job may move from → to.
func Legal(from, to jobstate.State) bool {
	for _, s := range legal[from] {
		if s == to {
			return true
		}
	}
	return false
}

// ErrIllegalTransition is returned (and logged) for a transition the table
// does not allow. It is a programming error, never an input error.
type ErrIllegalTransition struct{ From, To jobstate.State }

func (e *ErrIllegalTransition) Error() string {
	return fmt.Sprintf("illegal job transition %s → %s", e.From, e.To)
}
