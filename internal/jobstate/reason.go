package jobstate

// Reason is a machine-readable code that says why a job moved, waited or
// failed. It is stored on the job record, on each history entry and on DLQ
// entries, and is the error_code of packets on sys.job.dlq. Every code a user
// can see is one of these constants.
type Reason string

const (
	// Happy path.
	ReasonSubmitted  Reason = "submitted"
	ReasonAllowed    Reason = "policy_allowed"
	ReasonDispatched Reason = "dispatched"
	ReasonStarted    Reason = "worker_started"
	ReasonCompleted  Reason = "worker_completed"
	ReasonAdopted    Reason = "adopted"

	// Bad input (intake). Each one ends with a DLQ entry.
	ReasonDecodeFailed   Reason = "decode_failed"
	ReasonInvalidRequest Reason = "invalid_request"
	ReasonUnknownJob     Reason = "unknown_job"
	ReasonUnexpectedKind Reason = "unexpected_packet"

	// Packet signatures (intake, when the node verifies them). Each ends
	// with a DLQ entry; see signing and intake.Signatures.
	ReasonUnsignedPacket Reason = "unsigned_packet"
	ReasonUnknownSender  Reason = "unknown_sender"
	ReasonBadSignature   Reason = "bad_signature"
	// Roles and scopes (a verified sender not allowed to send the packet)
	// and the replay window. Each ends with a DLQ entry where a job is
	// involved; see signing.Principal and signing.ReplayGuard.
	ReasonForbiddenRole Reason = "forbidden_role" // the sender's role may not send this packet
	ReasonOutOfScope    Reason = "out_of_scope"   // a tenant, pool or worker id outside the sender's scope
	ReasonNotJobWorker  Reason = "not_job_worker" // a result or progress from a worker the job is not dispatched to
	ReasonStalePacket   Reason = "stale_packet"   // created_at missing or outside the replay window
	ReasonReplayed      Reason = "replayed"       // a signature already taken within the replay window

	// Routing.
	ReasonTopicUnmapped         Reason = "topic_unmapped"
	ReasonPreferredPoolUnmapped Reason = "preferred_pool_unmapped"
	ReasonRequiresUnsatisfied   Reason = "requires_unsatisfied"
	ReasonNoWorkers             Reason = "no_workers"
	ReasonPoolOverloaded        Reason = "pool_overloaded"
	ReasonStaleWorker           Reason = "stale_worker"
	ReasonTenantLimit           Reason = "tenant_limit"
	// ReasonConcurrencyKey: the job waits for a slot of its concurrency
	// key; ReasonConcurrencyKeyCancelled: it was cancelled for one
	// (cancel_newest), or to make room for a newer job (cancel_in_progress).
	ReasonConcurrencyKey          Reason = "concurrency_key"
	ReasonConcurrencyKeyCancelled Reason = "concurrency_key_cancelled"
	ReasonDispatchFailed          Reason = "dispatch_failed"
	// ReasonPoolPaused: an operator paused the job's topic; the job waits
	// SCHEDULED, in order, until the topic is resumed.
	ReasonPoolPaused Reason = "pool_paused"
	// ReasonWorkerLost: the worker a job was dispatched to was evicted.
	// Before it reported progress: the job is dispatched elsewhere
	// (DISPATCHED → SCHEDULED). After, on the worker known to run it: the
	// job fails after a grace unless the worker answers (→ itself, then
	// → FAILED).
	ReasonWorkerLost Reason = "worker_lost"
	// ReasonWorkerLostRunnerUnknown: the worker Troupe picked for a started
	// job on a pool subject was evicted, but no worker has spoken for the
	// job, so NATS may have given it to another: the job's deadline decides.
	ReasonWorkerLostRunnerUnknown Reason = "worker_lost_runner_unknown"

	// Policy.
	ReasonSafetyDenied      Reason = "safety_denied"
	ReasonSafetyUnavailable Reason = "safety_unavailable"
	ReasonSafetyThrottled   Reason = "safety_throttled"
	ReasonApprovalRequired  Reason = "approval_required"

	// Outcomes reported by workers.
	ReasonWorkerFailed      Reason = "worker_failed"
	ReasonWorkerFailedFatal Reason = "worker_failed_fatal"
	ReasonWorkerCancelled   Reason = "worker_cancelled"
	ReasonWorkerTimeout     Reason = "worker_timeout"

	// Output policy.
	ReasonOutputQuarantined Reason = "output_quarantined"
	ReasonOutputRedacted    Reason = "output_redacted"

	// Approval.
	ReasonApprovalGranted      Reason = "approval_granted"
	ReasonApprovalRejected     Reason = "approval_rejected"
	ReasonApprovalHashMismatch Reason = "approval_hash_mismatch"

	// Cancellation and deadlines.
	ReasonCancelRequested  Reason = "cancel_requested"
	ReasonDispatchTimeout  Reason = "dispatch_timeout"
	ReasonRunningTimeout   Reason = "running_timeout"
	ReasonDeadlineExceeded Reason = "deadline_exceeded"

	// Lifecycle.
	ReasonMaxSchedulingRetries Reason = "max_scheduling_retries"
	// ReasonRetryWait: the worker failed the attempt (FAILED, TIMEOUT, or
	// it was lost while running it) and the job's retry policy runs it
	// again: DISPATCHED or RUNNING → SCHEDULED until its backoff ends.
	ReasonRetryWait           Reason = "retry_wait"
	ReasonLockBusy            Reason = "lock_busy"
	ReasonStateUnavailable    Reason = "state_unavailable"
	ReasonIdempotentDuplicate Reason = "idempotent_duplicate"
	// ReasonStateLost: Redis no longer had the job's record (it restarted
	// without persistence); the owning actor wrote it back from memory.
	ReasonStateLost Reason = "state_lost"
	// ReasonMaxDeliveries: JetStream offered a message as often as it
	// will, and it was never handled; it is dead-lettered before it is
	// dropped.
	ReasonMaxDeliveries Reason = "max_deliveries"
	// ReasonActorFailed: the job's actor failed with an error a restart
	// cannot fix (or failed past its restart budget); its supervisor
	// marked the job FAILED.
	ReasonActorFailed Reason = "actor_failed"
)

// Rate limits (internal/ratelimit): a job waiting for its bucket's tokens
// is SCHEDULED rate_limited; a job whose declaration can never be granted
// (an undeclared bucket, units beyond its burst) fails rate_limit_invalid.
// A job still waiting at its deadline fails deadline_exceeded.
const (
	ReasonRateLimited      Reason = "rate_limited"
	ReasonRateLimitInvalid Reason = "rate_limit_invalid"
)
