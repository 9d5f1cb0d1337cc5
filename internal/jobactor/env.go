package jobactor

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/defaults"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/keyslot"
	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/internal/outputgate"
	"github.com/troupe-run/troupe/internal/ratelimit"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/tracing"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// Defaults for Env fields left zero.
const (
	// MaxSchedulingAttemptsDefault attempts to place a job before it fails
	// with max_scheduling_retries.
	MaxSchedulingAttemptsDefault = 50
	// BackoffBase and BackoffCap shape the retry delay:
	// min(BackoffBase·2^attempt + jitter[0,500ms), BackoffCap).
	BackoffBase = time.Second
	BackoffCap  = 30 * time.Second
	// StateRetryDelay and ThrottleDelay: see package lifecycle.
	StateRetryDelay = lifecycle.StateRetryDelay
	ThrottleDelay   = lifecycle.ThrottleDelay
	// PolicyTimeout bounds one input policy check (CAP's 2 s), and
	// separately the wait for one of PolicySlots.
	PolicyTimeout = 2 * time.Second
	// PolicyConcurrencyDefault is how many remote policy checks a node has
	// outstanding at most.
	PolicyConcurrencyDefault = 256
	// CapacityGraceDefault is how long a newly submitted job that finds
	// no room may wait for it before its record is written (SCHEDULED
	// pool_overloaded / no_workers). Until then the submit stays un-acked
	// in JetStream (the node's Toucher tells JetStream it is in progress),
	// which keeps it as durably as the record would: a node that dies
	// leaves it to be offered to a replica. A placement within the grace
	// creates and dispatches the job in the one write a job with room
	// costs, so a burst larger than its pool's capacity is not charged a
	// write per job for waiting. Meanwhile the job is visible from the
	// node's memory (Node.WaitingJob: `troupe job`, GET /v1/jobs/{id}),
	// not from Redis. A job that waits longer is written once.
	CapacityGraceDefault = time.Minute
	// MaxUnwrittenWaitsDefault bounds the jobs of one node waiting within
	// their grace (past it a waiting job is written at once). Their
	// un-acked submits count against the submit consumer's MaxAckPending
	// (bus.MaxAckPendingDefault), which all replicas share and which must
	// stay above replicas × this bound: at it, JetStream would stop
	// offering submits to every replica. ~3 KB of node memory each.
	MaxUnwrittenWaitsDefault = 25000
	// MaxAdmittingDefault bounds the jobs a node has taken from the submit
	// stream and not yet dispatched, written as waiting, finished, or kept
	// waiting for room past their admission hold (lifecycle.AdmissionHoldDefault,
	// 2 s; see Env.Admitting). While it holds that many, it pulls no more
	// submits: a burst waits in JetStream rather than as actors in the
	// node's memory, and a pool that drains within the hold keeps no more
	// of it in memory than this. A pull already waiting at the server when
	// the bound is reached still takes up to a fetch batch per fetch loop,
	// so the count can pass it by that much; the default stays well below
	// MaxUnwrittenWaitsDefault, so a job queued within the node's bound
	// always gets its grace. Their submits are un-acked, so the bound is
	// also the submit consumer's pending set that nats-server encodes at
	// each of its state flushes: at 8,000 that flush was 6 % of the
	// server's CPU at full speed, at 500 2 % (profiles, 2026-11-25), and
	// the node's peak RSS 216–234 MiB against 151–159 at 2,000, with the
	// same throughput (BENCHMARKS.md).
	MaxAdmittingDefault = 2000

	// CapacityRecheck: see package lifecycle.
	CapacityRecheck = lifecycle.CapacityRecheck

	// WorkerLostGraceDefault: see Env.WorkerLostGrace.
	WorkerLostGraceDefault = time.Minute

	// UnknownHoldDefault is how long a result or cancel for a job with no
	// record waits for the record to appear (a replica that lost it with
	// Redis recreates it when its lock renewal, every LockTTL/3, notices)
	// before it is dead-lettered.
	UnknownHoldDefault = 30 * time.Second

	// PermanentGraceDefault is how long a job whose routing error is
	// permanent (topic unmapped, ...) keeps retrying before it fails, to ride
	// out a config rollout that lands after the first submits.
	PermanentGraceDefault = 10 * time.Second
	// ParkAfterDefault is how long a DISPATCHED or RUNNING job keeps a live
	// actor before it parks (its actor stops; its state, deadline and lock
	// stay in Redis, see JobActor.park). Most jobs end well within it and
	// never pay the two extra scripts (park, and the re-activation when the
	// result comes); a job held for minutes costs no memory on the node.
	ParkAfterDefault = 10 * time.Second
	// RetryParkMinDefault is the shortest retry backoff whose wait parks
	// (lifecycle.Config.RetryParkMin): the lock is released, the actor
	// stops, and the due poller brings the job back. A parked wait comes
	// back up to the due poller's slack and tick late (2–3 s by default)
	// and costs a release and an activation; from 30 s on that is at most
	// a tenth of the wait, and shorter backoffs (the 100 ms–1 s of a
	// quick retry) keep their exact timer. Users' caps of 5–30 min park.
	RetryParkMinDefault = 30 * time.Second
	// ResendAfterDefault is how long a job dispatched to a deduping worker
	// (registry.LabelDedupe) may stay DISPATCHED with no sign from the
	// worker before the dispatch is repeated; later repeats back off
	// (×2, capped at ResendCap). A job ending in a few seconds never pays.
	ResendAfterDefault = 5 * time.Second
	ResendCap          = lifecycle.ResendCap
	ResendsBeforePark  = lifecycle.ResendsBeforePark
)

