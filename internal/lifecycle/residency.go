package lifecycle

import (
	"fmt"
)

// Residency is where a job lives, as its actor knows it: the actor's part
// of the job's state, beside State (the record's). A job has one home at a
// time — its submit in the stream, this actor's memory, its record and
// lock, or its record and this node's lease — and Residency says which,
// and so what an event reaching the actor means.
type Residency uint8

const (
	// Fresh: the actor has read and written nothing yet (or lost its lock
	// and reads the record again). The job's home is its submit, held
	// un-acked in the stream, or its record, owned by nobody here.
	Fresh Residency = iota
	// Unwritten: a fresh job waiting for room within its capacity grace.
	// Its home is this actor's memory and its submit, still un-acked in
	// the stream (the node's Toucher keeps it there); no record exists.
	Unwritten
	// Live: the actor holds the job's lock; the record is the truth and
	// this actor its only writer.
	Live
	// Parked: the actor is gone; the job waits for its worker (or, SCHEDULED
	// rate_limited, for its tokens: the limiter keeps its ask) in Redis, its
	// lock held through this node's lease (…|p). Its next actor is spawned
	// by an event (the limiter's grant), or its due time.
	Parked
	// Away: the actor is gone and the job lives elsewhere — another node
	// owns it, it was passivated, or its record is still to come. Events
	// go back to JetStream for whoever holds it.
	Away
	// Ended: the actor is gone and the job is terminal (or the submit was a
	// duplicate of another job): events are absorbed.
	Ended
	numResidencies
)

var residencyNames = [numResidencies]string{"fresh", "unwritten", "live", "parked", "away", "ended"}

func (r Residency) String() string {
	if r < numResidencies {
		return residencyNames[r]
	}
	return fmt.Sprintf("residency(%d)", uint8(r))
}

// Gone reports whether the actor has finished: nothing but absorbing (or
// passing on) events is left to it.
func (r Residency) Gone() bool { return r >= Parked }

// moves is the table of legal residency moves: moves[from] lists every
// residency a job's actor may move to from `from`. A gone actor never
// comes back (its next actor starts Fresh).
//
//   - Fresh → Unwritten: a fresh job the router queued, within its grace.
//   - Fresh → Live: an activation took the lock (created or adopted).
//   - Fresh → Away: another node holds the job, the event's job has no
//     record, or the actor is stopped or replaced before it owned anything.
//   - Fresh → Ended: the record is terminal, or the submit is a duplicate.
//   - Unwritten → Fresh: the wait ends (placed, written, cancelled, its
//     actor stopped): what it does next starts from the stream's submit.
//   - Live → Fresh: the lock vanished; the record is read again.
//   - Live → Parked, Away, Ended: see the residencies.
var moves = [numResidencies][]Residency{
	Fresh:     {Unwritten, Live, Away, Ended},
	Unwritten: {Fresh},
	Live:      {Fresh, Parked, Away, Ended},
}

// LegalMove reports whether a job's actor may move from → to.
func LegalMove(from, to Residency) bool {
	if from >= numResidencies {
		return false
	}
	for _, r := range moves[from] {
		if r == to {
			return true
		}
	}
	return false
}

// ErrIllegalMove is logged (at error level; the simulator counts it a
// violation) for a residency move the table does not allow. It is a
// programming error, never an input error; the move is not made.
type ErrIllegalMove struct{ From, To Residency }

func (e *ErrIllegalMove) Error() string {
	return fmt.Sprintf("illegal residency move %s → %s", e.From, e.To)
}

// MsgIllegalMove is the log message of a refused residency move.
const MsgIllegalMove = "refusing residency move"

// moveTo moves the job's actor to residency r, if the table allows it.
func (j *Job) moveTo(r Residency) bool {
	if j.res == r {
		return true
	}
	if !LegalMove(j.res, r) {
		j.log(errL, MsgIllegalMove, "err", &ErrIllegalMove{From: j.res, To: r}, "state", j.State)
		return false
	}
	j.res = r
	return true
}

