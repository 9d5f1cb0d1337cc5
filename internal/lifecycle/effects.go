package lifecycle

import (
	"log/slog"
	"sync"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Effect is one thing the shell must do for the job, in order. The core
// never does any of them itself: it only returns them from Step.
//
// The most frequent effects come as pointers (*Write, *AskRouter,
// *AskPolicy, *ToRouter, *PublishRequest, *Grace, *Arm, *Ack, *Hold,
// *Forget) into storage the job takes for
// the step (fxArena): a value boxed into Effect is an allocation each. They
// stay valid until the next Step, or until Consumed; every other effect is
// a value.
type Effect interface{ effect() }

// fxArena is the storage of one step's pointer effects. A job takes one
// from arenas at its first pointer effect in a step and gives it back when
// the shell calls Consumed; one the shell does not give back (tests, the
// simulator) is left to the garbage collector at the next Step. An effect
// past an array's room is allocated on its own.
type fxArena struct {
	write  [2]Write
	ask    [1]AskRouter
	pol    [1]AskPolicy
	pub    [1]PublishRequest
	grace  [2]Grace
	toR    [3]ToRouter
	arm    [2]Arm
	ack    [3]Ack
	hold   [1]Hold
	forget [2]Forget

	nWrite, nAsk, nPol, nPub, nGrace, nToR, nArm, nAck, nHold, nForget uint8
}

var arenas = sync.Pool{New: func() any { return new(fxArena) }}

// slot is the next free element of buf (n of them taken), or a new T.
func slot[T any](buf []T, n *uint8) *T {
	if int(*n) < len(buf) {
		p := &buf[*n]
		*n++
		return p
	}
	return new(T)
}

// arena is the job's storage for this step's pointer effects.
func (j *Job) arena() *fxArena {
	if j.fxa == nil {
		j.fxa = arenas.Get().(*fxArena)
	}
	return j.fxa
}

// Consumed tells the job that the shell has carried out the effects of its
// last Step and keeps none of them (nor any pointer to one): their storage
// goes back for other jobs' steps. Call it before the next Step, on the
// goroutine that called Step.
func (j *Job) Consumed() {
	if a := j.fxa; a != nil {
		j.fxa = nil
		*a = fxArena{}
		arenas.Put(a)
	}
}

func (j *Job) emitWrite(e Write) {
	a := j.arena()
	p := slot(a.write[:], &a.nWrite)
	*p = e
	j.emit(p)
}

func (j *Job) emitAskRouter(e AskRouter) {
	a := j.arena()
	p := slot(a.ask[:], &a.nAsk)
	*p = e
	j.emit(p)
}

func (j *Job) emitAskPolicy(e AskPolicy) {
	a := j.arena()
	p := slot(a.pol[:], &a.nPol)
	*p = e
	j.emit(p)
}

func (j *Job) emitPublish(e PublishRequest) {
	a := j.arena()
	p := slot(a.pub[:], &a.nPub)
	*p = e
	j.emit(p)
}

func (j *Job) emitGrace(e Grace) {
	a := j.arena()
	p := slot(a.grace[:], &a.nGrace)
	*p = e
	j.emit(p)
}

func (j *Job) emitArm(e Arm) {
	a := j.arena()
	p := slot(a.arm[:], &a.nArm)
	*p = e
	j.emit(p)
}

func (j *Job) emitHold(e Hold) {
	a := j.arena()
	p := slot(a.hold[:], &a.nHold)
	*p = e
	j.emit(p)
}

func (j *Job) emitForget(e Forget) {
	a := j.arena()
	p := slot(a.forget[:], &a.nForget)
	*p = e
	j.emit(p)
}

// Write hands Op to the store writer; its outcome comes back as a
// WriteDone with Epoch. Retry: the same write failed (RetryWrite) and is
// tried again unchanged, so the shell may submit what it submitted then.
type Write struct {
	Epoch uint64
	Op    *Op
	Retry bool
}

// RetryWrite: the write failed (Redis unavailable); send RetryNow with
// Epoch after After.
type RetryWrite struct {
	Epoch uint64
	After time.Duration
}

// AskRouter sends Req to the router; the answer (a *PickReply with
// Req.Epoch) comes back as an event.
type AskRouter struct{ Req any }

// ToRouter sends Msg to the router (Released, Took, Occupied, Withdraw).
type ToRouter struct{ Msg any }

// AskPolicy asks the input policy about Req; the answer comes back as a
// PolicyDone with Epoch.
type AskPolicy struct {
	Epoch uint64
	Req   *capv1.JobRequest
}

// WakePolicyWaiters: a check succeeded; wake jobs waiting on the policy.
type WakePolicyWaiters struct{}

// WaitPolicy adds (On) or removes the job from the node's policy waiters.
type WaitPolicy struct{ On bool }

// AskOutput runs the output policy's phase 1 on Res; the outcome comes
// back as an OutputDone with Epoch, Res and Path.
type AskOutput struct {
	Epoch uint64
	Res   *Result
	Path  []jobstate.Hop
}

// ScanContent queues the output policy's phase 2 for a SUCCEEDED job's
// result Res.
type ScanContent struct{ Res *capv1.JobResult }

// PublishRequest publishes the job's request to Subject. A failure of a
// first dispatch (not Resend) comes back as PublishFailed.
type PublishRequest struct {
	Subject string
	Resend  bool
}

// TellClient publishes an outcome Troupe decided as a JobResult on the
// result subject, where CAP clients wait for it.
type TellClient struct {
	Status capv1.JobStatus
	Code   jobstate.Reason
	Msg    string
	// Res, when set, is the worker's result that ended a job dispatched
	// under attempt ids (see retry.go): the client, waiting for the job's
	// own id, has not heard it; the shell relays it under the job's id,
	// naming no worker (Status, Code and Msg are then its own).
	Res *capv1.JobResult
	// Once: the shell tells the client at most once per job across every
	// replica (a claim in Redis). For outcomes no record makes terminal —
	// state_lost — so that each event dead-lettered for the job, on any
	// node, does not tell the client again.
	Once bool
}

// CancelWorker publishes a JobCancel on sys.job.cancel.
type CancelWorker struct{ Reason string }

// Refusal settles an event the job refuses from its verified sender: Refuse
// (set by intake) dead-letters and counts it and settles D; without Refuse
// the shell acks D. The job is left as it was.
type Refusal struct {
	Reason jobstate.Reason
	Detail string
	Refuse func(reason jobstate.Reason, detail string)
	D      Delivery
}

// PublishDLQ announces a DLQ entry on sys.job.dlq.
type PublishDLQ struct{ Entry *jobstate.DLQEntry }

// Arm sets the job's one timer to fire Timer{Epoch} at At, replacing any
// other; Disarm cancels it.
type Arm struct {
	At    time.Time
	Epoch uint64
}
type Disarm struct{}

// Ack, Nak and Touch (in progress) answer a JetStream delivery.
type Ack struct{ D Delivery }
type Nak struct {
	D     Delivery
	Delay time.Duration
}
type Touch struct{ D Delivery }

// Hold registers LockValue with the lock renewer; Forget unregisters it.
type Hold struct{ LockValue string }
type Forget struct{ LockValue string }

// Forward hands a result or cancel to Holder, the node that holds the job's lock; the
// delivery is acked if the holder takes it, handed back otherwise.
type Forward struct {
	Holder, Kind string
	Raw          []byte
	D            Delivery
}

// Alone: the job waits with no actor and no worker — a parked retry wait
// (Due: its retry time), an approval (passivated), or a rate-limited park
// (the limiter keeps its ask) — so its record, and the wake source kept
// with it, are its only home. The node keeps the job in its index of such
// waits until one of its actors takes the job's lock again (Hold): if
// Redis loses its data, nothing else would ever wake the job, so the node
// wakes each one (Wake{Lost}) to end it visibly.
type Alone struct {
	Kind WaitKind
	Due  time.Time // a retry wait's retry time; zero for the others
}

// WaitKind is the kind of a wait a job keeps alone (see Alone).
type WaitKind uint8

const (
	WaitRetry    WaitKind = iota + 1 // a parked retry wait
	WaitApproval                     // waiting for a human's approval
	WaitRate                         // parked for its rate limit's tokens
	// WaitDelayed is never emitted by the core: a submit the node held
	// until its due time (internal/schedule), which has no record yet, only
	// its entry in the delayed set — indexed with the waits alone so that a
	// Redis data loss ends it visibly too.
	WaitDelayed
)

// Finish tells the supervisor the actor has nothing left to do.
type Finish struct {
	Parked    bool // DISPATCHED or RUNNING, with no actor
	Running   bool // parked in RUNNING
	Redeliver []any
}

// Terminal: the job's terminal state is durable (waiters may be told).
type Terminal struct{}

// Moved: a write that changes the job's state applied: the job went from
// From through each hop of Path, in order. Created: the write created the
// job's record, so the job began PENDING (submitted) before Path (which is
// then empty for a plain create). Emitted only with Config.Trace (the
// node's OpenTelemetry spans follow it), before the effects the write owed.
type Moved struct {
	From    jobstate.State
	Path    []jobstate.Hop
	Created bool
	// WaitedAt: the job waited for room, with no record, from then; the
	// SCHEDULED hop created with it began there (zero: no such wait).
	WaitedAt time.Time
}

// Resumed: an activation found the job's record, written earlier by
// another actor of the job (parked, passivated, or on another node): the
// job is in State, entered for Reason. Emitted only with Config.Trace.
type Resumed struct {
	State  jobstate.State
	Reason jobstate.Reason
}

// Redeliver hands events that reached a job after it parked back to the
// supervisor, for the job's next actor.
type Redeliver struct{ Msgs []any }

// Grace changes the node's count of jobs waiting unwritten within their
// capacity grace by Delta. With Delta 1, Deliveries are the job's submits,
// which the node keeps telling JetStream are in progress until the
// matching Delta −1 (the wait ended: placed, written or finished).
type Grace struct {
	Delta      int64
	Deliveries []Delivery
}

// Admitted: the job no longer counts in the node's admissions (see
// AdmissionHoldDefault); it was counted from its submit. Dispatching, writing
// and finishing end the count too, without this effect.
type Admitted struct{}

// Log is a log line about the job.
type Log struct {
	Level slog.Level
	Msg   string
	Args  []any
}

// Metric names the counters and histograms the core reports.
type Metric int

const (
	MAbsorbed Metric = iota // label: submit, result, cancel
	MIdemDuplicates
	MActivationDelay // seconds
	MReceived
	MCompleted // label: state
	MUnparked
	MOrphanReplayed  // label: topic
	MAdoptionLatency // seconds
	MRetries         // label: reason
	MDispatched
	MDispatchLatency // seconds
	MResent
	MParked
	MTimeouts      // label: reason
	MCapacityWaits // label: reason
	MFenced
	MFailClosed // label: topic
	MQuarantined
	MHeld // a result or cancel for a job with no record, handed back
	MBusy // an activation found the job's lock held by another node
	// MRunnerUnknown: a started job's picked worker was lost, and its
	// runner is unknown (a pool subject).
	MRunnerUnknown
	// MRetried: a worker's failed attempt is run again (label: the
	// outcome: worker_failed, worker_timeout, worker_lost).
	MRetried
	// MStaleAttempt: a result of an attempt the job is past, ignored.
	MStaleAttempt
)

// Count adds one to a counter; Observe records a value in a histogram.
type Count struct {
	M     Metric
	Label string
}
type Observe struct {
	M     Metric
	Value float64
}

func (Refusal) effect()           {}
func (*Write) effect()            {}
func (RetryWrite) effect()        {}
func (*AskRouter) effect()        {}
func (*ToRouter) effect()         {}
func (*AskPolicy) effect()        {}
func (WakePolicyWaiters) effect() {}
func (WaitPolicy) effect()        {}
func (AskOutput) effect()         {}
func (ScanContent) effect()       {}
func (*PublishRequest) effect()   {}
func (TellClient) effect()        {}
func (CancelWorker) effect()      {}
func (PublishDLQ) effect()        {}
func (*Arm) effect()              {}
func (Disarm) effect()            {}
func (*Ack) effect()              {}
func (Nak) effect()               {}
func (Touch) effect()             {}
func (Admitted) effect()          {}
func (*Hold) effect()             {}
func (*Forget) effect()           {}
func (Forward) effect()           {}
func (Finish) effect()            {}
func (Alone) effect()             {}
func (Redeliver) effect()         {}
func (Terminal) effect()          {}
func (Moved) effect()             {}
func (Resumed) effect()           {}
func (*Grace) effect()            {}
func (Log) effect()               {}
func (Count) effect()             {}
func (Observe) effect()           {}
