// Package lifecycle is a job's life as one pure decision core: every rule of
// a job — admission, routing and capacity waits, dispatch and resends,
// progress, results and output checks, cancel, deadlines, worker loss,
// adoption, parking, and what a fenced or failed write means — in one place,
// with no Redis, NATS, actor context or wall clock.
//
// The job actor (package actors) is a thin shell around it: it feeds each
// message in as an event, with the facts of the moment (Inputs: the time, a
// fresh write id, ...), and carries out the effects Step returns, in order:
// writes, publishes, router messages, timers, acks. The answers to the
// shell's asynchronous steps (a write's outcome, the router's pick, the
// policy's decision) come back as events too. Because the core is pure, a
// deterministic simulator (sim_test.go) drives thousands of jobs through
// random interleavings and faults and checks the invariants after every step.
//
// What the core promises:
//   - It is the only writer of its job's state while it holds the job's
//     lock, and every write is a fenced compare-and-set (store
//     transitionScript): once another holder has taken the lock, the write is
//     refused and the job stops without side effects — the effects a write
//     was for (publishes, DLQ announcements, client outcomes) are emitted
//     only when its reply says it applied.
//   - Nothing is published for a job whose state could not be read: a write
//     error means "unknown", and the job does nothing but try again after
//     StateRetryDelay, keeping its deliveries.
//   - A request is published to a worker only after DISPATCHED is durable,
//     so a stale holder can never dispatch a job a second time.
//   - A delivery is acked only after its effect is durable; redelivery is
//     harmless (duplicate submits, results and cancels for finished jobs are
//     absorbed; a terminal job never leaves its state).
//   - Every wait has a wake source: a timer, a due entry in Redis, the
//     router's capacity queue, or a recorded approval request.
//   - An unavailable input policy never denies or fails a job.
package lifecycle