// Residency is where the job lives (see Residency).
func (j *Job) Residency() Residency { return j.res }

// live reports whether the actor holds the job's lock (its record is
// read or written).
func (j *Job) live() bool { return j.res == Live }

// Event kinds, for the table of what an event does in each residency.
type EventKind uint8

const (
	EvSubmit       EventKind = iota // a submit (sys.job.submit)
	EvResult                        // a worker's result
	EvCancel                        // a cancel
	EvProgress                      // a worker's progress
	EvWake                          // the due poller's wake
	EvWorkerLost                    // the job's worker was evicted
	EvResultsLost                   // the result stream was recreated
	EvAbandon                       // the previous actor failed for good
	EvTimer                         // the job's own timer
	EvPlaced                        // the router placed the queued job
	EvLockVanished                  // nobody holds the lock any more
	EvLockTaken                     // another holder has the lock
	EvPolicyBack                    // a policy check succeeded elsewhere
	EvStopping                      // the actor is stopped (node shutdown)
	EvRestarting                    // the actor is replaced (supervision)
	numEventKinds
)

var eventNames = [numEventKinds]string{"submit", "result", "cancel", "progress", "wake", "worker_lost",
	"results_lost", "abandon", "timer", "placed", "lock_vanished", "lock_taken", "policy_back", "stopping",
	"restarting"}

