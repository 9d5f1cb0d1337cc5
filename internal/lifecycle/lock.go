package lifecycle

import (
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// The job's lock: taking it (activation), adopting a record another
// node wrote, recreating a record Redis lost, handing events to the node
// that holds the lock (its holder), giving the lock up (passivation) and parking.

// firstLock is LockValue(node, 1) for the node that asked last: every job
// a node creates takes its lock at fence 1, so one string serves them all
// instead of one joined per job. Any node (tests run several in one
// process) gets the right value; another's only costs the join.
var firstLock atomic.Pointer[[2]string]

// lockValue is jobstate.LockValue(node, fence), made once for fence 1.
func lockValue(node string, fence int64) string {
	if fence != 1 {
		return jobstate.LockValue(node, fence)
	}
	if c := firstLock.Load(); c != nil && c[0] == node {
		return c[1]
	}
	v := jobstate.LockValue(node, 1)
	firstLock.Store(&[2]string{node, v})
	return v
}

const second = time.Second

// activate takes the job's lock and learns its state; a missing job is not
// created (events that must not create one).
func (j *Job) activate(create bool, p *pending) {
	op := Op{Kind: OpActivate, JobID: j.ID, Node: j.cfg.NodeID, Create: create, TraceID: j.TraceID}
	if p == nil {
		p = j.pend(pending{})
	}
	if create && j.Req != nil {
		op.Topic = j.Req.Topic
		op.Tenant = jobstate.TenantOf(j.Req)
		op.Request, _ = jobstate.EncodeRequest(j.Req)
		if p.t != nil {
			p.t.Op = j.opID()
			op.T = p.t
		}
		op.DLQ = p.dlq
	}
	p.kind, p.op = wActivate, op
	j.write(p)
}

// activatePlan creates the job (if it does not exist) with t applied to it
// in the same script call; p's effects run only if it was.
func (j *Job) activatePlan(t *jobstate.Transition, dlq *jobstate.DLQEntry, p *pending) {
	if p == nil {
		p = j.pend(pending{})
	}
	p.t, p.dlq = t, dlq
	j.activate(true, p)
}

// activated decides what an activation found.
func (j *Job) activated(p *pending, r *WriteResult) {
	plan := p.t
	if !p.op.Create {
		plan = nil
	}
	if p.probe && r.Status == ActivateNotFound {
		j.probedAbsent()
		return
	}
	// Whatever the activation found, the job no longer waits unwritten
	// within its grace: its record now decides (a wait that stayed would
	// keep its budget, its touched submit and its capacity recheck).
	j.leaveGrace()
	switch r.Status {
	case ActivateCreated:
		j.moveTo(Live)
		j.created = j.now()
		j.observe(MActivationDelay, j.firstEvent)
		j.count(MReceived, "")
		j.State, j.Fence = r.State, r.Fence
		j.LastReason = jobstate.ReasonSubmitted
		if plan != nil {
			j.LastReason = plan.Path[len(plan.Path)-1].Reason
		}
		j.moved(plan)
		if plan == nil || plan.LockKept() {
			j.hold(lockValue(j.cfg.NodeID, r.Fence))
		}
		if j.State.Terminal() {
			j.ended()
		}
		j.ackAll()
		if plan == nil {
			j.advance()
			return
		}
		j.then(p)
		if (j.State.Terminal() || plan.Release) && !j.res.Gone() {
			if plan.Release {
				j.leftAlone()
			}
			j.finish()
		}
	case ActivateAdopted:
		if plan != nil && plan.Op != "" && r.Fields["op"] == plan.Op && r.State == plan.Final() {
			// An earlier try of this very activation landed although its
			// reply was lost: the job is where the plan put it, and the
			// plan's side effects are still owed — nobody else can have
			// done them.
			j.moveTo(Live)
			j.created = j.now()
			j.State, j.Fence = r.State, r.Fence
			j.LastReason = plan.Path[len(plan.Path)-1].Reason
			j.moved(plan)
			if plan.LockKept() {
				j.hold(lockValue(j.cfg.NodeID, r.Fence))
			}
			j.ackAll()
			j.then(p)
			if (j.State.Terminal() || plan.Release) && !j.res.Gone() {
				if plan.Release {
					j.leftAlone()
				}
				j.finish()
			}
			return
		}
		j.moveTo(Live)
		j.observe(MActivationDelay, j.firstEvent)
		j.State, j.Fence = r.State, r.Fence
		j.LastReason = jobstate.Reason(r.Fields["reason"])
		if j.cfg.Trace {
			j.emit(Resumed{State: j.State, Reason: j.LastReason})
		}
		j.hold(lockValue(j.cfg.NodeID, r.Fence))
		j.adopt(r.Fields)
		j.dropPick() // the plan's pick, if any, is not used
		if j.State != jobstate.StateScheduled {
			// The record moved past the wait for room this actor was in
			// (another node ran the job): its queue place is given up.
			j.withdraw()
		}
		if active(j.State) && j.Worker != "" {
			// The job holds a slot on its worker that this router may not
			// have placed (adopted, or this node restarted). Counted as
			// started: an adopter cannot tell whether the worker got it,
			// so the worker's eviction does not place it again.
			j.toRouter(&Occupied{WorkerID: j.Worker, JobID: j.ID, Started: true})
		}
		// r.Holder is the lock before this activation: a parked job's
		// ("<node>|<fence>|p") is this node's own unless it was adopted.
		wasParked := strings.HasSuffix(r.Holder, "|p")
		if wasParked {
			j.count(MUnparked, "")
		}
		// A retry wait that parked (no holder, woken at its due time, not
		// for a lapsed lease) comes back by design: no orphan either.
		retryBack := r.Holder == "" && j.lapsedAt.IsZero() && j.LastReason == jobstate.ReasonRetryWait
		if j.woken && !(wasParked && strings.HasPrefix(r.Holder, j.cfg.NodeID+"|")) && !retryBack {
			j.count(MOrphanReplayed, j.topic())
			if !j.lapsedAt.IsZero() && r.Holder == "" {
				j.observe(MAdoptionLatency, j.lapsedAt)
			}
		}
		j.ackAll()
		if j.adoptedSlotStale(r.Fields) {
			return
		}
		j.advance()
	case ActivateTerminal:
		j.State = r.State
		j.ackAll()
		j.finish()
	case ActivateCancelled:
		j.createdCancelled(r) // cancelmark.go
	case ActivateBusy:
		// Another node holds the job. Submits are duplicates of a live job;
		// results and cancels go to the holder (or back to JetStream). A
		// lock with no record behind it is not a live job: the submit goes
		// back too.
		j.count(MBusy, "")
		j.State = r.State
		if r.State == "" {
			j.nakAll(second)
		}
		j.ackAll()
		j.forwardToHolder(r.Holder)
		j.finish()
	case ActivateNotFound:
		if j.lost != "" {
			j.recreate()
			return
		}
		j.unknownJob()
	}
}

// moved reports, for tracing, that an activation created the job's record
// with plan (nil: a plain create) applied.
func (j *Job) moved(plan *jobstate.Transition) {
	if !j.cfg.Trace {
		return
	}
	m := Moved{Created: true, WaitedAt: j.waitedAt}
	if plan != nil {
		m.Path = plan.Path
	}
	j.emit(m)
}

// hold records that the job owns its lock and registers it for renewal.
func (j *Job) hold(lockValue string) {
	j.LockValue = lockValue
	j.emitHold(Hold{LockValue: lockValue})
}

// forwardToHolder passes the results and cancels waiting here to the node
// that holds the job's lock ("<node>|<fence>"). A forwarded event is never
// forwarded again, so two nodes cannot bounce one between them.
func (j *Job) forwardToHolder(holder string) {
	holderNode, _, ok := strings.Cut(holder, "|")
	if !ok || holderNode == j.cfg.NodeID || !j.cfg.Forward {
		return
	}
	keep := j.deferred[:0]
	for _, m := range j.deferred {
		switch m := m.(type) {
		case *Result:
			if m.Forwarded || m.Raw == nil {
				keep = append(keep, m)
				continue
			}
			j.emit(Forward{Holder: holderNode, Kind: ForwardResult, Raw: m.Raw, D: m.Delivery})
		case *Cancel:
			if m.Forwarded || m.Raw == nil {
				keep = append(keep, m)
				continue
			}
			j.emit(Forward{Holder: holderNode, Kind: ForwardCancel, Raw: m.Raw, D: m.Delivery})
		default:
			keep = append(keep, m)
		}
	}
	j.deferred = keep
}

// recover re-activates a job whose lock vanished under it.
func (j *Job) recover() {
	j.emitForget(Forget{LockValue: lockValue(j.cfg.NodeID, j.Fence)})
	j.lost = j.State
	j.moveTo(Fresh)
	j.activate(false, nil)
}

// recreate writes back the record of a job Redis no longer has, in the
// state the job knew, with reason state_lost on every recreated step — so a
// worker's result still finds the job, and it is never silently dropped.
func (j *Job) recreate() {
	known := j.lost
	j.lost = ""
	var path []jobstate.Hop
	lost := func(s jobstate.State) jobstate.Hop { return jobstate.Hop{To: s, Reason: jobstate.ReasonStateLost} }
	switch known {
	case jobstate.StateScheduled:
		path = []jobstate.Hop{lost(jobstate.StateScheduled)}
	case jobstate.StateDispatched:
		path = []jobstate.Hop{lost(jobstate.StateScheduled), lost(jobstate.StateDispatched)}
	case jobstate.StateRunning:
		path = []jobstate.Hop{lost(jobstate.StateScheduled), lost(jobstate.StateDispatched), lost(jobstate.StateRunning)}
	}
	j.log(warn, "job record lost from Redis; recreating it", "state", known, "reason", jobstate.ReasonStateLost)
	if !active(known) {
		// The tenant slot taken for a dispatch not yet written went with
		// the record: the dispatch asks for one anew.
		j.admitted = false
	}
	j.State = jobstate.StatePending
	if len(path) == 0 {
		j.activate(true, nil)
		return
	}
	t := &jobstate.Transition{Path: path, Due: j.deadline.UnixMilli(),
		Fields: []string{"worker", j.Worker, "subj", j.Subject, "attempts", strconv.Itoa(j.attempts), jobstate.FieldTry, strconv.Itoa(j.Attempt()),
			"deadline", strconv.FormatInt(j.deadline.UnixMilli(), 10), "deadline_kind", string(j.deadlineWhy),
			"tslot", slotFlag(j.admitted), "resend", slotFlag(j.resend), "sod", slotFlag(j.startsOnDelivery)}}
	if j.deadline.IsZero() {
		t.Due = 0
	}
	if !j.retryAt.IsZero() {
		t.Fields = append(t.Fields, jobstate.FieldRetryAt, strconv.FormatInt(j.retryAt.UnixMilli(), 10))
		if known == jobstate.StateScheduled && j.retryAt.After(j.now()) {
			// A retry wait is due at its retry time, as its retry wrote it:
			// a wait that parks again is brought back by it.
			t.Due = j.retryAt.UnixMilli()
		}
	}
	j.activatePlan(t, nil, j.pend(pending{then: nAdvance}))
}

// adopt loads what the job needs from the record of an existing job.
func (j *Job) adopt(f map[string]string) {
	j.record = f
	j.Worker, j.Subject, j.pool = f["worker"], f["subj"], f["pool"]
	if j.TraceID == "" {
		j.TraceID = f["trace"]
	}
	j.attempts, _ = strconv.Atoi(f["attempts"])
	j.try, _ = strconv.Atoi(f[jobstate.FieldTry])
	j.retryAt = time.Time{}
	if jobstate.State(f["s"]) == jobstate.StateScheduled {
		j.retryAt = msTime(f[jobstate.FieldRetryAt])
	}
	j.created = msTime(f["created"])
	j.deadline = msTime(f["deadline"])
	j.deadlineWhy = jobstate.Reason(f["deadline_kind"])
	// A slot is held only with a worker: the write that took the job
	// back from DISPATCHED or RUNNING gave it back (and left the flag).
	j.admitted = f["tslot"] == "1" && active(jobstate.State(f["s"]))
	j.resend = f["resend"] == "1"
	j.startsOnDelivery = f["sod"] == "1"
	j.lostWorkers = f["lost_workers"]
	// A runner is the current dispatch's only while the job is with it: a
	// record back in SCHEDULED may still name an earlier attempt's.
	j.runnerKnown = f["runner"] != "" && f["runner"] == j.Worker && active(jobstate.State(f["s"]))
	j.lostNoted = f["reason"] == string(jobstate.ReasonWorkerLostRunnerUnknown)
	j.runnerSet = f["runner"] != ""
	j.asksSet = f[fieldTenantAsked] != "" || f[fieldKeyAsked] != ""
	if raw := f["req"]; raw != "" {
		if req, err := jobstate.DecodeRequest([]byte(raw)); err == nil {
			j.Req = req
		}
	}
	j.adoptTokens(f)
}

func msTime(s string) time.Time {
	ms, err := strconv.ParseInt(s, 10, 64)
	if err != nil || ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// unknownJob dead-letters the results and cancels that arrived for a job
// with no record.
//
// Not at once: with several nodes, a node that lost the record with Redis
// (FLUSHALL, a restart without persistence) recreates it when it notices,
// seconds later — a result reaching another node first must not be
// dead-lettered and lost meanwhile. So a result or cancel younger than
// Config.UnknownHold is handed back to JetStream (UnknownHoldDelay), unless
// Redis is known to have lost its data, and dead-lettered only after.
func (j *Job) unknownJob() {
	var keep []any
	found, lostWait := false, false
	hold := func(published time.Time, d Delivery) bool {
		if j.in.DataLost() || published.IsZero() || j.now().Sub(published) >= j.cfg.UnknownHold {
			return false
		}
		j.nak(d, UnknownHoldDelay)
		j.count(MHeld, "")
		return true
	}
	for _, m := range j.deferred {
		switch m := m.(type) {
		case *Result:
			if m.Heard {
				// The stream's copy of it is held or dead-lettered in
				// its turn, once.
				continue
			}
			if hold(m.Published, m.Delivery) {
				continue
			}
			j.acks = append(j.acks, m.Delivery)
			found = true
		case *Cancel:
			if hold(m.Published, m.Delivery) {
				continue
			}
			j.acks = append(j.acks, m.Delivery)
			found = true
		case *Submit:
			keep = append(keep, m)
		case *Wake:
			// A lost wait's wake that came while the activation was
			// outstanding (its own, or another event's) counts too.
			j.wokenLost = j.wokenLost || m.Lost
		}
	}
	j.deferred = keep
	if j.wokenLost && j.in.DataLost() {
		// A wait this node left alone, whose record Redis lost: no event
		// is owed to it, so it ends here or never.
		found, lostWait = true, true
	}
	if !found {
		// Only a wake for a job that no longer exists: nothing to record.
		if len(j.deferred) == 0 {
			j.finish()
		}
		return
	}
	reason, msg := jobstate.ReasonUnknownJob, "result or cancel for a job that has no record"
	if j.in.DataLost() {
		reason, msg = jobstate.ReasonStateLost, "result or cancel for a job whose record Redis lost (it lost its data)"
		if lostWait {
			msg = "the job waited with no actor (a parked retry, an approval or a rate limit) and Redis lost its record (it lost its data)"
		}
	}
	entry := &jobstate.DLQEntry{JobID: j.ID, Reason: reason, TraceID: j.TraceID, Message: msg,
		Subject: j.cfg.ResultSubject}
	fx := []Effect{PublishDLQ{Entry: entry}}
	if reason == jobstate.ReasonStateLost {
		// The job's client waits on the result subject like for every
		// other outcome Troupe decides; no record will ever answer it.
		fx = append(fx, TellClient{Status: capv1.JobStatus_JOB_STATUS_FAILED, Code: reason, Msg: msg, Once: true})
	}
	j.write(j.pend(pending{kind: wDLQ, op: Op{Kind: OpDLQ, JobID: j.ID, DLQ: entry}, applied: fx}))
	j.log(warn, "event for unknown job dead-lettered", "reason", reason)
}

func (j *Job) deadLettered(p *pending) {
	j.fx = append(j.fx, p.applied...)
	j.ackAll()
	if len(j.deferred) > 0 {
		return // a submit is waiting: it activates with create
	}
	// Away, not Ended: a submit that reaches the job after it finished
	// must go back to JetStream and create the job.
	j.finish()
}

// passivate gives the lock up and stops; the job waits in Redis.
func (j *Job) passivate() {
	lv := j.LockValue
	j.emitForget(Forget{LockValue: lv})
	j.LockValue = ""
	j.write(j.pend(pending{kind: wRelease, op: Op{Kind: OpRelease, JobID: j.ID, LockValue: lv}}))
}

// park stops the actor of a job that waits for its worker, keeping the job
// this node's: the lock loses its TTL and is held through the node lease,
// and the job moves from the due set to the node's parked set, due at its
// deadline. If the lock is no longer the job's, it stops without side
// effects, as when its renewal is refused.
func (j *Job) park() {
	lv := j.LockValue
	if lv == "" || len(j.acks) > 0 {
		j.armWait()
		return
	}
	// Not renewed from now on: a renewal racing the park would find the
	// parked value ("…|p") and be refused, harmlessly.
	j.emitForget(Forget{LockValue: lv})
	j.LockValue = ""
	j.write(j.pend(pending{kind: wPark, op: Op{Kind: OpPark, JobID: j.ID, Node: j.cfg.NodeID,
		LockValue: lv, ParkDue: j.deadline.UnixMilli()}}))
}

func (j *Job) parkedAt(r *WriteResult) {
	j.parkedTokens(r.Parked)
	if !r.Parked {
		// The lock is not the job's any more: another node took it, or it
		// vanished (it expired, or Redis lost its data — then the record
		// may be gone too). Activating again tells which: another holder
		// means stopping without side effects (BUSY); no record means
		// writing it back from what this job knows (recover → recreate).
		j.log(warn, "job lock lost before parking; activating again to see who holds the job")
		j.recover()
		return
	}
	j.count(MParked, "")
	if j.State == jobstate.StateScheduled && j.rate.parked {
		j.emit(Alone{Kind: WaitRate})
	}
	j.finishIn(Parked)
}

// leftAlone reports, once a write that gave the job's lock up applied,
// a wait that nothing but its record keeps (see Alone): a retry wait or
// an approval. A job going elsewhere (terminal, made due now) is not one.
func (j *Job) leftAlone() {
	switch {
	case j.State == jobstate.StateApprovalRequired:
		j.emit(Alone{Kind: WaitApproval})
	case j.State == jobstate.StateScheduled && j.LastReason == jobstate.ReasonRetryWait && !j.retryAt.IsZero():
		j.emit(Alone{Kind: WaitRetry, Due: j.retryAt})
	}
}

// onStopping releases the lock of a job still in flight when the actor is
// stopped from outside (node shutdown), so another replica can adopt it at
// once. A job waiting for capacity has no due time: it is made due now as
// the lock goes, so the next replica's due poller places it. The write's
// outcome is not waited for.
func (j *Job) onStopping() {
	j.disarm()
	j.stopWaitingPolicy()
	queued := j.queued
	j.withdraw()
	j.dropPick()
	j.leaveGrace()
	if j.LockValue != "" && !j.res.Gone() {
		j.emitForget(Forget{LockValue: j.LockValue})
		op := &Op{Kind: OpRelease, JobID: j.ID, LockValue: j.LockValue}
		if queued && j.State == jobstate.StateScheduled {
			op.Kind = OpTransition
			op.T = &jobstate.Transition{Expect: jobstate.Expect(jobstate.StateScheduled),
				Path: []jobstate.Hop{{To: jobstate.StateScheduled, Reason: j.capReason}}, Due: j.now().UnixMilli(),
				Release: true, Op: j.opID()}
		}
		j.emitWrite(Write{Op: op}) // epoch 0: no answer is waited for
	}
	j.returnDeliveries()
}
