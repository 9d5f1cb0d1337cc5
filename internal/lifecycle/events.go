package lifecycle

import (
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Delivery is the JetStream message an event came in, as the job sees it.
// A delivery is acked only once the event's effect is durable in Redis
// (Ack effect); the core never calls it, the shell does.
type Delivery interface {
	Ack() error
	NakWithDelay(delay time.Duration) error
	InProgress() error
}

// The events from outside the job: what intake, the due poller, the router
// and the supervisor send.

// Submit is a JobRequest taken from sys.job.submit.
type Submit struct {
	Req      *capv1.JobRequest
	TraceID  string
	Delivery Delivery
	// Published is when the submit stream stored it (zero: unknown): the
	// job's history starts there, however long the stream held it.
	Published time.Time
}

// Result is a JobResult taken from sys.job.result.
type Result struct {
	Res      *capv1.JobResult
	TraceID  string
	Delivery Delivery
	// Raw is the packet as received, for forwarding to the owning node.
	Raw []byte
	// Forwarded marks a result another node passed to this one (the holder);
	// it is never forwarded again.
	Forwarded bool
	// Published is when the message entered its stream (zero: unknown).
	Published time.Time
	// Heard marks the owner's own copy of a result, heard on the result
	// subject rather than taken from the stream (intake own.go): only a
	// fast path, settled by nothing. A job with no record drops it
	// instead of dead-lettering it: the stream's copy answers for it.
	Heard bool
	// By is the verified sender (nil: the node does not verify, and trusts
	// everyone on the bus); Refuse settles a result the job refuses from
	// it (see Refusal).
	By     Sender
	Refuse func(reason jobstate.Reason, detail string)
}

// Progress is a JobProgress seen on sys.job.progress (core NATS, no ack).
// From is the packet's sender: the worker speaking for the job.
type Progress struct {
	P    *capv1.JobProgress
	From string
	// By and Refuse as for Result (a progress has nothing to settle:
	// Refuse only counts it).
	By     Sender
	Refuse func(reason jobstate.Reason, detail string)
}

// Cancel is a JobCancel taken from sys.job.cancel.
type Cancel struct {
	C         *capv1.JobCancel
	TraceID   string
	Delivery  Delivery
	Raw       []byte
	Forwarded bool
	Published time.Time
	By        Sender
	Refuse    func(reason jobstate.Reason, detail string)
}

// Sender is an event's verified sender, as the core asks about it (the
// shell wraps the node's signing principal). A nil Sender: the node does
// not verify senders, and trusts everyone on the bus.
type Sender interface {
	// WorkerKey: the sender holds a worker's key (not a legacy entry).
	WorkerKey() bool
	// InPool: a worker sender serves pool (a legacy one serves every pool).
	InPool(pool string) bool
	// ForTenant: the sender may cancel for tenant.
	ForTenant(tenant string) bool
}

// OutputOutcome is what the output policy's phase 1 decided for a result
// (the shell's summary of it).
type OutputOutcome struct {
	// Phase names the phase, for the audit line and the counter's label.
	Phase string
	// Quarantine: move the job to OUTPUT_QUARANTINED (+ DLQ, audit).
	Quarantine bool
	// ResultPtr is the pointer to release: the original, or the redacted
	// copy's (Redacted) — swapped into the job's result.
	ResultPtr string
	Redacted  bool
	Reason    string
	RuleID    string
	// ContentChecked: phase 1 already covered the content; no phase 2.
	ContentChecked bool
	// Fields is the output-safety record, as field/value pairs.
	Fields []string
}

// Forward kinds, as carried in the Troupe-Kind header of a forwarded packet.
const (
	ForwardResult = "result"
	ForwardCancel = "cancel"
)

// Wake is sent by the due poller to a job whose due time has passed and
// whose holder did not act (it died, or the job was passivated and an
// approval arrived). The job activates and does what its state calls for.
type Wake struct {
	// LapsedAt, for a job woken because its holder stopped renewing its
	// lease: when the holder's lock lapsed (for troupe_adoption_latency_seconds).
	LapsedAt time.Time
	// Lost: the wake of a job this node left waiting alone (see Alone)
	// after Redis lost its data. A job it finds with no record ends
	// visibly: dead-lettered state_lost, its client told once (a plain
	// wake of a job with no record records nothing). A job that still has
	// its record is woken as by any wake.
	Lost bool
}

// WorkerLost tells a job that the worker it was dispatched to has been
// evicted (no heartbeat within its liveness window). A job still waiting
// for that worker to start it is dispatched elsewhere. At is when the worker
// was evicted (zero: now): a job adopted after the eviction counts its
// worker-lost grace from then, not from its adoption.
type WorkerLost struct {
	WorkerID string
	At       time.Time
}

// ResultsLost tells a job that results its worker sent may be gone: the
// result stream was recreated (deleted, or lost with a JetStream store), and
// the messages it held went with it. A job with its worker that may be
// asked again (it dedupes: see Job.onResultsLost) repeats its dispatch.
type ResultsLost struct{}

// Abandon tells a job's fresh actor that the previous one failed for good:
// the job is marked FAILED (reason actor_failed, dead-lettered), and its
// worker, if it has one, is told to cancel.
type Abandon struct{ Detail string }

// The replies to the job's own asynchronous steps, and its timer. Each
// carries the epoch of the step it answers; an answer to a step the job no
// longer waits for is dropped.

// WriteDone is a store.Writer outcome.
type WriteDone struct {
	Epoch uint64
	Res   WriteResult
}

// RetryNow: StateRetryDelay has passed since a write failed; try it again.
type RetryNow struct{ Epoch uint64 }

// PolicyDone is the input policy's answer.
type PolicyDone struct {
	Epoch uint64
	Dec   *capv1.PolicyCheckResponse
	Err   error
	// Record is the decision as record fields (policy_decision, …), which
	// the job's next write records; the shell derives it from Dec.
	Record []string
	// Constrain, for an ALLOW_WITH_CONSTRAINTS decision, writes the
	// constraints into the request the worker receives (its env, its
	// deadline); the core calls it. Nil: nothing to write.
	Constrain func(*capv1.JobRequest)
}

// OutputDone is the output policy's phase-1 outcome for a result.
type OutputDone struct {
	Epoch   uint64
	Outcome OutputOutcome
	Res     *Result
	Path    []jobstate.Hop
}

// PublishFailed: the dispatch the job asked for (a PublishRequest effect
// that was not a resend) could not be published.
type PublishFailed struct{ Err error }

// Timer is the job's one timer firing.
type Timer struct{ Epoch uint64 }

// LockLost is the lock renewer's report that the job's lock could not be
// kept: another holder has it, or (Vanished) nobody does.
type LockLost struct {
	LockValue string
	Vanished  bool
}

// PolicyBack: another job's check has just succeeded; a job waiting on an
// unavailable policy asks again now.
type PolicyBack struct{}

// Stopping: the actor is stopped from outside (node shutdown).
type Stopping struct{}

// Restarting: supervision replaces the actor after a transient failure.
type Restarting struct{}