func (k EventKind) String() string {
	if k < numEventKinds {
		return eventNames[k]
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// Outcome is what an event does to a job in a residency.
type Outcome uint8

const (
	// Handle: the state machine decides (the record, or the wait's state).
	Handle Outcome = iota
	// Create: the job is decided (policy, placement) and created.
	Create
	// Activate: the record is read first (the event must not create the
	// job), then the event is handled.
	Activate
	// Absorb: acked and dropped — the job is terminal, or the event a
	// duplicate of what the job already knows.
	Absorb
	// Retry: handed back to JetStream, offered again to whoever holds the
	// job.
	Retry
	// PassOn: kept for the job's next actor (a parked job's).
	PassOn
	// CreateCancelled: the unwritten job is created CANCELLED.
	CreateCancelled
	// WriteWait: the unwritten wait is written first, then the event
	// handled on the record.
	WriteWait
	// Ignore: nothing happens (nothing in this residency waits for it).
	Ignore
	// Stop: the actor stops without side effects, its deliveries handed
	// back.
	Stop
	// Release: the actor stops and releases the lock (a job waiting for
	// room made due at once), its deliveries handed back.
	Release
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"handle", "create", "activate", "absorb", "retry", "pass_on",
	"create_cancelled", "write_wait", "ignore", "stop", "release"}

func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// outcomes is what each event does in each residency; every pair has one.
// The core routes every event through it (handle, receive), so the table
// is the behaviour, not a description of it.
//
// Notes on the less obvious entries:
//   - Unwritten × result: the job was never dispatched from here; its
//     submit may repeat a job another node dispatched, so the result is
//     offered again (UnwrittenResultRetry) rather than taken or lost.
//   - Unwritten × progress, worker_lost, results_lost: handled as the
//     SCHEDULED wait would handle them — they name no dispatch of this
//     job, so nothing changes, and nothing is activated.
//   - Unwritten × submit: a repeated submit is decided again (policy,
//     router: the wait keeps its queue place), its delivery held with the
//     first.
//   - Parked × progress: a DISPATCHED job's first progress is its
//     start, for the next actor; a RUNNING job's changes nothing.
//   - Gone × lock_taken, lock_vanished, timer, placed: the lock and the
//     timer went with the actor; the router's placement is refused.
var outcomes = [numResidencies][numEventKinds]Outcome{
	Fresh: {EvSubmit: Create, EvResult: Activate, EvCancel: Activate, EvProgress: Activate, EvWake: Activate,
		EvWorkerLost: Activate, EvResultsLost: Activate, EvAbandon: Activate, EvTimer: Handle, EvPlaced: Handle,
		EvLockVanished: Ignore, EvLockTaken: Ignore, EvPolicyBack: Ignore, EvStopping: Stop, EvRestarting: Stop},
	Unwritten: {EvSubmit: Create, EvResult: Retry, EvCancel: CreateCancelled, EvProgress: Handle, EvWake: Ignore,
		EvWorkerLost: Handle, EvResultsLost: Handle, EvAbandon: WriteWait, EvTimer: Handle, EvPlaced: Handle,
		EvLockVanished: Ignore, EvLockTaken: Ignore, EvPolicyBack: Ignore, EvStopping: Stop, EvRestarting: Stop},
	Live: {EvSubmit: Absorb, EvResult: Handle, EvCancel: Handle, EvProgress: Handle, EvWake: Ignore,
		EvWorkerLost: Handle, EvResultsLost: Handle, EvAbandon: Handle, EvTimer: Handle, EvPlaced: Handle,
		EvLockVanished: Handle, EvLockTaken: Stop, EvPolicyBack: Handle, EvStopping: Release, EvRestarting: Stop},
	Parked: {EvSubmit: Retry, EvResult: Retry, EvCancel: Retry, EvProgress: PassOn, EvWake: Ignore,
		EvWorkerLost: PassOn, EvResultsLost: PassOn, EvAbandon: Ignore, EvTimer: Ignore, EvPlaced: Ignore,
		EvLockVanished: Ignore, EvLockTaken: Ignore, EvPolicyBack: Ignore, EvStopping: Ignore, EvRestarting: Ignore},
	Away: {EvSubmit: Retry, EvResult: Retry, EvCancel: Retry, EvProgress: Ignore, EvWake: Ignore,
		EvWorkerLost: Ignore, EvResultsLost: Ignore, EvAbandon: Ignore, EvTimer: Ignore, EvPlaced: Ignore,
		EvLockVanished: Ignore, EvLockTaken: Ignore, EvPolicyBack: Ignore, EvStopping: Ignore, EvRestarting: Ignore},
	Ended: {EvSubmit: Absorb, EvResult: Absorb, EvCancel: Absorb, EvProgress: Ignore, EvWake: Ignore,
		EvWorkerLost: Ignore, EvResultsLost: Ignore, EvAbandon: Ignore, EvTimer: Ignore, EvPlaced: Ignore,
		EvLockVanished: Ignore, EvLockTaken: Ignore, EvPolicyBack: Ignore, EvStopping: Ignore, EvRestarting: Ignore},
}

// OutcomeOf is what an event of kind k does to a job in residency r.
func OutcomeOf(r Residency, k EventKind) Outcome {
	if r >= numResidencies || k >= numEventKinds {
		return Ignore
	}
	return outcomes[r][k]
}

// KindOf is the kind of an input event (ok false: a reply to the job's own
// step, which the table does not route).
func KindOf(ev any) (EventKind, bool) {
	switch m := ev.(type) {
	case *Submit:
		return EvSubmit, true
	case *Result:
		return EvResult, true
	case *Cancel:
		return EvCancel, true
	case *Progress:
		return EvProgress, true
	case *Wake:
		return EvWake, true
	case *WorkerLost:
		return EvWorkerLost, true
	case *ResultsLost:
		return EvResultsLost, true
	case *Abandon:
		return EvAbandon, true
	case *Timer:
		return EvTimer, true
	case *Placed:
		return EvPlaced, true
	case *LockLost:
		if m.Vanished {
			return EvLockVanished, true
		}
		return EvLockTaken, true
	case *PolicyBack, *KeyBack:
		return EvPolicyBack, true
	case *Stopping:
		return EvStopping, true
	case *Restarting:
		return EvRestarting, true
	}
	return 0, false
}