// Env is what every job actor of a node shares. It is immutable after the
// node starts and safe for concurrent use.
type Env struct {
	NodeID   string
	Writer   *store.Writer
	Renewer  *store.LockRenewer
	Router   *actor.PID
	Policy   safety.InputPolicy
	Subjects bus.Subjects
	// Publish sends a core NATS message; it must not block on the network.
	Publish func(subject string, data []byte) error
	// DispatchStamp, when set, says what the node has heard of a worker
	// (router.Beats.Stamp): a direct dispatch carries it
	// (registry.EnvHeardBeat, registry.EnvEvictAfter), so the worker drops
	// one that reaches it after a silence it could have been evicted for.
	DispatchStamp func(workerID string) (heard time.Time, window time.Duration, ok bool)
	Log           *slog.Logger
	Root          *actor.RootContext
	Keys          *store.Keys
	Wheel         *Wheel
	Metrics       *Metrics
	// Timeouts are the dispatch and running deadlines (default DefaultTimeouts).
	Timeouts *Timeouts
	// Forward hands a result or cancel to the node that owns the job: nil
	// when that node took it (acked), ErrOwnerGone when no node listens on
	// the owner's inbox, another error otherwise. It blocks, so the actor
	// calls it from a goroutine. Nil: events go back to JetStream instead.
	Forward func(owner, kind string, raw []byte) error
	// OwnerWait reads how long an event whose owner did not answer should
	// wait (store.Store.OwnerWait: while the owner's node lease is fresh,
	// until it would go stale; else its lock's remaining TTL); with
	// LockTTL, it sets how long an event whose forward failed waits before
	// JetStream offers it again (ForwardRetryDelay). Nil: a second.
	OwnerWait func(ctx context.Context, jobID string) (time.Duration, error)
	LockTTL   time.Duration
	// Output checks results before they are called SUCCEEDED (phase 1) and
	// scans their content afterwards (phase 2, on Scans). Nil: no output
	// policy.
	Output *outputgate.Gate
	// Scans runs phase-2 content scans off the actors (nil with Output nil).
	Scans *ScanPool
	// TenantLimit returns a tenant's concurrency limit across all replicas
	// (0: none). A policy's max_concurrent_jobs constraint can lower it.
	TenantLimit func(tenant string) int
	// KeyLimit returns a concurrency key's limit (0: none) and strategy;
	// KeySlots keeps the keys' slots in Redis; KeyWaiters are this node's
	// jobs waiting for one. Nil KeyLimit: concurrency keys are ignored.
	KeyLimit   func(key string) (int, string)
	KeySlots   *keyslot.Slots
	KeyWaiters *KeyWaiters
	// Rates are the node's rate limit buckets (nil: none; see ratewait.go).
	Rates *ratelimit.Limiter
	// Redispatch reports whether jobs of topic are re-dispatched when their
	// worker is evicted before it starts them (nil: always).
	Redispatch func(topic string) bool
	// Retry is a job's retry policy (nil: jobs run once); see
	// lifecycle.Config.Retry.
	Retry func(req *capv1.JobRequest) jobstate.RetryPolicy

	// PolicySlots bounds the remote (non-inline) policy checks in flight
	// from this node (default PolicyConcurrencyDefault; see checkBounded).
	PolicySlots chan struct{}
	// DataLost reports whether Redis lost its data recently (nil: never):
	// a result or cancel for a job with no record is then dead-lettered as
	// state_lost rather than unknown_job.
	DataLost func() bool
	// Alone, when set, indexes the jobs this node leaves waiting alone
	// (lifecycle.Alone) until its actors take their locks again.
	Alone *AloneWaits
	// SafetyWaiters, when set, lets a successful policy check wake jobs
	// waiting on an unavailable policy (see SafetyWaiters).
	SafetyWaiters *SafetyWaiters

	// Connected reports whether the node's NATS connection is up (nil:
	// always). A resend due while it is down waits for it.
	Connected func() bool

	// OnTerminal, when set, is told the id of every job whose terminal
	// state this node writes (Node.Wait's waiters). It must not block.
	OnTerminal func(jobID string)

	// Tuning: the job actors' knobs (zero fields: DefaultTuning's).
	Tuning

	// Unwritten counts the jobs waiting within their capacity grace
	// (shared by the node's actors), at most MaxUnwrittenWaits.
	Unwritten *atomic.Int64
	// Toucher keeps those jobs' submits in progress at JetStream (nil:
	// not kept; a wait longer than the stream's first redelivery wait then
	// sees its submit offered again).
	Toucher *Toucher

	// Admitting counts the jobs whose actor was started by their submit and
	// that have not yet been dispatched, written as waiting for capacity,
	// finished, or kept waiting past their admission hold (shared by the node's actors; the submit fetch loop holds
	// while it is at MaxAdmitting). Negative MaxAdmitting: no bound.
	Admitting *atomic.Int64

	// Backoff returns the delay before scheduling attempt n (n ≥ 1).
	Backoff func(attempt int) time.Duration

	// Tracing, when set, gives every job OpenTelemetry spans (package
	// tracing; see JobActor's trace hooks). Nil: tracing is off, and a job
	// actor makes no call and no allocation for it.
	Tracing *tracing.Tracer

	// core is what the job's decision core knows of the node (WithDefaults).
	core *lifecycle.Config
}

