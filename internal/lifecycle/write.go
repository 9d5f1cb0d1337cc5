package lifecycle

import (
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// What a write is for, and so what its outcome means.
type writeKind int

const (
	wClaim      writeKind = iota // the submit's idempotency key
	wActivate                    // take the lock, read or create the record
	wTransition                  // a fenced state change
	wRelease                     // give the lock up (passivate)
	wAdmit                       // take a tenant concurrency slot
	wPark                        // park the job (lock held by the node lease)
	wDLQ                         // dead-letter events for an unknown job
)

// next is what the job does once a write applied, beyond its effects.
type next int

const (
	nNone        next = iota
	nAdvance          // do what the new state calls for
	nAskRouter        // ask for a worker
	nArm              // wait until pending.at
	nParkTokens       // park the job waiting for tokens, or wait until pending.at
	nDispatched       // publish the dispatch (pending.pick, deadline)
	nRunning          // RUNNING recorded: new deadline, wait for the worker
	nDeadline         // a new deadline recorded (worker lost): wait for the worker
	nWatch            // keep waiting for the worker, deadline unchanged
	nRetryLater       // a failed dispatch went back to SCHEDULED: retry
	nRetryKey         // a dispatch on a stale key slot went back to SCHEDULED: retry
	nRetryTenant      // a dispatch on a stale tenant slot went back to SCHEDULED: retry
	nRetry            // a failed attempt waits to run again at pending.at
)

// pending is the one outstanding write: the op, and everything its outcome
// decides — as data, so the core stays a function of its inputs.
type pending struct {
	kind writeKind
	op   Op
	t    *jobstate.Transition // wActivate (plan) and wTransition
	dlq  *jobstate.DLQEntry   // wActivate: the plan's DLQ entry
	// freesSlot: the transition gives the tenant slot back.
	freesSlot bool
	// probe: a wActivate that creates nothing, looking for the record of
	// a job about to wait within its grace (see waitCapacity).
	probe bool
	// applied are the effects owed once the write applied (publishes,
	// announcements, logs); a refused or failed write emits none of them.
	applied []Effect
	then    next
	at      time.Time
	pick    *PickReply
	dl      deadline
}

// deadline is when a job times out, and why.
type deadline struct {
	at  time.Time
	why jobstate.Reason
}

// transitionBlock is a write's transition allocated with room for its
// path and its fields: one allocation where the transition, its path and
// its fields' backing array were three (a dispatch and a result each). It
// is the write's own, never reused: the store writer, a retry and the
// written step read it as they read a transition of their own. A dispatch
// takes one with room for 40 fields (24 with the flags, the pool and a
// wait's history fields, and the policy decision's: 8, 10 with
// constraints; 848 bytes, the 896-byte size class), a result one with
// room for 12 (6, 10 with an error, 2 more for an earlier dispatch's).
// (With room for 28 a dispatch with a policy decision's 8 fields asked for
// 32 and took a small block and a slice: two allocations.)
type transitionBlock struct {
	t      jobstate.Transition
	hops   [2]jobstate.Hop
	fields [40]string
}

type smallTransitionBlock struct {
	t      jobstate.Transition
	hops   [2]jobstate.Hop
	fields [12]string
}

// newTransition returns a transition expecting expect, with an empty path
// of room 2 and empty fields of room fields (inline up to 40).
func newTransition(expect string, fields int) *jobstate.Transition {
	var t *jobstate.Transition
	switch {
	case fields <= len(smallTransitionBlock{}.fields):
		b := new(smallTransitionBlock)
		t = &b.t
		t.Path, t.Fields = b.hops[:0], b.fields[:0]
	case fields <= len(transitionBlock{}.fields):
		b := new(transitionBlock)
		t = &b.t
		t.Path, t.Fields = b.hops[:0], b.fields[:0]
	default:
		b := new(smallTransitionBlock)
		t = &b.t
		t.Path, t.Fields = b.hops[:0], make([]string, 0, fields)
	}
	t.Expect = expect
	return t
}

// write hands p's op to the store writer; its outcome comes back as a
// WriteDone and is decided by written.
// pend returns v as the job's next write step, in the step the job's last
// finished write left (a job has at most one write outstanding, so one
// spare saves an allocation for every write after its first).
func (j *Job) pend(v pending) *pending {
	p := j.spare
	if p == nil {
		p = new(pending)
	} else {
		j.spare = nil
	}
	*p = v
	return p
}

// recycle keeps p, a write step whose outcome was handled and which is no
// longer the job's pending one, for the job's next write.
func (j *Job) recycle(p *pending) {
	if j.pending == p {
		return
	}
	*p = pending{}
	j.spare = p
}

func (j *Job) write(p *pending) { j.writeTry(p, false) }

// writeTry writes p; retry: p's write failed before (RetryNow) and is
// tried again, unchanged.
func (j *Job) writeTry(p *pending, retry bool) {
	j.opEpoch++
	j.busy = true
	j.pending = p
	j.emitWrite(Write{Epoch: j.opEpoch, Op: &p.op, Retry: retry})
}

// written decides what a write's outcome means. A Redis error leaves the
// state unknown: the job does nothing, keeps its deliveries (telling
// JetStream they are in progress) and tries the same op again after
// StateRetryDelay (fail closed).
func (j *Job) written(p *pending, r *WriteResult) {
	if r.Err != nil {
		j.count(MFailClosed, j.topic())
		j.log(warn, "job state unavailable; retrying", "err", r.Err)
		for _, d := range j.acks {
			if d != nil {
				j.emit(Touch{D: d})
			}
		}
		j.opEpoch++
		j.busy = true
		j.pending = p
		j.emit(RetryWrite{Epoch: j.opEpoch, After: StateRetryDelay})
		return
	}
	switch p.kind {
	case wClaim:
		j.claimed(r)
	case wActivate:
		j.activated(p, r)
	case wTransition:
		j.transitioned(p, r)
	case wRelease:
		j.leftAlone()
		j.finish()
	case wAdmit:
		j.admittedTo(p, r)
	case wPark:
		j.parkedAt(r)
	case wDLQ:
		j.deadLettered(p)
	}
}

// then runs what a write that applied owes: its effects, then its next step.
func (j *Job) then(p *pending) {
	j.fx = append(j.fx, p.applied...)
	switch p.then {
	case nAdvance:
		j.advance()
	case nAskRouter:
		j.askRouter()
	case nArm:
		j.arm(p.at)
	case nParkTokens:
		j.parkTokens(p.at)
	case nDispatched:
		j.dispatched(p)
	case nRunning, nDeadline:
		j.deadline, j.deadlineWhy = p.dl.at, p.dl.why
		j.waitWorker()
	case nWatch:
		j.watchDeadline()
	case nRetryLater:
		j.retryLater(jobstate.ReasonDispatchFailed)
	case nRetryKey:
		j.retryLater(jobstate.ReasonConcurrencyKey)
	case nRetryTenant:
		j.retryLater(jobstate.ReasonTenantLimit)
	case nRetry:
		j.retrying(p.at)
	}
}

// apply writes t for an active job, or creates the job with t as its plan.
func (j *Job) apply(t *jobstate.Transition, dlq *jobstate.DLQEntry, p *pending) {
	if len(j.decision) > 0 {
		t.Fields = append(t.Fields, j.decision...)
		j.decision = nil
	}
	if j.live() {
		j.transition(t, dlq, p)
		return
	}
	j.historyFields(t)
	j.activatePlan(t, dlq, p)
}

// historyFields makes the record a job creates tell the time before it:
// its submit's time (field jobstate.FieldSubmitted, when the stream held it
// for a second or more before this create, or the job waited) and, for a job that waited for
// room within its grace, when the wait began (jobstate.FieldWaited) and its
// reason, as the reason of the SCHEDULED hop written with the create (in
// place of policy_allowed). store.History dates the first hop and that
// SCHEDULED hop by them, so the wait is its own step, with its duration.
func (j *Job) historyFields(t *jobstate.Transition) {
	now := j.now()
	if !j.submitted.IsZero() && (now.Sub(j.submitted) >= time.Second || !j.waitedAt.IsZero()) {
		t.Fields = append(t.Fields, jobstate.FieldSubmitted, j.formatMs(j.submitted))
	}
	if j.waitedAt.IsZero() || len(t.Path) == 0 || t.Path[0].To != jobstate.StateScheduled {
		return
	}
	t.Fields = append(t.Fields, jobstate.FieldWaited, j.formatMs(j.waitedAt))
	if t.Path[0].Reason == jobstate.ReasonAllowed && j.capReason != "" {
		t.Path[0].Reason = j.capReason
	}
}

func active(s jobstate.State) bool {
	return s == jobstate.StateDispatched || s == jobstate.StateRunning
}

// transition writes t (each hop checked against the legal table first);
// once it is durable the job's memory follows, pending deliveries are acked
// and p's effects and next step run. A fenced write means another holder has
// the job: the job stops at once, with none of them.
func (j *Job) transition(t *jobstate.Transition, dlq *jobstate.DLQEntry, p *pending) {
	from := j.State
	for _, h := range t.Path {
		if !Legal(from, h.To) {
			err := &ErrIllegalTransition{From: from, To: h.To}
			j.log(errL, "refusing transition", "err", err)
			j.ackAll()
			return
		}
		from = h.To
	}
	if p == nil {
		p = j.pend(pending{})
	}
	t.Op = j.opID()
	p.kind, p.t = wTransition, t
	p.op = Op{Kind: OpTransition, JobID: j.ID, Node: j.cfg.NodeID, LockValue: j.LockValue, T: t, DLQ: dlq}
	p.freesSlot = j.admitted && active(j.State) && !active(t.Final())
	if p.freesSlot {
		p.op.TenantRelease = j.cfg.TenantKey(jobstate.TenantOf(j.Req))
	}
	j.write(p)
}

func (j *Job) transitioned(p *pending, r *WriteResult) {
	t := p.t
	if r.Step == StepConflict && r.Before == t.Final() && r.LastOp == t.Op ||
		r.Step == StepFenced && r.Before == "" && r.LastOp == t.Op && r.State == t.Final() {
		// An earlier try of this write landed (its reply was lost; a write
		// that gave the lock up finds no lock when tried again): carry on
		// as if this one had.
		r.Step = StepOK
	}
	switch r.Step {
	case StepOK:
	case StepFenced:
		j.count(MFenced, "")
		j.LockValue = ""
		j.nakAll(second)
		if r.Before == "" && j.Req != nil {
			// Nobody holds the lock: it expired (renewals failed) or Redis
			// lost its data. Nothing else holds the job, so take it again;
			// the events just handed back will be offered again.
			j.log(warn, "job lock vanished; re-activating", "state", j.State)
			j.recover()
			return
		}
		j.log(warn, "transition refused: job owned by another node", "to", t.Final(), "holder", r.Before)
		j.finish()
		return
	default:
		j.log(errL, "transition conflict", "to", t.Final(), "status", r.Step, "state_in_redis", r.Before)
		if r.Before.Valid() {
			j.State = r.Before
		}
		j.ackAll()
		j.finish()
		return
	}
	if p.freesSlot {
		j.admitted = false
	}
	to := t.Final()
	switch {
	case active(j.State) && (to == jobstate.StateCancelled || to == jobstate.StateTimeout):
		// Ended here, but the worker may still be running it (a stock
		// worker hears no cancel): its slot stays counted until the
		// worker's own answer or its heartbeats show the job gone.
		j.toRouter(&Released{WorkerID: j.Worker, JobID: j.ID, Done: true, Linger: true})
	case active(j.State) && !active(to):
		j.release(true) // the worker is done with it
	case j.State == jobstate.StateDispatched && to == jobstate.StateRunning:
		j.release(false) // started: no longer waiting on the worker to take it
	}
	if j.cfg.Debug {
		j.log(debug, "job state", "topic", j.topic(), "from", j.State, "to", to, "reason", t.Path[len(t.Path)-1].Reason)
	}
	if j.cfg.Trace {
		j.emit(Moved{From: j.State, Path: t.Path})
	}
	j.keyMoved(j.State, to)
	j.State = to
	j.LastReason = t.Path[len(t.Path)-1].Reason
	if !t.LockKept() {
		j.emitForget(Forget{LockValue: j.LockValue})
		j.LockValue = ""
	}
	if j.State.Terminal() {
		j.ended()
	}
	j.ackAll()
	j.then(p)
	if (j.State.Terminal() || t.Release) && !j.res.Gone() {
		if t.Release {
			j.leftAlone()
		}
		j.finish()
	}
}

// release tells the router the job no longer waits for its worker to start
// it, and with done, that it no longer occupies the worker at all.
func (j *Job) release(done bool) {
	if j.Worker != "" {
		j.toRouter(&Released{WorkerID: j.Worker, JobID: j.ID, Done: done})
	}
}

// appendFlag appends the record field name = "1" or "0". For a record
// being created (fresh), an unset flag is left out: a missing flag reads as
// not set (see adopt), and every field less is Redis time saved on each
// job's create.
func appendFlag(fields []string, fresh bool, name string, set bool) []string {
	if set || !fresh {
		fields = append(fields, name, slotFlag(set))
	}
	return fields
}

func slotFlag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