import (
	"log/slog"
	"strings"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Durations the core uses.
const (
	// StateRetryDelay is the wait before retrying after Redis could not be
	// read or written: the job does nothing while its state is unknown.
	StateRetryDelay = time.Second
	// ThrottleDelay is the wait after a THROTTLE decision (CAP's 5 s).
	ThrottleDelay = 5 * time.Second
	// CapacityRecheck is how often a job waiting in the router's queue for
	// room (pool_overloaded) asks again, in memory: the safety net for a lost
	// wake (a router restart loses its queue). The wait itself ends the
	// moment a slot frees.
	CapacityRecheck = 10 * time.Second
	// AdmissionHoldDefault is how long a fresh job waiting for room within its
	// capacity grace keeps counting in the node's admissions (the bound
	// that holds the submit fetch loops). A short wait — the pool drains
	// the node's own backlog — holds the stream, so a burst waits there
	// rather than in the node; a longer one lets the stream move on, so a
	// full pool holds other pools' submits up for at most this long.
	AdmissionHoldDefault = 2 * time.Second
	// NoWorkersGrace bounds the capacity grace of a job whose pools have
	// no live worker (no_workers, stale_worker): such a wait may last until
	// the job fails (max_scheduling_retries), so it is written — shown in
	// Redis, rechecked on the scheduling backoff — after this long.
	NoWorkersGrace = 2 * time.Second
	// ResendCap bounds the wait between repeats of a dispatch.
	ResendCap = 30 * time.Second
	// ResendsBeforePark: a DISPATCHED job that may be resent parks only
	// after this many repeats (5+10+20+30 s), since a parked job is not
	// resent.
	ResendsBeforePark = 4
	// UnknownHoldDelay: a result or cancel for a job with no record is
	// handed back this far apart while younger than Config.UnknownHold
	// (see unknownJob).
	UnknownHoldDelay = 3 * time.Second
)

// Config is what the core knows of its node: immutable values and pure
// functions of them.
type Config struct {
	NodeID string
	// IdemKey and TenantKey name the Redis keys of an idempotency claim and
	// of a tenant's concurrency slots.
	IdemKey   func(tenant, key string) string
	TenantKey func(tenant string) string
	// SubmitSubject and ResultSubject name DLQ entries' origins.
	SubmitSubject, ResultSubject string
	// Dispatch is the DISPATCHED timeout; RunningFor a topic's RUNNING one.
	Dispatch   time.Duration
	RunningFor func(topic string) time.Duration
	// TenantLimit is a tenant's concurrency limit (0: none).
	TenantLimit func(tenant string) int
	// KeyLimit is a concurrency key's limit (0: none) and strategy
	// (KeyQueue, KeyCancelNewest, KeyCancelInProgress); nil: no keys.
	KeyLimit func(key string) (int, string)
	// Redispatch reports whether jobs of topic are dispatched again when
	// their worker is lost before starting them (nil: always).
	Redispatch func(topic string) bool
	// Backoff is the delay before scheduling attempt n (n ≥ 1).
	Backoff               func(attempt int) time.Duration
	MaxSchedulingAttempts int
	PermanentGrace        time.Duration
	// ParkAfter (≤ 0: never), ResendAfter (≤ 0: never) and CapacityGrace
	// (≤ 0: none): see package actors.
	ParkAfter, ResendAfter, CapacityGrace time.Duration
	// RateParkAfter: how long a wait for rate limit tokens keeps a live
	// actor before it parks (≤ 0: never; the node's ParkAfter).
	RateParkAfter time.Duration
	// RetryParkMin: a retry wait with at least this long left parks — its
	// lock is released and its actor stops; the due set brings it back at
	// its retry time (≤ 0: never; see retry.go).
	RetryParkMin time.Duration
	// AdmissionHold: see AdmissionHoldDefault (≤ 0: none, the wait leaves
	// the node's admissions at once).
	AdmissionHold time.Duration
	// Output: results pass the output policy before SUCCEEDED.
	Output bool
	// PolicyWaiters: the node keeps waiters on an unavailable policy.
	PolicyWaiters bool
	// Forward: results and cancels for a job another node owns may be
	// forwarded to it.
	Forward bool
	// UnknownHold: how long a result or cancel for a job with no record is
	// handed back before it is dead-lettered (0: not at all).
	UnknownHold time.Duration
	// Saga adds a workflow step's saga bookkeeping to t, its terminal
	// write at now: the succeeded step's compensation (its template,
	// joining the workflow's stack), or with failed the workflow's rollback
	// trigger (the shell's saga package knows the keys). Nil: no sagas.
	Saga func(t *jobstate.Transition, req *capv1.JobRequest, jobID string, now time.Time, failed bool)
	// WorkerLostGrace: a job started on a worker that is then evicted ends
	// FAILED worker_lost this long after, unless its result or progress
	// comes first (≤ 0: it waits for its own deadline).
	WorkerLostGrace time.Duration
	// Retry is a job's retry policy, from its request (its topic's
	// policy, overridden by its labels). Nil, or MaxAttempts ≤ 1: a job
	// runs once. See retry.go.
	Retry func(req *capv1.JobRequest) jobstate.RetryPolicy
	// RateLimit names the token bucket and units the job takes before it
	// asks for a worker ("": none), or the problem that makes its
	// declaration ungrantable (see ratewait.go). Nil: no rate limits.
	RateLimit func(req *capv1.JobRequest) (bucket string, units int, problem string)
	// Direct reports whether subject reaches exactly worker (a direct
	// dispatch; on a pool subject NATS chose the receiver). Nil: never.
	Direct func(subject, worker string) bool
	// Debug: emit the debug log lines (each costs its arguments).
	Debug bool
	// Trace: emit Moved and Resumed effects, for the node's OpenTelemetry
	// spans (off: neither is built).
	Trace bool
}

// Inputs are the facts of the moment an event is handled, and the node's
// counters, as the shell provides them: the core asks only for what a
// decision needs (reading the clock costs, and most steps need no write
// id). Within one Step, Now is read at most once.
type Inputs interface {
	Now() time.Time
	// OpID is a fresh random number: the id of a write (a retried write
	// recognises itself by it).
	OpID() uint64
	// GraceRoom: the node may hold one more job waiting unwritten.
	GraceRoom() bool
	// DataLost: Redis lost its data recently.
	DataLost() bool
	// Connected: the node's NATS connection is up.
	Connected() bool
	// Count adds one to a counter; Observe records a histogram value.
	// (Observations only: nothing the core decides depends on them.)
	Count(m Metric, label string)
	Observe(m Metric, value float64)
}

// owed is what a result owes besides its outcome while the output
// policy's phase 1 runs on it (Job.outputOwed).
type owed struct {
	fields []string
	fx     []Effect
}

// Job is one job's state as its holder knows it, and the core's bookkeeping
// of the one step it waits for. Step is its only mutator.
//
// A Job is allocated per job: its one-byte fields sit together, so that it
// and the runtime's 8-byte header fit the 1,536-byte size class, not the
// 1,792 one (TestJobFitsItsSizeClass).
type Job struct {
	cfg *Config

	ID        string
	State     jobstate.State
	LockValue string
	Fence     int64
	Req       *capv1.JobRequest
	TraceID   string
	Worker    string
	Subject   string
	// pool is the pool of the dispatch's worker (recorded as "pool"): on a
	// pool subject, a worker key of that pool may speak for the job first.
	pool       string
	LastReason jobstate.Reason // the reason of the last state change

	attempts int
	// try is the attempt the job is on (0: the first; see retry.go),
	// retryAt when a job waiting to be retried runs again (zero: not
	// waiting), retry its policy (read from Req once: retrySet).
	try         int
	retryAt     time.Time
	retry       jobstate.RetryPolicy
	policyTries int       // checks an unavailable policy refused (backoff only)
	firstFail   time.Time // first permanent routing error, for the grace window
	created     time.Time
	deadline    time.Time
	deadlineWhy jobstate.Reason
	record      map[string]string // the record as read at adoption
	policyLimit int               // max_concurrent_jobs from the policy's constraints
	admitAt     time.Time         // when it last asked for that slot (see TenantSlotFresh)
	ks          keyState          // its concurrency key (keyslot.go)
	lost        jobstate.State    // the state known when the lock vanished
	decision    []string          // the policy's decision as fields, until written
	woken       bool              // activated by the due poller
	wokenLost   bool              // woken as a wait left alone after Redis lost its data (Wake.Lost)
	retrySet    bool              // retry read (see try)
	admitted    bool              // the job holds one of its tenant's slots
	idemChecked bool
	lapsedAt    time.Time // when a dead holder's lock lapsed
	firstEvent  time.Time
	// parkAt is when a job waiting for its worker parks (zero: not
	// waiting).
	parkAt time.Time
	// resendAt is when the dispatch is repeated (resend), while
	// DISPATCHED (or recalling); resends counts the repeats made.
	resendAt time.Time
	resends  int
	// recall: the job's result may have been lost with the result stream;
	// its dispatch is repeated, DISPATCHED or RUNNING, until the worker
	// answers (a progress, or its result again).
	recall bool
	// startsOnDelivery: the worker sends no progress; the job counts as
	// started once delivered.
	startsOnDelivery bool
	// waitingPolicy: the node keeps this job among the waiters on an
	// unavailable policy (a registration to undo, within Live; not where
	// the job lives).
	waitingPolicy bool
	// resend: the dispatch may be repeated (the worker dedupes; see
	// resendAt).
	resend bool
	// probed: the job's record was looked for before its first wait
	// within the grace (a repeated submit of a job that exists elsewhere
	// must not wait here as a new one).
	probed bool
	// queued: the job holds a place in the router's capacity queue under
	// ticket (a new ticket per wait), for capReason. A place in the queue
	// is held while Unwritten (always) or Live (a written wait); it is the
	// router's memory, to be given back on every exit, not a residency.
	queued    bool
	ticket    uint64
	capReason jobstate.Reason
	// ticketFor: the attempt the place under ticket was asked for (its
	// rate limit tokens taken): a placement for another is not used.
	ticketFor int
	// While Unwritten: the grace ends at graceEnd; the router is asked
	// again at recheckAt; until holdEnd (zero: over) the job counts in the
	// node's admissions.
	graceEnd, recheckAt, holdEnd time.Time
	// submitted is when the job's submit was stored (zero: unknown), and
	// waitedAt when its wait within the grace began (zero: none): the
	// record created after them says so (historyFields).
	submitted, waitedAt time.Time
	// picked is the worker of a pick not (yet) made a dispatch.
	picked string
	// res is where the job lives (see Residency): every change goes
	// through moveTo, checked against the table of legal moves.
	res Residency
	// runnerKnown: the job's worker is the one that runs it — it spoke for the
	// job (progress), or was dispatched to directly.
	runnerKnown bool
	// lostNoted: a loss of a worker that may not run the job is recorded.
	lostNoted bool
	// runnerSet, asksSet: the record may name a runner, a slot ask
	// (tsat, ksat) from an earlier dispatch, which the next dispatch
	// clears (adopted records, and this actor's writes).
	runnerSet, asksSet bool
	// rate is the job's wait for its rate limit tokens (ratewait.go).
	rate rateWait
	// lostWorkers lists the workers of earlier dispatches given up when
	// their worker was evicted (comma-separated, as recorded).
	lostWorkers string

	// The one outstanding asynchronous step: its epoch (answers with
	// another are dropped) and, for a write, what the write is for. While
	// busy, other events wait in deferred, in order.
	opEpoch uint64
	busy    bool
	// nums holds the digits of the job's number fields (numfield.go).
	nums *numArena
	// outputOwed holds, while the output policy's phase 1 runs on a
	// result, what that result owes besides its outcome: record fields
	// (result_of) and effects (a later dispatch's cancel, a log line).
	outputOwed *owed
	pending    *pending
	spare      *pending // a finished write step, reused by pend
	deferred   []any
	// acks are deliveries to acknowledge once the current write is durable.
	acks []Delivery

	timerEpoch uint64
	timerAt    time.Time // zero: no timer

	in    Inputs
	nowAt time.Time // Now, once read in this step
	fx    []Effect
	fxa   *fxArena // this step's pointer effects' storage (see Consumed)

	// Storage allocated with the job rather than on its first use: the
	// effects of a busy step (fx's first backing array), its first write
	// step (spare's first value) and acks' first backing array (a job
	// holds one delivery at a time as a rule: its submit, then its
	// result). Three allocations a job fewer.
	fxBuf     [8]Effect
	firstStep pending
	acksBuf   [1]Delivery
}

// New returns the core of job id. Seed starts its epochs and wait tickets: a fresh actor of
// the job (after a restart, or a new spawn under the same name) must not
// take answers meant for an earlier one as its own, so the shell passes a
// random seed.
func New(cfg *Config, id string, seed uint64) *Job {
	seed >>= 2 // room to count up
	// Room for the effects of a busy step, so that emit does not grow the
	// slice a step at a time (it is reused from step to step).
	j := &Job{cfg: cfg, ID: id, opEpoch: seed, timerEpoch: seed, ticket: seed}
	j.fx = j.fxBuf[:0]
	j.spare = &j.firstStep
	j.acks = j.acksBuf[:0]
	return j
}

// Done reports whether the job's actor has nothing left to do.
func (j *Job) Done() bool { return j.res.Gone() }

// Step handles one event and returns the effects to carry out, in order.
// The returned slice is valid until the next Step; its pointer effects
// (see Effect) until the next Step or Consumed.
func (j *Job) Step(ev any, in Inputs) []Effect {
	j.in, j.nowAt = in, time.Time{}
	j.fx = j.fx[:0]
	j.fxa = nil // the last step's, if the shell did not give it back
	j.receive(ev)
	return j.fx
}

func (j *Job) emit(e Effect) { j.fx = append(j.fx, e) }

func (j *Job) now() time.Time {
	if j.nowAt.IsZero() {
		j.nowAt = j.in.Now()
	}
	return j.nowAt
}

// receive is the job's mailbox: replies to its own steps first, then input
// events, routed by what they do in the job's residency (OutcomeOf):
// handled now, or deferred while a step is outstanding. A gone actor has
// no step outstanding: a late reply is dropped.
func (j *Job) receive(ev any) {
	if j.reply(ev) {
		return
	}
	k, ok := KindOf(ev)
	if !ok {
		j.event(ev)
		return
	}
	switch m := ev.(type) {
	case *Restarting:
		if OutcomeOf(j.res, k) == Stop {
			j.onRestarting()
		}
		return
	case *Stopping:
		if o := OutcomeOf(j.res, k); o == Stop || o == Release {
			j.onStopping()
		}
		return
	case *Timer:
		if m.Epoch != j.timerEpoch {
			return
		}
		j.timerAt = time.Time{}
	case *LockLost:
		if m.LockValue != j.LockValue {
			return
		}
		switch OutcomeOf(j.res, k) {
		case Handle:
			// Nobody holds the lock (it expired, or Redis lost its data):
			// nothing else holds the job, so take it again, in order with
			// the job's other events.
			j.event(m)
		case Stop:
			j.lockTaken()
		}
		return
	case *Placed:
		// Answered at once, busy or not, so the router knows the slot is
		// taken (or free again); acted on in order with other events.
		used := j.queued && m.Ticket == j.ticket && !j.res.Gone()
		j.toRouter(&Took{JobID: m.JobID, WorkerID: m.Reply.WorkerID, Ticket: m.Ticket, Used: used})
		if !used {
			return
		}
		j.queued = false
	}
	j.event(ev)
}

// reply handles an answer to one of the job's own steps (false: ev is
// not one).
func (j *Job) reply(ev any) bool {
	switch m := ev.(type) {
	case *WriteDone:
		if m.Epoch != j.opEpoch || !j.busy || j.pending == nil {
			return true
		}
		p := j.pending
		j.busy, j.pending = false, nil
		j.written(p, &m.Res)
		j.recycle(p)
		j.drain()
	case *RetryNow:
		if m.Epoch != j.opEpoch || !j.busy || j.pending == nil {
			return true
		}
		j.busy = false
		p := j.pending
		j.pending = nil
		j.writeTry(p, true)
	case *PolicyDone:
		if m.Epoch != j.opEpoch || !j.busy {
			return true
		}
		j.busy = false
		j.onDecision(m)
		j.drain()
	case *OutputDone:
		if m.Epoch != j.opEpoch || !j.busy {
			return true
		}
		j.busy = false
		j.onOutput(m)
		j.drain()
	case *KeySlotDone:
		if m.Epoch != j.opEpoch || !j.busy {
			return true
		}
		j.busy = false
		j.onKeySlot(m)
		j.drain()
	case *PublishFailed:
		if !j.res.Gone() {
			j.onPublishFailed(m)
			j.drain()
		}
	case *Tokens:
		j.onTokens(m)
	case *PickReply:
		if m.Epoch != j.opEpoch || !j.busy {
			// An answer to a question no longer asked: the worker it names
			// is not going to get this job, so its slot is freed.
			if m.WorkerID != "" && !m.Queued && m.WorkerID != j.Worker && m.WorkerID != j.picked {
				j.toRouter(&Released{WorkerID: m.WorkerID, JobID: j.ID, Done: true})
			}
			return true
		}
		j.busy = false
		j.onPick(m)
		j.drain()
	default:
		return false
	}
	return true
}

// lockTaken: another holder has the job's lock; the actor stops without
// side effects, and what it held goes back to JetStream for the holder.
func (j *Job) lockTaken() {
	j.log(warn, "job lock lost; stopping without side effects")
	j.LockValue = ""
	j.finish()
}

// event handles an input event now, or later if a step is outstanding.
func (j *Job) event(m any) {
	if j.busy {
		j.deferred = append(j.deferred, m)
		return
	}
	j.handle(m)
}

// drain handles deferred events until one of them starts a step.
func (j *Job) drain() {
	for !j.busy && len(j.deferred) > 0 {
		m := j.deferred[0]
		j.deferred[0] = nil
		j.deferred = j.deferred[1:]
		j.handle(m)
	}
	if len(j.deferred) == 0 {
		j.deferred = nil
	}
}

// handle processes one input event, as its residency says (OutcomeOf).
func (j *Job) handle(m any) {
	if t, ok := m.(*Tokens); ok {
		j.onTokens(t) // a grant deferred while a step was outstanding
		return
	}
	k, _ := KindOf(m)
	o := OutcomeOf(j.res, k)
	if j.res.Gone() {
		j.absorb(m, o)
		return
	}
	if j.firstEvent.IsZero() {
		j.firstEvent = j.now()
	}
	if r, ok := m.(*Result); ok && j.TraceID == "" {
		j.TraceID = r.TraceID
	}
	switch o {
	case Ignore:
		return
	case Activate:
		// Known only from its record (an event for a job parked here,
		// or owned elsewhere): the job is activated first, then the
		// event handled.
		if w, ok := m.(*Wake); ok {
			j.woken, j.lapsedAt, j.wokenLost = true, w.LapsedAt, w.Lost
			j.activate(false, nil)
			return
		}
		j.activateFor(m)
		return
	case CreateCancelled:
		j.cancelUnwritten(m.(*Cancel))
		return
	case Retry:
		// A result for this job id while it waits unwritten here: its
		// submit may be a repeat of a job that exists, dispatched by
		// another node (a client resubmitting, a SUBMIT stream lost). Taken
		// here it would be lost; it is offered again in a moment, when
		// the job's holder (or this job, once written) takes it.
		if r, ok := m.(*Result); ok {
			j.emit(Nak{D: r.Delivery, Delay: UnwrittenResultRetry})
		}
		return
	case WriteWait:
		// Its previous actor failed for good: the wait is written first,
		// so the failure lands on the job's record.
		j.deferred = append([]any{m}, j.deferred...)
		j.disarm()
		j.withdraw()
		j.writeWait(j.now().Add(j.recheckDelay()))
		return
	}
	switch m := m.(type) {
	case *Submit:
		j.onSubmit(m)
	case *Result:
		j.onResult(m)
	case *Cancel:
		j.onCancel(m)
	case *Progress:
		j.onProgress(m)
	case *WorkerLost:
		j.onWorkerLost(m)
	case *ResultsLost:
		j.onResultsLost()
	case *Abandon:
		j.onAbandon(m)
	case *Timer:
		j.onTimer()
	case *Placed:
		j.onPlaced(m)
	case *LockLost:
		// A renewal found no lock (see receive).
		if m.LockValue != j.LockValue {
			return // a lock given up meanwhile
		}
		if j.Req == nil {
			j.lockTaken() // nothing to take the job again with
			return
		}
		j.log(warn, "job lock vanished at renewal; re-activating", "state", j.State)
		j.disarm()
		j.recover()
	case *KeyBack:
		j.onKeyBack()
	case *PolicyBack:
		if j.waitingPolicy {
			// Woken early: another job's check has just succeeded.
			j.waitingPolicy = false
			j.disarm()
			j.advance()
		}
	}
}

func (j *Job) onProgress(m *Progress) {
	if j.staleAttempt(m.P.GetJobId()) {
		return // from the worker of an attempt the job is past
	}
	if !j.mayReport(m.By, m.From) {
		j.refuse(jobstate.ReasonNotJobWorker, "progress from worker "+m.From+", not the job's", m.Refuse, nil)
		return
	}
	heard := j.recall && (m.From == "" || m.From == j.Worker)
	if heard {
		// The worker answered a repeat: it holds the job, and its
		// result will come.
		j.recall, j.resendAt = false, time.Time{}
	}
	from := m.From
	if from != "" && from != j.Worker && (j.lostWorker(from) || j.direct()) {
		// A worker of an earlier dispatch still running the job (its
		// result will end it, see onResult), or a stray: the job's
		// worker stays the one it is dispatched to.
		from = ""
	}
	if j.State == jobstate.StateDispatched || j.State == jobstate.StateRunning &&
		(j.deadlineWhy == jobstate.ReasonWorkerLost || from != "" && from != j.Worker) {
		j.markRunning(from)
		return
	}
	if from != "" && from == j.Worker {
		j.runnerKnown = true
	}
	if heard {
		j.armWait()
	}
}

// UnwrittenResultRetry is how soon a result that reached a job waiting
// unwritten is offered again (to any node): long enough not to spin, short
// beside a job's run.
const UnwrittenResultRetry = time.Second

// activateFor activates an existing job for an event that must not create
// one; the event is handled once the job's state is known.
func (j *Job) activateFor(m any) {
	j.deferred = append([]any{m}, j.deferred...)
	j.activate(false, nil)
}

// absorb handles an event that reaches the job after its actor finished,
// with its outcome o in the job's residency.
func (j *Job) absorb(m any, o Outcome) {
	var d Delivery
	kind := "submit"
	switch m := m.(type) {
	case *Submit:
		d = m.Delivery
	case *Result:
		d, kind = m.Delivery, "result"
	case *Cancel:
		d, kind = m.Delivery, "cancel"
	case *Progress:
		if o == PassOn && j.State == jobstate.StateDispatched {
			// The job parked a moment ago: its worker's first progress
			// is for the job's next actor, which the supervisor spawns for
			// it (a parked DISPATCHED job is remembered).
			j.emit(Redeliver{Msgs: []any{m}})
		}
		return
	default:
		if o == PassOn {
			// Its eviction or a lost result stream, likewise.
			j.emit(Redeliver{Msgs: []any{m}})
		}
		return
	}
	if o == Absorb || j.State.Terminal() {
		j.count(MAbsorbed, kind)
		j.ack(d)
		return
	}
	// The job lives elsewhere (another node owns it, it is parked, or it
	// was passivated a moment ago): let JetStream offer the message again.
	j.nak(d, time.Second)
}

// advance does the next thing the job's state calls for.
func (j *Job) advance() {
	switch j.State {
	case jobstate.StatePending:
		j.checkPolicy()
	case jobstate.StateScheduled:
		if !j.retryAt.IsZero() && j.now().Before(j.retryAt) {
			// Woken before its retry's backoff ended (an adoption, a
			// restart, an event for the parked wait): the wait goes on.
			j.waitRetry()
			return
		}
		j.askRouter()
	case jobstate.StateApprovalRequired:
		j.resumeApproval()
	case jobstate.StateDispatched, jobstate.StateRunning:
		j.watchDeadline()
	default:
		if j.State.Terminal() {
			j.finish()
		}
	}
}

// onTimer: the job's timer fired — a retry, a deadline, a resend, parking,
// or the end of a capacity grace.
func (j *Job) onTimer() {
	j.stopWaitingPolicy()
	if j.res == Unwritten && j.queued {
		j.onUnwrittenTimer()
		return
	}
	j.advance()
}

func (j *Job) stopWaitingPolicy() {
	if j.waitingPolicy {
		j.waitingPolicy = false
		j.emit(WaitPolicy{On: false})
	}
}

// arm sets the job's one timer to at (replacing any other).
func (j *Job) arm(at time.Time) {
	j.timerEpoch++
	j.timerAt = at
	j.emitArm(Arm{At: at, Epoch: j.timerEpoch})
}

func (j *Job) disarm() {
	if !j.timerAt.IsZero() {
		j.emit(Disarm{})
		j.timerAt = time.Time{}
	}
	j.timerEpoch++
}

// finish ends the actor's work: its supervisor will stop it. The job is
// then Ended (terminal), Parked (parkedAt) or Away; see finishIn.
func (j *Job) finish() {
	switch {
	case j.State.Terminal():
		j.finishIn(Ended)
	default:
		j.finishIn(Away)
	}
}

// finishIn ends the actor's work with the job in residency gone (Parked:
// its lock held by the node lease; Away: elsewhere; Ended: terminal, or
// the submit a duplicate).
func (j *Job) finishIn(gone Residency) {
	if j.res.Gone() {
		return
	}
	j.disarm()
	j.stopWaitingPolicy()
	j.withdraw()
	j.dropPick()
	j.leaveGrace()
	if gone == Parked && !active(j.State) && !j.rate.parked {
		gone = Away
	}
	if gone == Away && j.State.Terminal() {
		gone = Ended
	}
	if !j.moveTo(gone) {
		return
	}
	if j.busy {
		// A step was outstanding (the lock was taken meanwhile): its
		// answer will be dropped, and what it held goes back.
		j.busy, j.pending = false, nil
		j.nakAll(second)
	}
	if j.LockValue != "" {
		j.emitForget(Forget{LockValue: j.LockValue})
	}
	parked := gone == Parked
	if j.State == jobstate.StateDispatched && !parked {
		j.release(false)
	}
	var again []any
	// Anything still deferred is absorbed — except the progress and
	// eviction of a parked job, which go to its next actor.
	for _, m := range j.deferred {
		switch m.(type) {
		case *Progress:
			if parked && j.State == jobstate.StateDispatched {
				again = append(again, m)
				continue
			}
		case *WorkerLost, *ResultsLost:
			if parked {
				again = append(again, m)
				continue
			}
		case *Tokens:
			// The limiter's answer to a parked ask is the next actor's; a
			// grant nobody here will use goes back.
			if m := m.(*Tokens); parked && j.rate.parked && (m.Granted || m.Invalid != "") {
				again = append(again, m)
			} else if m.Granted {
				j.emit(LeaveTokens{Bucket: m.Bucket, Epoch: m.Epoch, Return: m.Units})
			}
			continue
		}
		k, _ := KindOf(m)
		j.absorb(m, OutcomeOf(gone, k))
	}
	j.deferred = nil
	j.emit(Finish{Parked: parked, Running: parked && j.State == jobstate.StateRunning, Redeliver: again})
}

// onRestarting: a fresh actor replaces this one and recovers from Redis;
// what this one held goes back to JetStream at once. The lock stays: the
// new instance, on the same node, re-takes it with a new fence.
func (j *Job) onRestarting() {
	if j.wokenLost {
		// A wait left alone, woken as lost after Redis lost its data: no
		// event is owed to it, and the sweep that woke it has dropped it
		// from the node's index, so the fresh actor gets the wake again
		// or the job never ends (simulator seed 9103562).
		j.emit(Redeliver{Msgs: []any{&Wake{Lost: true}}})
	}
	if j.rate.parked {
		// A park under way (ParkTokens sent, the park write not answered):
		// the ask is the limiter's now (epoch 0), which hands its answer to
		// the job's next actor through the node. Leaving it (withdraw)
		// would leave the job parked with nothing to wake it, for as long
		// as the node lives (simulator seed 9400285).
		j.rate.queued, j.rate.asking = false, false
	}
	j.disarm()
	j.stopWaitingPolicy()
	j.withdraw()
	j.dropPick()
	j.leaveGrace()
	if j.LockValue != "" {
		j.emitForget(Forget{LockValue: j.LockValue})
	}
	j.returnDeliveries()
}

func (j *Job) returnDeliveries() {
	for _, d := range j.acks {
		j.nak(d, 0)
	}
	j.acks = nil
	for _, m := range j.deferred {
		switch m := m.(type) {
		case *Submit:
			j.nak(m.Delivery, 0)
		case *Result:
			j.nak(m.Delivery, 0)
		case *Cancel:
			j.nak(m.Delivery, 0)
		}
	}
	j.deferred = nil
}

func (j *Job) ackAll() {
	for _, d := range j.acks {
		j.ack(d)
	}
	j.acks = j.acks[:0]
}

func (j *Job) nakAll(delay time.Duration) {
	for _, d := range j.acks {
		j.nak(d, delay)
	}
	j.acks = j.acks[:0]
}

// mayReport reports whether a verified sender may speak for the job as
// worker (a result's worker_id, a progress's sender). Unsigned mode, legacy
// keys and node keys are trusted. A worker key speaks for its own ids
// (intake checked that), and only for the job's worker or a worker of an
// earlier dispatch; on a pool subject NATS chose the receiver, so until a
// worker has spoken for the job any worker of the job's pool may, and the
// first to speak binds the job (markRunning).
func (j *Job) mayReport(by Sender, worker string) bool {
	if by == nil || !by.WorkerKey() {
		return true
	}
	if worker == "" {
		return false
	}
	if worker == j.Worker || j.lostWorker(worker) {
		return true
	}
	return !j.direct() && !j.runnerKnown && j.pool != "" && by.InPool(j.pool)
}

// refuse leaves the job as it is and has the shell dead-letter, count and
// settle the refused event.
func (j *Job) refuse(reason jobstate.Reason, detail string, refuse func(jobstate.Reason, string), d Delivery) {
	j.log(warn, "event refused", "reason", reason, "detail", detail)
	j.emit(Refusal{Reason: reason, Detail: detail, Refuse: refuse, D: d})
}

func (j *Job) ack(d Delivery) {
	if d != nil {
		a := j.arena()
		p := slot(a.ack[:], &a.nAck)
		p.D = d
		j.emit(p)
	}
}

func (j *Job) nak(d Delivery, delay time.Duration) {
	if d != nil {
		j.emit(Nak{D: d, Delay: delay})
	}
}

func (j *Job) toRouter(m any) {
	a := j.arena()
	p := slot(a.toR[:], &a.nToR)
	p.Msg = m
	j.emit(p)
}

func (j *Job) count(m Metric, label string) { j.in.Count(m, label) }

// ended: the job's terminal state is durable.
func (j *Job) ended() {
	j.count(MCompleted, string(j.State))
	j.emit(Terminal{})
}

func (j *Job) observe(m Metric, since time.Time) {
	j.in.Observe(m, max(j.now().Sub(since), 0).Seconds())
}

const (
	debug = slog.LevelDebug
	info  = slog.LevelInfo
	warn  = slog.LevelWarn
	errL  = slog.LevelError
)

// log emits a log line about the job, with its id and trace id.
func (j *Job) log(level slog.Level, msg string, args ...any) {
	if level == debug && !j.cfg.Debug {
		return
	}
	j.emit(Log{Level: level, Msg: msg, Args: append([]any{"job_id", j.ID, "trace_id", j.TraceID}, args...)})
}

// lostWorker reports whether worker had an earlier dispatch of the job,
// given up when it was evicted.
func (j *Job) lostWorker(worker string) bool {
	for w := range strings.SplitSeq(j.lostWorkers, ",") {
		if w == worker {
			return true
		}
	}
	return false
}

// direct reports whether the job's dispatch went to its worker's own
// subject (so the worker running it is known).
func (j *Job) direct() bool { return j.cfg.Direct != nil && j.cfg.Direct(j.Subject, j.Worker) }

// opID names a write (jobstate.Transition.Op).
func (j *Job) opID() string { return j.formatUint(j.in.OpID(), 36) }

// topic is the job's topic, for logs and metrics.
func (j *Job) topic() string { return j.Req.GetTopic() }

// TraceState is the job's state and the reason of its last change.
func (j *Job) TraceState() (string, string) { return string(j.State), string(j.LastReason) }