// Tuning is what the node tunes of its job actors (troupe.Tuning sets it).
type Tuning struct {
	// MaxSchedulingAttempts before a job fails with max_scheduling_retries.
	MaxSchedulingAttempts int
	// PermanentGrace: how long a permanent routing error is retried.
	PermanentGrace time.Duration
	// ParkAfter is how long a job waiting for its worker keeps a live actor
	// before it parks (negative: never park).
	ParkAfter time.Duration
	// RetryParkMin: a retry wait with at least this long left parks
	// (RetryParkMinDefault; negative: never).
	RetryParkMin time.Duration
	// CapacityGrace: see CapacityGraceDefault (negative: write at once);
	// at most MaxUnwrittenWaits jobs wait within it.
	CapacityGrace     time.Duration
	MaxUnwrittenWaits int64
	// AdmissionHold: see lifecycle.AdmissionHoldDefault (negative: none).
	AdmissionHold time.Duration
	// MaxAdmitting: see MaxAdmittingDefault (negative: no bound).
	MaxAdmitting int64
	// ResendAfter: see ResendAfterDefault (negative: never resend).
	ResendAfter time.Duration
	// WorkerLostGrace: a job started on a worker that is then evicted ends
	// FAILED worker_lost this long after unless the worker answers
	// (negative: it waits for its deadline).
	WorkerLostGrace time.Duration
	// UnknownHold: how long a result or cancel for a job with no record is
	// handed back to JetStream before it is dead-lettered (negative: not at
	// all). See lifecycle.Job.unknownJob.
	UnknownHold time.Duration
	// SagaRetention is how long a workflow step's saga record (its
	// compensation template and stack entry, or its rollback trigger) is
	// kept after the step ends (saga.RetentionDefault when not positive).
	SagaRetention time.Duration
	// PolicyConcurrency bounds the remote policy checks in flight.
	PolicyConcurrency int
}

