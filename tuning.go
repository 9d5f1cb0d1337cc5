package troupe

import (
	"context"
	"time"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/recovery"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/internal/saga"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/signing"
)

// Tuning holds a node's knobs beyond what Config names. The rule: a zero
// field means its default, the value DefaultTuning returns (NewNode fills
// every zero field from it); where a field says so, a negative value turns
// the behaviour off ("never"). Every replica of a cluster should use the
// same Retention, SagaRetention and DLQMaxBytes.
type Tuning struct {
	// StreamReplicas is how many JetStream servers keep a copy of each
	// stream (default 1; 3 on a three-server cluster survives the loss of
	// one; at most bus.MaxStreamReplicas). A single server accepts only 1.
	StreamReplicas int
	// StreamMaxBytes bounds each of the node's three input streams
	// (default bus.StreamMaxBytes, 256 MiB). JetStream reserves it from its
	// file storage (the server's max_file_store, or the account's limit)
	// when the stream is made, however little the stream holds: lower it
	// where many prefixes share one JetStream. A stream past it refuses new
	// messages (publishers get an error; nothing accepted is dropped). At
	// start a node sets it on streams that exist with another bound.
	StreamMaxBytes int64

	// LockTTL is the job lock TTL (default store.LockTTLDefault).
	LockTTL time.Duration
	// WorkerTTL is the worker liveness TTL (default registry.TTLDefault).
	// Workers should beat at least three times in it: one beating less
	// often is evicted, or has its direct dispatches dropped, after one
	// lost heartbeat; the node warns of each such worker and counts them
	// (troupe_workers_heartbeat_too_slow). Under 15 s (three beats of the
	// CAP SDKs' 5 s) NewNode warns at once.
	WorkerTTL time.Duration
	// MaxWorkers and MaxPools cap what heartbeats add to the router's
	// registry: workers known at once (default 10,000) and pool names seen
	// since start (default 256). Heartbeats beyond are refused and
	// counted in troupe_heartbeats_refused_total{reason}.
	MaxWorkers int
	MaxPools   int
	// JobShards is the number of job supervisor shards (default 16: they
	// spread spawn and routing work over several mailboxes).
	JobShards int
	// MaxSchedulingAttempts before a job fails (default jobactor.MaxSchedulingAttemptsDefault).
	MaxSchedulingAttempts int
	// PermanentGrace is how long permanent routing errors are retried
	// before the job fails (default jobactor.PermanentGraceDefault).
	PermanentGrace time.Duration
	// ParkAfter is how long a job waiting for its worker (DISPATCHED or
	// RUNNING) keeps a live actor before it parks: the actor stops, and the
	// job waits in Redis, held by this node through its node lease (default
	// jobactor.ParkAfterDefault; negative: never park).
	ParkAfter time.Duration
	// RetryParkMin is the shortest retry backoff whose wait parks: the
	// job's lock is released and its actor stops, and the due poller of
	// any replica brings it back at its retry time, up to DueSlack plus a
	// DuePoll (DueIdlePoll on an idle cluster) late (default jobactor.RetryParkMinDefault, 30 s; negative:
	// never). Shorter waits keep their actor and exact timer.
	RetryParkMin time.Duration
	// CapacityGrace is how long a new job that finds no room in its pools
	// waits before its record is written (SCHEDULED pool_overloaded /
	// no_workers): until then its submit stays un-acked in JetStream
	// (default jobactor.CapacityGraceDefault, 1 min; negative: write at
	// once). Meanwhile Node.WaitingJob describes it. See README, "Routing
	// and capacity".
	CapacityGrace time.Duration
	// AdmissionHold is how long such a job still counts in MaxAdmitting
	// (default lifecycle.AdmissionHoldDefault, 2 s; negative: not at all).
	AdmissionHold time.Duration
	// MaxAdmitting bounds the jobs the node has taken from the submit
	// stream and not yet dispatched, written as waiting for capacity,
	// finished, or kept waiting past their AdmissionHold: at the bound it pulls no more submits, so a burst waits in
	// JetStream instead of in the node's memory (default
	// jobactor.MaxAdmittingDefault, 2,000; negative: no bound). Gauge
	// troupe_jobs_admitting.
	MaxAdmitting int
	// ResendAfter is how long a job directly dispatched to a worker that
	// dedupes by job id (heartbeat label troupe.dedupe=job_id) may stay
	// DISPATCHED with no progress or result before the dispatch is
	// repeated, then 2×, 4×… capped at 30 s (default
	// jobactor.ResendAfterDefault; negative: never).
	ResendAfter time.Duration

	// Timeouts are the job deadlines; TimeoutsFile (timeouts.yaml) is read
	// when Timeouts is nil (default: DefaultTuning's).
	Timeouts     *Timeouts
	TimeoutsFile string
	// DuePoll is the due poller's interval (default recovery.DuePollDefault);
	// DueSlack how long past due a job must be before the poller, rather
	// than its owner, wakes it (default recovery.DueSlackDefault).
	DuePoll  time.Duration
	DueSlack time.Duration
	// DueIdlePoll is the longest interval of the due poller while its
	// ticks find nothing: each empty tick doubles the interval from
	// DuePoll up to DueIdlePoll, and a tick that wakes a job brings it
	// back to DuePoll. A due time written by another replica (a retry
	// wait it parked, an approval decided there, a lapsed lease) is so
	// taken up to DueSlack plus DueIdlePoll late on an idle cluster
	// (default recovery.DueIdleFactor × DuePoll, 4 s; at most DuePoll
	// or negative: no backoff).
	DueIdlePoll time.Duration
	// RescueAfter is how long a new job may sit in PENDING before the due
	// poller wakes it (default store.RescueAfterDefault).
	RescueAfter time.Duration

	// Retention is how long a terminal job's record, history and mailbox
	// trace stay readable, and with them the links between a DLQ entry and
	// its retries (default store.RetentionDefault, 24 h; negative: forever,
	// leaving the cleanup to the operator). Every replica should use the
	// same; a node writes a job's expiry when the job ends.
	Retention time.Duration
	// DLQRetention is how long a DLQ entry is kept; the due poller drops
	// older ones within a minute or so (default 0: no age limit, DLQMaxBytes
	// alone bounds the DLQ). An entry outliving Retention still shows what
	// failed, but its job's record, and so its retry, may be gone.
	DLQRetention time.Duration
	// DLQMaxBytes is the DLQ's byte budget, shared by every replica: past
	// it the oldest entries go (default store.DLQMaxBytesDefault). A bad
	// packet is kept as its first store.DLQRawPrefix bytes, size and hash.
	DLQMaxBytes int64

	// StreamCheck is how often the node looks for input streams and
	// consumers that went missing while it runs, and recreates them; a
	// failed fetch makes it look at once (default bus.StreamCheckEvery;
	// negative: never, a missing stream then waits for a restart).
	StreamCheck time.Duration

	// ReplayWindow is how far a verified packet's created_at may be from
	// its arrival (default signing.DefaultReplaySkew); within it the node
	// remembers each signature it took (at most ReplaySeen, default
	// signing.DefaultReplaySeen) and refuses it a second time. Only with
	// a Verifier. See SECURITY.md, "Replay window".
	ReplayWindow time.Duration
	ReplaySeen   int

	// TenantLimits caps each tenant's DISPATCHED + RUNNING jobs across all
	// replicas (a missing tenant has no cap; a policy's max_concurrent_jobs
	// constraint can lower it per job). A job over the cap waits and retries
	// with reason tenant_limit.
	TenantLimits map[string]int

	// NoRedispatchTopics lists topics whose jobs are not re-dispatched when
	// their worker is evicted before starting them (the default is to
	// re-dispatch: a dead worker costs a re-dispatch, not a timeout).
	NoRedispatchTopics []string

	// SagaStepBudget is how long a rollback waits for one compensation
	// (default saga.StepBudgetDefault); SagaPoll is the saga trigger
	// poller's interval (default saga.PollDefault).
	SagaStepBudget time.Duration
	SagaPoll       time.Duration
	// WorkerLostGrace: a job running on a worker (directly dispatched) that
	// is then evicted ends FAILED worker_lost this long after, unless the
	// worker's result or progress comes first (default 60 s; negative: it
	// waits for its running deadline).
	WorkerLostGrace time.Duration
	// UnknownHold is how long a result or cancel for a job with no record
	// is handed back to JetStream, waiting for a replica that lost the
	// record with Redis to recreate it, before it is dead-lettered
	// (default jobactor.UnknownHoldDefault, 30 s; negative: at once).
	UnknownHold time.Duration
	// SagaRetention is how long a workflow's saga records (compensation
	// templates, stacks, triggers, rollback progress) are kept after its
	// last step recorded in them or its rollback's last run (default
	// saga.RetentionDefault): a step's compensation can run only that long
	// after the step. Every replica should use the same.
	SagaRetention time.Duration
	// NoSagas leaves rollbacks to other replicas (or to a saga.Start of the
	// embedder's own): this node records saga steps but runs no rollback.
	NoSagas bool
	// NoProcessedGuard turns off the processed-message guard (a Redis key
	// per handled JetStream message, so one handled but not acked before a
	// crash is not handled again; see intake.Guard). Handling twice is
	// harmless, so this trades accounting for one SET per message.
	NoProcessedGuard bool

	// JobTrace records every job actor's mailbox (`troupe ctl jobs trace`,
	// Node.JobTrace): true or TROUPE_JOB_TRACE=on turns it on. Off
	// installs no middleware at all.
	JobTrace bool
}

