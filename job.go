package troupe

import (
	"time"

	"github.com/troupe-run/troupe/internal/jobdata"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// State is a job's lifecycle state: what Redis stores and `troupe job`
// prints.
type State string

// The job states, in lifecycle order.
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

// Terminal reports whether a job in s is finished.
func (s State) Terminal() bool { return jobstate.State(s).Terminal() }

// Job is a job's record as a node or a client reads it from Redis.
type Job struct {
	ID      string
	State   State
	Topic   string
	Tenant  string
	TraceID string
	// Reason is the reason code of the last transition (README, "Reason
	// codes").
	Reason string
	// Node is the node that last wrote the record; Worker the worker it
	// was dispatched to.
	Node   string
	Worker string
	// ResultPtr is the result's pointer (CAP result_ptr); ErrorCode and
	// ErrorMessage are a failed job's.
	ResultPtr    string
	ErrorCode    string
	ErrorMessage string
	// Attempts counts the scheduling attempts.
	Attempts int
	Created  time.Time
	Updated  time.Time
	// History lists every transition, oldest first.
	History []Transition
}

// Transition is one state a job entered.
type Transition struct {
	At     time.Time
	State  State
	Reason string
	// Node is the node that wrote it.
	Node string
}

// jobOf translates a store record into the public Job.
func jobOf(r *store.JobRecord) *Job {
	if r == nil {
		return nil
	}
	j := &Job{ID: r.ID, State: State(r.State), Topic: r.Topic, Tenant: r.Tenant, TraceID: r.TraceID,
		Reason: string(r.Reason), Node: r.Node, Worker: r.Worker, ResultPtr: r.ResultPtr,
		ErrorCode: r.ErrorCode, ErrorMessage: r.ErrorMessage, Attempts: r.Attempts,
		Created: r.Created, Updated: r.Updated}
	if len(r.History) > 0 {
		j.History = make([]Transition, len(r.History))
		for i, h := range r.History {
			j.History[i] = Transition{At: h.At, State: State(h.To), Reason: string(h.Reason), Node: h.Node}
		}
	}
	return j
}

// Decision is a human decision on a job waiting for approval (Node.Decide).
type Decision string

// The decisions.
const (
	DecisionApproved Decision = "approved"
	DecisionRejected Decision = "rejected"
)

// ErrNotFound: the job has no record (not taken by a node yet, or no
// longer: see Config.Retention).
var ErrNotFound error = store.ErrNotFound

// Why Node.Decide refused a decision (match with errors.Is).
var (
	// ErrNotAwaitingApproval: the job is not in APPROVAL_REQUIRED.
	ErrNotAwaitingApproval error = store.ErrNotAwaitingApproval
	// ErrHashMismatch: the hash given is not the job's recorded one.
	ErrHashMismatch error = store.ErrHashMismatch
	// ErrAlreadyDecided: another decision was recorded first.
	ErrAlreadyDecided error = store.ErrAlreadyDecided
	// ErrNoJobHash: the job has no recorded hash, so no decision could say
	// what it approved.
	ErrNoJobHash error = store.ErrNoJobHash
)

// Why a Client's payload call failed (match with errors.Is).
var (
	// ErrTooLarge: the payload is over the job data size cap.
	ErrTooLarge error = jobdata.ErrTooLarge
	// ErrNotHeld: the pointer is not one Troupe holds in Redis.
	ErrNotHeld error = jobdata.ErrNotHeld
	// ErrMissing: nothing is stored behind the pointer (expired or never written).
	ErrMissing error = jobdata.ErrMissing
)
