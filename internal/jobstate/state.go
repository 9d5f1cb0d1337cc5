// Package jobstate holds the small types every part of Troupe shares: job states
// and the reason codes a user can see. It imports nothing of Troupe's, so any
// package may import it.
package jobstate

import "github.com/troupe-run/troupe/proto/capv1"

// State is a job's lifecycle state. The string form is what Redis stores and
// what `troupe job` prints.
type State string

const (
	StatePending           State = "PENDING"
	StateApprovalRequired  State = "APPROVAL_REQUIRED"
	StateScheduled         State = "SCHEDULED"
	StateDispatched        State = "DISPATCHED"
	StateRunning           State = "RUNNING"
	StateSucceeded         State = "SUCCEEDED"
	StateFailed            State = "FAILED"
	StateTimeout           State = "TIMEOUT"
	StateCancelled         State = "CANCELLED"
	StateDenied            State = "DENIED"
	StateOutputQuarantined State = "OUTPUT_QUARANTINED"
)

// AllStates lists every state, in lifecycle order.
var AllStates = []State{
	StatePending, StateApprovalRequired, StateScheduled, StateDispatched, StateRunning,
	StateSucceeded, StateFailed, StateTimeout, StateCancelled, StateDenied, StateOutputQuarantined,
}

// Terminal reports whether a job in s is finished: it holds no lock and
// absorbs every later submit, result and cancel.
func (s State) Terminal() bool {
	switch s {
	case StateSucceeded, StateFailed, StateTimeout, StateCancelled, StateDenied, StateOutputQuarantined:
		return true
	}
	return false
}

// Retryable reports whether a job that ended in s may be retried by an
// operator (a new job with the same request): it failed, timed out or was
// cancelled. A success is submitted again, not retried; a denial or a
// quarantined output would meet the same policy again.
func (s State) Retryable() bool {
	return s == StateFailed || s == StateTimeout || s == StateCancelled
}

// Valid reports whether s is one of the known states.
func (s State) Valid() bool {
	for _, k := range AllStates {
		if k == s {
			return true
		}
	}
	return false
}

// Status maps a state to the CAP wire enum.
func (s State) Status() capv1.JobStatus {
	switch s {
	case StatePending:
		return capv1.JobStatus_JOB_STATUS_PENDING
	case StateApprovalRequired:
		return capv1.JobStatus_JOB_STATUS_APPROVAL_REQUIRED
	case StateScheduled:
		return capv1.JobStatus_JOB_STATUS_SCHEDULED
	case StateDispatched:
		return capv1.JobStatus_JOB_STATUS_DISPATCHED
	case StateRunning:
		return capv1.JobStatus_JOB_STATUS_RUNNING
	case StateSucceeded:
		return capv1.JobStatus_JOB_STATUS_SUCCEEDED
	case StateFailed:
		return capv1.JobStatus_JOB_STATUS_FAILED
	case StateTimeout:
		return capv1.JobStatus_JOB_STATUS_TIMEOUT
	case StateCancelled:
		return capv1.JobStatus_JOB_STATUS_CANCELLED
	case StateDenied:
		return capv1.JobStatus_JOB_STATUS_DENIED
	case StateOutputQuarantined:
		return capv1.JobStatus_JOB_STATUS_OUTPUT_QUARANTINED
	}
	return capv1.JobStatus_JOB_STATUS_UNSPECIFIED
}