// Timeouts are a node's job deadlines (Tuning.Timeouts; the file
// timeouts.yaml of `troupe node --timeouts` says the same).
type Timeouts struct {
	// Dispatch is how long a job may stay DISPATCHED before it times out.
	Dispatch time.Duration
	// Running is how long a job may stay RUNNING before it times out.
	Running time.Duration
	// PerTopic overrides Running for a topic (timeouts.yaml
	// topics.<t>.timeout_seconds).
	PerTopic map[string]time.Duration
}

// DefaultTuning returns every knob of Tuning at its default: the values a
// node uses for the fields its Config.Tuning leaves zero.
func DefaultTuning() Tuning {
	jobs := jobactor.DefaultTuning()
	return Tuning{
		StreamReplicas:        1,
		StreamMaxBytes:        bus.StreamMaxBytes,
		LockTTL:               store.LockTTLDefault,
		WorkerTTL:             registry.TTLDefault,
		MaxWorkers:            registry.MaxWorkersDefault,
		MaxPools:              registry.MaxPoolsDefault,
		JobShards:             16,
		MaxSchedulingAttempts: jobs.MaxSchedulingAttempts,
		PermanentGrace:        jobs.PermanentGrace,
		ParkAfter:             jobs.ParkAfter,
		RetryParkMin:          jobs.RetryParkMin,
		CapacityGrace:         jobs.CapacityGrace,
		AdmissionHold:         jobs.AdmissionHold,
		MaxAdmitting:          int(jobs.MaxAdmitting),
		ResendAfter:           jobs.ResendAfter,
		Timeouts:              (*Timeouts)(jobactor.DefaultTimeouts()),
		DuePoll:               recovery.DuePollDefault,
		DueSlack:              recovery.DueSlackDefault,
		DueIdlePoll:           recovery.DueIdleFactor * recovery.DuePollDefault,
		RescueAfter:           store.RescueAfterDefault,
		Retention:             store.RetentionDefault,
		DLQMaxBytes:           store.DLQMaxBytesDefault,
		StreamCheck:           bus.StreamCheckEvery,
		ReplayWindow:          signing.DefaultReplaySkew,
		ReplaySeen:            signing.DefaultReplaySeen,
		SagaStepBudget:        saga.StepBudgetDefault,
		SagaPoll:              saga.PollDefault,
		WorkerLostGrace:       jobs.WorkerLostGrace,
		UnknownHold:           jobs.UnknownHold,
		SagaRetention:         saga.RetentionDefault,
	}
}

