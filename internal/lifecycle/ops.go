package lifecycle

import (
	"github.com/troupe-run/troupe/internal/jobstate"
)

// The core's writes and their outcomes. The core asks for a write by
// emitting Write{Op}; the shell hands it to the store's writer (translating
// it into a store op) and brings the outcome back as a WriteDone carrying a
// WriteResult. Nothing here names Redis: the store's scripts are one way to
// carry these out, the simulator's model another.

// OpKind says what an Op does.
type OpKind uint8

const (
	// OpActivate takes the job's lock and reads (or creates, with Create)
	// its state; a created job takes T as its plan, and DLQ with it.
	OpActivate OpKind = iota + 1
	// OpTransition applies T, a fenced compare-and-set, with DLQ and the
	// release of TenantRelease's slot when it applies.
	OpTransition
	// OpRelease gives the lock (LockValue) up without a state change.
	OpRelease
	// OpDLQ appends DLQ to the dead-letter stream.
	OpDLQ
	// OpClaim claims IdemKey for the job; WriteResult.Holder names the job
	// that holds it.
	OpClaim
	// OpAdmit takes one of Limit concurrency slots in TenantKey for the
	// job; WriteResult.Admitted says whether it got one.
	OpAdmit
	// OpPark parks the job whose lock is LockValue: held through Node's
	// lease from now, due at ParkDue (unix ms). WriteResult.Parked says
	// whether the lock was still the job's.
	OpPark
)

// Op is one write the core asks for. Only the fields of its Kind are set.
type Op struct {
	Kind      OpKind
	JobID     string
	Node      string
	LockValue string // OpTransition, OpRelease, OpPark

	// OpActivate with Create: what the record is created with.
	Create  bool
	Topic   string
	Tenant  string
	TraceID string
	Request []byte

	// T: OpTransition's change, or the plan of an OpActivate that creates.
	T *jobstate.Transition
	// DLQ: OpDLQ's entry, or one written exactly when T applies.
	DLQ *jobstate.DLQEntry
	// TenantRelease: OpTransition gives the job's slot in this tenant set
	// back if it applies.
	TenantRelease string

	IdemKey   string // OpClaim
	TenantKey string // OpAdmit
	Limit     int    // OpAdmit
	ParkDue   int64  // OpPark
}

// ActivateStatus is the outcome of an activation.
type ActivateStatus string

const (
	ActivateCreated  ActivateStatus = "CREATED"
	ActivateAdopted  ActivateStatus = "ADOPTED"
	ActivateBusy     ActivateStatus = "BUSY"
	ActivateTerminal ActivateStatus = "TERMINAL"
	ActivateNotFound ActivateStatus = "NOTFOUND"
	// ActivateCancelled: the job had no record and a cancel mark for its
	// tenant: it was created CANCELLED, not with the plan. Fields holds
	// cancel_reason and cancelled_by.
	ActivateCancelled ActivateStatus = "CANCELLED"
)

// StepStatus is the outcome of an OpTransition.
type StepStatus string

const (
	StepOK       StepStatus = "OK"
	StepFenced   StepStatus = "FENCED"
	StepConflict StepStatus = "CONFLICT"
	StepNotFound StepStatus = "NOTFOUND"
)

// WriteResult is an Op's outcome. Err is set when the store could not be
// asked (the state is then unknown); the other fields are meaningful only
// without Err, each for the kinds it names.
type WriteResult struct {
	Err error

	// OpActivate: Status; State (for CREATED, where the plan left it);
	// Fence; Holder, the lock before this activation (BUSY: the holder's);
	// Fields, the job's record (ADOPTED; CANCELLED: the cancel's fields).
	Status ActivateStatus
	State  jobstate.State
	Fence  int64
	// Holder is, for OpClaim, the job id that holds the key.
	Holder string
	Fields map[string]string

	// OpTransition: the outcome, and the state the job was in (for FENCED,
	// the current lock value). LastOp is the record's "op" on a CONFLICT or
	// FENCED: the write that moved the job last; on a FENCED, State is the
	// record's state.
	Step   StepStatus
	Before jobstate.State
	LastOp string

	Released bool // OpRelease
	Admitted bool // OpAdmit
	Parked   bool // OpPark
}