// DefaultTuning returns the job actors' defaults.
func DefaultTuning() Tuning {
	return Tuning{
		MaxSchedulingAttempts: MaxSchedulingAttemptsDefault, PermanentGrace: PermanentGraceDefault,
		ParkAfter: ParkAfterDefault, RetryParkMin: RetryParkMinDefault, CapacityGrace: CapacityGraceDefault, MaxUnwrittenWaits: MaxUnwrittenWaitsDefault,
		AdmissionHold: lifecycle.AdmissionHoldDefault, MaxAdmitting: MaxAdmittingDefault,
		ResendAfter: ResendAfterDefault, WorkerLostGrace: WorkerLostGraceDefault, UnknownHold: UnknownHoldDefault,
		PolicyConcurrency: PolicyConcurrencyDefault,
	}
}

// WithDefaults fills zero fields (Tuning's from DefaultTuning).
func (e *Env) WithDefaults() *Env {
	defaults.Fill(&e.Tuning, DefaultTuning())
	if e.MaxSchedulingAttempts < 0 {
		e.MaxSchedulingAttempts = MaxSchedulingAttemptsDefault
	}
	if e.PermanentGrace < 0 {
		e.PermanentGrace = PermanentGraceDefault
	}
	if e.PolicySlots == nil {
		e.PolicySlots = make(chan struct{}, e.PolicyConcurrency)
	}
	if e.Backoff == nil {
		e.Backoff = Backoff
	}
	if e.MaxUnwrittenWaits < 0 {
		e.MaxUnwrittenWaits = MaxUnwrittenWaitsDefault
	}
	if e.Unwritten == nil {
		e.Unwritten = &atomic.Int64{}
	}
	if e.Admitting == nil {
		e.Admitting = &atomic.Int64{}
	}
	if e.Log == nil {
		e.Log = slog.Default()
	}
	if e.Metrics == nil {
		e.Metrics = NewMetrics(nil)
	}
	if e.Timeouts == nil {
		e.Timeouts = DefaultTimeouts()
	}
	e.core = e.coreConfig()
	return e
}

// coreConfig is the decision core's view of the node.
func (e *Env) coreConfig() *lifecycle.Config {
	cfg := &lifecycle.Config{
		NodeID:        e.NodeID,
		SubmitSubject: e.Subjects.Submit, ResultSubject: e.Subjects.Result,
		Dispatch: e.Timeouts.Dispatch, RunningFor: e.Timeouts.RunningFor,
		TenantLimit: e.TenantLimit, Redispatch: e.Redispatch, KeyLimit: e.KeyLimit, Retry: e.Retry,
		Backoff: e.Backoff, MaxSchedulingAttempts: e.MaxSchedulingAttempts, PermanentGrace: e.PermanentGrace,
		ParkAfter: e.ParkAfter, RateParkAfter: e.ParkAfter, RetryParkMin: e.RetryParkMin, ResendAfter: e.ResendAfter, CapacityGrace: e.CapacityGrace,
		AdmissionHold: e.AdmissionHold,
		Saga:          sagaRecorder(e.SagaRetention), UnknownHold: max(e.UnknownHold, 0),
		WorkerLostGrace: max(e.WorkerLostGrace, 0),
		Direct:          e.Subjects.IsWorker,
		Output:          e.Output != nil, PolicyWaiters: e.SafetyWaiters != nil, Forward: e.Forward != nil,
		Debug: e.Log.Enabled(context.Background(), slog.LevelDebug), Trace: e.Tracing != nil,
	}
	if e.Rates != nil {
		// The limiter's current buckets: a pools reload changes them.
		cfg.RateLimit = e.Rates.ForJob
	}
	if e.Keys != nil {
		cfg.IdemKey, cfg.TenantKey = e.Keys.Idempotency, e.Keys.TenantActive
	}
	return cfg
}

// Backoff is the scheduling retry delay: min(1 s·2^attempt + jitter, 30 s),
// with jitter drawn from crypto/rand in [0, 500 ms) so that jobs that failed
// together do not retry together.
func Backoff(attempt int) time.Duration {
	d := BackoffCap
	if attempt < 5 { // 2^5 s already exceeds the cap
		d = min(BackoffBase<<attempt, BackoffCap)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	jitter := time.Duration(binary.LittleEndian.Uint64(b[:]) % uint64(500*time.Millisecond))
	return min(d+jitter, BackoffCap)
}