// jobs is the job actors' share of the tuning.
func (t Tuning) jobs() jobactor.Tuning {
	return jobactor.Tuning{
		MaxSchedulingAttempts: t.MaxSchedulingAttempts, PermanentGrace: t.PermanentGrace, ParkAfter: t.ParkAfter,
		RetryParkMin: t.RetryParkMin, CapacityGrace: t.CapacityGrace, AdmissionHold: t.AdmissionHold, MaxAdmitting: int64(t.MaxAdmitting),
		ResendAfter: t.ResendAfter, WorkerLostGrace: t.WorkerLostGrace, UnknownHold: t.UnknownHold,
		SagaRetention: t.SagaRetention,
	}
}

// checkWorkerTTL warns when the worker TTL is too short for workers that
// beat at the CAP SDKs' interval: each would be too slow for it
// (registry.TooSlow), and the router would warn of them one by one. Not
// refused: a fleet that beats faster (announcing troupe.heartbeat_interval,
// or `troupe worker --heartbeat`) may want a short TTL.
func (n *Node) checkWorkerTTL() {
	floor := registry.MissedIntervals * registry.SDKHeartbeat
	if ttl := n.cfg.Tuning.WorkerTTL; ttl < floor {
		n.log.Warn("worker TTL is under three heartbeats of a stock CAP worker: workers beating at the SDKs' interval "+
			"will be evicted, or have direct dispatches dropped, after one lost heartbeat; raise the worker TTL (--worker-ttl, Tuning.WorkerTTL) to "+
			"ttl_at_least or make every worker beat at least every beat_at_most",
			"worker_ttl", ttl, "sdk_heartbeat", registry.SDKHeartbeat, "ttl_at_least", floor,
			"beat_at_most", ttl/registry.MissedIntervals)
	}
}

// checkRecordEncoding says, once at start, when Redis keeps job records in
// its larger hashtable encoding: hash-max-listpack-value under
// store.ListpackValueAdvised, where a real job's request (and the packed
// field) exceeds it. A performance note, not a fault: INFO. A server that
// refuses CONFIG GET (a managed Redis may) is not asked again, and nothing
// is logged.
func (n *Node) checkRecordEncoding(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	v, ok := n.store.HashListpackValue(ctx)
	if !ok || v >= store.ListpackValueAdvised {
		return
	}
	n.log.Info("Redis keeps job records in its hashtable encoding, since their longer fields (the request) exceed "+
		"hash-max-listpack-value; setting it to advised (redis.conf, or CONFIG SET on every master) measured ~1.3 KB "+
		"less Redis memory per record and ~3x cheaper record reads, at about the same CPU per job (BENCHMARKS.md)",
		"hash_max_listpack_value", v, "advised", store.ListpackValueAdvised)
}
