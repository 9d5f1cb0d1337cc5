package actors

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/bus"
	"github.com/troupe-run/troupe/core"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/router"
	"github.com/troupe-run/troupe/safety"
	"github.com/troupe-run/troupe/saga"
	"github.com/troupe-run/troupe/store"
)

// JobActor owns one job while it is in flight.
//
// What it promises:
//   - It is the only writer of its job's state while it holds the job's lock,
//     and every write is a fenced compare-and-set (store.transitionScript):
//     once another owner has taken the lock, every write of this actor is
//     refused and it stops without side effects.
//   - Nothing is published for a job whose state could not be read: a Redis
//     error means "unknown", and the actor does nothing but ask again.
//   - A request is published to a worker only after DISPATCHED is durable, so
//     a stale owner can never dispatch a job a second time.
//   - A JetStream message is acked only after its effect is durable; until
//     then a crash means redelivery, and redelivery is harmless: a duplicate
//     submit of a live job changes nothing, a result or cancel for a finished
//     job is absorbed, and a terminal job never leaves its state.
//   - Every wait is durable: a retry, a deadline or a pending approval is
//     also a due entry in Redis, so if this node dies the due poller of
//     another replica wakes the job.
//
// What it never does: block its mailbox on the network. Redis work goes
// through the store.Writer and comes back as a storeDone message; the router
// answers by message; timers live on the node's shared Wheel and send wake
// messages.
//
// Lifecycle: spawned by its shard supervisor on the first event for the job
// id; activation takes the lock and reads (or creates) the record; the actor
// drives the job until a terminal state, a passivating wait (approval), the
// discovery that another node owns the job, or — once the job has waited for
// its worker for Env.ParkAfter — parking, then tells the supervisor it is
// Finished.
//
// Parking (DISPATCHED or RUNNING, see park): everything the job needs is
// durable already (state, request, worker, deadline, tenant slot), so the
// actor stops and the node keeps only the lock, through its node lease, and
// its router's record of the dispatch. The next event for the job — a result
// or cancel (forwarded here by any replica, since the lock names this node),
// the deadline (this node's own poll of its parked set), the worker's first
// progress or its eviction (the shard remembers parked DISPATCHED jobs) —
// spawns a fresh actor that activates the job from its record.
type JobActor struct {
	env *Env // shared, immutable

	// Everything below is owned by the actor and touched only in Receive.
	id        string
	activated bool
	done      bool
	// ackAfterDone: events reaching the finished actor are acked (the job is
	// terminal, or the submit was an idempotent duplicate) rather than handed
	// back to JetStream for the node that owns the job.
	ackAfterDone bool
	state        core.State
	lockValue    string
	fence        int64
	req          *capv1.JobRequest
	traceID      string
	worker       string
	subject      string
	attempts     int
	firstFail    time.Time // first permanent routing error, for the grace window
	created      time.Time
	deadline     time.Time
	deadlineWhy  core.Reason
	record       map[string]string // the record as read at adoption
	policyLimit  int               // max_concurrent_jobs from the policy's constraints
	admitted     bool              // the job holds one of its tenant's concurrency slots
	lost         core.State        // the state this actor knew when the job's lock vanished
	decision     []string          // the input policy's decision, as record fields, until written
	lastReason   core.Reason       // the reason of the last state change (for tracing)
	woken        bool              // activated by the due poller (an adoption)
	lapsedAt     time.Time         // when a dead owner's lock lapsed (woken for its lease)
	firstEvent   time.Time
	idemChecked  bool
	// parkAt is when a job waiting for its worker parks (zero: not
	// waiting); parked is set once it has.
	parkAt time.Time
	parked bool
	// resend: the dispatch may be repeated (the worker dedupes, see
	// registry.LabelDedupe); resendAt is when, while DISPATCHED; resends
	// counts the repeats made.
	resend   bool
	resendAt time.Time
	resends  int
	// startsOnDelivery: the worker sends no progress; the job counts as
	// started once delivered (router.PickReply.StartsOnDelivery).
	startsOnDelivery bool
	// waitingPolicy: the job waits on its backoff to ask an unavailable
	// input policy again, and is in env.SafetyWaiters.
	waitingPolicy bool
	// queued: the job waits in the router's capacity queue under ticket
	// (a new ticket per wait), for capReason; the router sends a
	// *router.Placed when a slot frees.
	queued    bool
	ticket    uint64
	capReason core.Reason
	// unwritten: a fresh job waiting within its CapacityGrace, not yet
	// written (its submit un-acked).
	unwritten bool
	// picked is the worker of a pick not (yet) made a dispatch: the router
	// counts the job on it until told otherwise (dropPick).
	picked string

	// opEpoch numbers the one outstanding asynchronous step (a store op or a
	// router question); a reply with another epoch is dropped. While busy,
	// incoming events wait in deferred, in order.
	opEpoch  uint64
	busy     bool
	deferred []interface{}
	then     func(c actor.Context, r *store.Result)
	// acks are deliveries to acknowledge once the current op is durable.
	acks []Delivery

	// The job's one timer on the node's wheel.
	timerEpoch uint64
	timer      TimerRef
}

// NewJobProps returns the props every job actor of a node is spawned with.
// The actor learns its job id from its name (see jobIDFromPID).
func NewJobProps(env *Env, opts ...actor.PropsOption) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &JobActor{env: env} }, opts...)
}

// jobIDFromPID returns the job id from a job actor's PID id "<shard>/<job_id>".
func jobIDFromPID(c actor.Context) string {
	return strings.TrimPrefix(c.Self().Id, c.Parent().Id+"/")
}

// Receive is the job's mailbox handler.
func (j *JobActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		j.id = jobIDFromPID(c)
		j.env.Metrics.LiveActors.Inc()
	case *actor.Stopping:
		j.onStopping(c)
	case *actor.Stopped:
		j.env.Metrics.LiveActors.Dec()
		// protoactor's child set (PIDSet) keeps a stopped child's PID in
		// its backing array until the slot is reused, and the PID caches
		// its process: the stopped actor stays reachable. Drop what it
		// references so that costs a struct, not the job's request.
		j.req, j.record, j.decision, j.deferred, j.acks, j.then = nil, nil, nil, nil, nil, nil
		j.timer = nil
	case *actor.Restarting:
		// A fresh instance replaces this one and recovers from Redis; what
		// this one held in memory goes back to JetStream at once rather
		// than after the ack wait. The lock stays: the new instance, on
		// the same node, re-takes it with a new fence.
		j.env.Metrics.LiveActors.Dec() // Started follows and counts it again
		j.disarm()
		j.stopWaitingPolicy()
		j.withdraw(c)
		j.dropPick(c)
		j.leaveGrace()
		if j.lockValue != "" {
			j.env.Renewer.Forget(j.id, j.lockValue)
		}
		j.returnDeliveries()
	case *Crash:
		crash(m)
	case *router.Placed:
		// Answered at once, busy or not, so the router knows the slot is
		// taken (or free again); acted on in order with other events.
		used := j.queued && m.Ticket == j.ticket && !j.done
		c.Send(j.env.Router, &router.Took{JobID: m.JobID, WorkerID: m.Reply.WorkerID, Ticket: m.Ticket, Used: used})
		if used {
			j.queued = false
			j.event(c, m)
		}
	case *storeDone:
		if m.epoch != j.opEpoch || !j.busy {
			return
		}
		j.busy = false
		k := j.then
		j.then = nil
		k(c, m.res)
		j.drain(c)
	case *router.PickReply:
		if m.Epoch != j.opEpoch || !j.busy {
			return
		}
		j.busy = false
		j.onPick(c, m)
		j.drain(c)
	case *policyDone:
		if m.epoch != j.opEpoch || !j.busy {
			return
		}
		j.busy = false
		j.onDecision(c, m.dec, m.err)
		j.drain(c)
	case *outputDone:
		if m.epoch != j.opEpoch || !j.busy {
			return
		}
		j.busy = false
		j.onOutput(c, m)
		j.drain(c)
	case *wake:
		if m.epoch != j.timerEpoch {
			return
		}
		j.timer = nil
		j.event(c, m)
	case *lockLost:
		if m.lockValue != j.lockValue || j.done {
			return
		}
		if m.vanished && j.activated && j.req != nil {
			// Nobody holds the lock (it expired, or Redis lost its data):
			// nothing else owns the job, so take it again — recreating
			// its record if that vanished too — as a write that found no
			// lock does.
			j.event(c, m)
			return
		}
		j.env.Log.Warn("job lock lost; stopping without side effects", "job_id", j.id, "trace_id", j.traceID)
		j.lockValue = ""
		j.finish(c)
	default:
		j.event(c, m)
	}
}

// event handles an input event now, or later if an async step is outstanding.
func (j *JobActor) event(c actor.Context, m interface{}) {
	if j.busy {
		j.deferred = append(j.deferred, m)
		return
	}
	j.handle(c, m)
}

// drain handles deferred events until one of them starts an async step.
func (j *JobActor) drain(c actor.Context) {
	for !j.busy && len(j.deferred) > 0 {
		m := j.deferred[0]
		j.deferred[0] = nil
		j.deferred = j.deferred[1:]
		j.handle(c, m)
	}
	if len(j.deferred) == 0 {
		j.deferred = nil
	}
}

// handle processes one event: Submit, Result, Cancel, Progress, Wake, wake.
func (j *JobActor) handle(c actor.Context, m interface{}) {
	if j.done {
		j.absorb(m)
		return
	}
	if j.firstEvent.IsZero() {
		j.firstEvent = time.Now()
	}
	switch m := m.(type) {
	case *Submit:
		if j.traceID == "" {
			j.traceID = m.TraceID
		}
		if j.activated {
			// A duplicate submit of a live job: nothing changes.
			j.env.Metrics.Absorbed.WithLabelValues("submit").Inc()
			ack(m.Delivery)
			return
		}
		if j.req == nil {
			j.req = m.Req
		}
		j.acks = append(j.acks, m.Delivery)
		if key := m.Req.GetMeta().GetIdempotencyKey(); key != "" && !j.idemChecked {
			j.claimIdempotency(c, key)
			return
		}
		j.decideFresh(c)
	case *Result:
		if j.traceID == "" {
			j.traceID = m.TraceID
		}
		if !j.activated {
			j.activateFor(c, m)
			return
		}
		j.onResult(c, m)
	case *Cancel:
		if !j.activated && j.unwritten {
			// Waiting within its grace, not yet written: the job is
			// created cancelled.
			j.cancelUnwritten(c, m)
			return
		}
		if !j.activated {
			j.activateFor(c, m)
			return
		}
		j.onCancel(c, m)
	case *Progress:
		if !j.activated {
			// Spawned for a job parked on this node: its first progress
			// is recorded (DISPATCHED → RUNNING moves the deadline to the
			// running timeout), so the job is activated first.
			j.activateFor(c, m)
			return
		}
		if j.state == core.StateDispatched {
			j.markRunning(c)
		}
	case *Wake:
		if !j.activated {
			j.woken, j.lapsedAt = true, m.LapsedAt
			j.activate(c, false, nil, nil, nil)
		}
	case *WorkerLost:
		if !j.activated {
			j.activateFor(c, m) // a parked job whose worker was evicted
			return
		}
		j.onWorkerLost(c, m)
	case *Abandon:
		if !j.activated {
			j.activateFor(c, m)
			return
		}
		j.onAbandon(c, m)
	case *wake:
		j.stopWaitingPolicy()
		if j.unwritten && j.queued {
			// The grace is over: the job still waits, now in Redis too.
			recheck := CapacityRecheck
			if j.capReason != core.ReasonPoolOverloaded {
				recheck = j.env.Backoff(max(j.attempts, 1))
			}
			j.writeWait(c, time.Now().Add(recheck))
			return
		}
		j.advance(c)
	case *router.Placed:
		j.onPlaced(c, m)
	case *lockLost:
		// Handled here, in order with the job's other events: a renewal
		// found no lock (see Receive).
		if m.lockValue == j.lockValue && !j.done {
			j.env.Log.Warn("job lock vanished at renewal; re-activating", "job_id", j.id,
				"trace_id", j.traceID, "state", j.state)
			j.disarm()
			j.recover(c)
		}
	case *policyBack:
		if j.waitingPolicy {
			// Woken early: another job's check has just succeeded.
			j.waitingPolicy = false
			j.disarm()
			j.advance(c)
		}
	}
}

func (j *JobActor) stopWaitingPolicy() {
	if j.waitingPolicy {
		j.waitingPolicy = false
		j.env.SafetyWaiters.remove(j.id)
	}
}

// activateFor activates an existing job for an event that must not create
// one; the event is handled once the job's state is known.
func (j *JobActor) activateFor(c actor.Context, m interface{}) {
	j.deferred = append([]interface{}{m}, j.deferred...)
	j.activate(c, false, nil, nil, nil)
}

// absorb handles an event that reaches the actor after it finished.
func (j *JobActor) absorb(m interface{}) {
	var d Delivery
	kind := "submit"
	switch m := m.(type) {
	case *Submit:
		d = m.Delivery
	case *Result:
		d, kind = m.Delivery, "result"
	case *Cancel:
		d, kind = m.Delivery, "cancel"
	default:
		return
	}
	if j.ackAfterDone || j.state.Terminal() {
		j.env.Metrics.Absorbed.WithLabelValues(kind).Inc()
		ack(d)
		return
	}
	// The job lives elsewhere (another node owns it, or it was passivated
	// a moment ago): let JetStream offer the message again.
	nak(d, time.Second)
}

// claimIdempotency makes sure no other job of the tenant holds the submit's
// idempotency key; a submit whose key is held by another job is that job.
func (j *JobActor) claimIdempotency(c actor.Context, key string) {
	op := &store.Op{Kind: store.OpClaim, JobID: j.id,
		IdemKey: j.env.Keys.Idempotency(safety.TenantOf(j.req), key)}
	j.write(c, op, func(c actor.Context, r *store.Result) {
		j.idemChecked = true
		if r.Holder != j.id {
			j.env.Metrics.IdemDuplicates.Inc()
			j.env.Log.Info("submit is an idempotent duplicate", "job_id", j.id, "trace_id", j.traceID,
				"existing_job_id", r.Holder, "reason", core.ReasonIdempotentDuplicate)
			j.ackAfterDone = true
			j.ackAll()
			j.finish(c)
			return
		}
		j.decideFresh(c)
	})
}

// decideFresh makes the first decision about a submitted job before its
// record exists — policy, then placement — so that creating the record and
// applying that decision (typically PENDING → SCHEDULED → DISPATCHED) is one
// script call. If the job turns out to exist already, the decision is
// dropped and the job continues from its record.
func (j *JobActor) decideFresh(c actor.Context) {
	j.state = core.StatePending
	j.checkPolicy(c)
}

// apply writes t for an active job, or creates the job with t as its plan.
// k runs only if t was applied.
func (j *JobActor) apply(c actor.Context, t *store.Transition, dlq *store.DLQEntry,
	k func(c actor.Context)) {
	if len(j.decision) > 0 {
		t.Fields = append(t.Fields, j.decision...)
		j.decision = nil
	}
	if j.activated {
		j.transition(c, t, dlq, k)
		return
	}
	j.activate(c, true, t, dlq, k)
}

// activate takes the job's lock and learns its state. With create, a
// missing job is created and plan (if any) applied to it in the same call,
// and then k runs; a job that already exists continues from its record.
func (j *JobActor) activate(c actor.Context, create bool, plan *store.Transition, dlq *store.DLQEntry,
	k func(c actor.Context)) {
	op := &store.Op{Kind: store.OpActivate, JobID: j.id, Node: j.env.NodeID, Create: create, TraceID: j.traceID}
	if create && j.req != nil {
		op.Topic = j.req.Topic
		op.Tenant = safety.TenantOf(j.req)
		op.Request, _ = proto.Marshal(j.req)
		op.T, op.DLQ = plan, dlq
		if plan != nil {
			plan.Op = newOpID()
		}
	}
	j.write(c, op, func(c actor.Context, r *store.Result) {
		switch r.Status {
		case store.ActivateCreated:
			j.activated = true
			j.created = time.Now()
			j.env.Metrics.ActivationDelay.Observe(time.Since(j.firstEvent).Seconds())
			j.env.Metrics.Received.Inc()
			j.state, j.fence = r.State, r.Fence
			j.lastReason = core.ReasonSubmitted
			if plan != nil {
				j.lastReason = plan.Path[len(plan.Path)-1].Reason
			}
			if plan == nil || plan.LockKept() {
				j.hold(c, store.LockValue(j.env.NodeID, r.Fence))
			}
			if j.state.Terminal() {
				j.env.Metrics.Completed.WithLabelValues(string(j.state)).Inc()
			}
			j.ackAll()
			if plan == nil {
				j.advance(c)
				return
			}
			if k != nil {
				k(c)
			}
			if (j.state.Terminal() || plan.Release) && !j.done {
				j.finish(c)
			}
		case store.ActivateAdopted:
			if plan != nil && plan.Op != "" && r.Fields["op"] == plan.Op && r.State == plan.Final() {
				// An earlier try of this very activation landed although its
				// reply was lost (a Redis timeout): the job is where the plan
				// put it, and the plan's side effect (the dispatch) is still
				// owed — nobody else can have done it.
				j.activated = true
				j.created = time.Now()
				j.state, j.fence = r.State, r.Fence
				j.lastReason = plan.Path[len(plan.Path)-1].Reason
				j.hold(c, store.LockValue(j.env.NodeID, r.Fence))
				j.ackAll()
				if k != nil {
					k(c)
				}
				return
			}
			j.activated = true
			j.env.Metrics.ActivationDelay.Observe(time.Since(j.firstEvent).Seconds())
			j.state, j.fence = r.State, r.Fence
			j.lastReason = core.Reason(r.Fields["reason"])
			j.hold(c, store.LockValue(j.env.NodeID, r.Fence))
			j.adopt(r.Fields)
			j.dropPick(c) // the plan's pick, if any, is not used
			if (j.state == core.StateDispatched || j.state == core.StateRunning) && j.worker != "" {
				// The job holds a slot on its worker; this router may not
				// have placed it there (adopted, or this node restarted).
				// Counted as started: an adopter cannot tell whether the
				// worker got it, so the worker's eviction does not place
				// it again (its deadline decides, as before adoption
				// counted slots).
				c.Send(j.env.Router, &router.Occupied{WorkerID: j.worker, JobID: j.id, Started: true})
			}
			// r.Holder is the lock before this activation: a parked job's
			// ("<node>|<fence>|p") is this node's own unless it was adopted.
			wasParked := strings.HasSuffix(r.Holder, "|p")
			if wasParked {
				j.env.Metrics.Unparked.Inc()
			}
			if j.woken && !(wasParked && strings.HasPrefix(r.Holder, j.env.NodeID+"|")) {
				j.env.Metrics.OrphanReplayed.WithLabelValues(j.req.GetTopic()).Inc()
				if !j.lapsedAt.IsZero() && r.Holder == "" {
					// The owner's lock had expired (no holder): an orphan.
					j.env.Metrics.AdoptionLatency.Observe(max(time.Since(j.lapsedAt), 0).Seconds())
				}
			}
			j.ackAll()
			j.advance(c)
		case store.ActivateTerminal:
			j.state = r.State
			j.ackAll()
			j.finish(c)
		case store.ActivateBusy:
			// Another node owns the job. Submits are duplicates of a live
			// job; results and cancels go to the owner (or back to
			// JetStream). A lock with no record behind it is not a live job:
			// the submit goes back too.
			j.state = r.State
			if r.State == "" {
				for _, d := range j.acks {
					nak(d, time.Second)
				}
				j.acks = j.acks[:0]
			}
			j.ackAll()
			j.forwardToOwner(r.Holder)
			j.finish(c)
		case store.ActivateNotFound:
			if j.lost != "" {
				j.recreate(c)
				return
			}
			j.unknownJob(c)
		}
	})
}

// hold records that the actor owns the job's lock and registers it for renewal.
func (j *JobActor) hold(c actor.Context, lockValue string) {
	j.lockValue = lockValue
	self, root := c.Self(), j.env.Root
	j.env.Renewer.Hold(j.id, lockValue, func(vanished bool) {
		root.Send(self, &lockLost{lockValue: lockValue, vanished: vanished})
	})
}

// forwardToOwner passes the results and cancels waiting here to the node
// that holds the job's lock (holder "<node>|<fence>"), over a request to that
// node's inbox. The original JetStream message is acked only when the owner
// answers that it took the event (its actor made it durable); otherwise it
// goes back to JetStream. A forwarded event is never forwarded again, so two
// nodes cannot bounce one between them.
func (j *JobActor) forwardToOwner(holder string) {
	owner, _, ok := strings.Cut(holder, "|")
	if !ok || owner == j.env.NodeID || j.env.Forward == nil {
		return
	}
	keep := j.deferred[:0]
	for _, m := range j.deferred {
		var kind string
		var raw []byte
		var d Delivery
		switch m := m.(type) {
		case *Result:
			if m.Forwarded || m.Raw == nil {
				keep = append(keep, m)
				continue
			}
			kind, raw, d = ForwardResult, m.Raw, m.Delivery
		case *Cancel:
			if m.Forwarded || m.Raw == nil {
				keep = append(keep, m)
				continue
			}
			kind, raw, d = ForwardCancel, m.Raw, m.Delivery
		default:
			keep = append(keep, m)
			continue
		}
		forward, metric := j.env.Forward, j.env.Metrics.Forwarded
		go func() {
			if forward(owner, kind, raw) {
				metric.WithLabelValues("taken").Inc()
				ack(d)
			} else {
				metric.WithLabelValues("returned").Inc()
				nak(d, time.Second)
			}
		}()
	}
	j.deferred = keep
}

// recover re-activates a job whose lock vanished under this actor.
func (j *JobActor) recover(c actor.Context) {
	j.env.Renewer.Forget(j.id, store.LockValue(j.env.NodeID, j.fence))
	j.lost = j.state
	j.activated = false
	j.activate(c, false, nil, nil, nil)
}

// recreate writes back the record of a job Redis no longer has (a restart
// without persistence), in the state this actor knew, with reason
// state_lost on every recreated step — so a worker's result still finds the
// job, and the job is never silently dropped.
func (j *JobActor) recreate(c actor.Context) {
	known := j.lost
	j.lost = ""
	var path []store.Hop
	switch known {
	case core.StateScheduled:
		path = []store.Hop{{To: core.StateScheduled, Reason: core.ReasonStateLost}}
	case core.StateDispatched:
		path = []store.Hop{{To: core.StateScheduled, Reason: core.ReasonStateLost},
			{To: core.StateDispatched, Reason: core.ReasonStateLost}}
	case core.StateRunning:
		path = []store.Hop{{To: core.StateScheduled, Reason: core.ReasonStateLost},
			{To: core.StateDispatched, Reason: core.ReasonStateLost}, {To: core.StateRunning, Reason: core.ReasonStateLost}}
	}
	j.env.Log.Warn("job record lost from Redis; recreating it", "job_id", j.id, "trace_id", j.traceID,
		"state", known, "reason", core.ReasonStateLost)
	j.state = core.StatePending
	if len(path) == 0 {
		j.activate(c, true, nil, nil, nil)
		return
	}
	t := &store.Transition{Path: path, Due: j.deadline.UnixMilli(),
		Fields: []string{"worker", j.worker, "subj", j.subject, "attempts", strconv.Itoa(j.attempts),
			"deadline", strconv.FormatInt(j.deadline.UnixMilli(), 10), "deadline_kind", string(j.deadlineWhy),
			"tslot", slotFlag(j.admitted), "resend", slotFlag(j.resend), "sod", slotFlag(j.startsOnDelivery)}}
	if j.deadline.IsZero() {
		t.Due = 0
	}
	j.activate(c, true, t, nil, func(c actor.Context) { j.advance(c) })
}

// adopt loads what the actor needs from the record of an existing job.
func (j *JobActor) adopt(f map[string]string) {
	j.record = f
	j.worker, j.subject = f["worker"], f["subj"]
	if j.traceID == "" {
		j.traceID = f["trace"]
	}
	j.attempts, _ = strconv.Atoi(f["attempts"])
	j.created = msTime(f["created"])
	j.deadline = msTime(f["deadline"])
	j.deadlineWhy = core.Reason(f["deadline_kind"])
	j.admitted = f["tslot"] == "1"
	j.resend = f["resend"] == "1"
	j.startsOnDelivery = f["sod"] == "1"
	if raw := f["req"]; raw != "" {
		req := &capv1.JobRequest{}
		if err := proto.Unmarshal([]byte(raw), req); err == nil {
			j.req = req
		}
	}
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
func (j *JobActor) unknownJob(c actor.Context) {
	var keep []interface{}
	found := false
	for _, m := range j.deferred {
		switch m := m.(type) {
		case *Result:
			j.acks = append(j.acks, m.Delivery)
			found = true
		case *Cancel:
			j.acks = append(j.acks, m.Delivery)
			found = true
		case *Submit:
			keep = append(keep, m)
		}
	}
	j.deferred = keep
	if !found {
		// Only a wake for a job that no longer exists: nothing to record.
		if len(j.deferred) == 0 {
			j.finish(c)
		}
		return
	}
	reason, msg := core.ReasonUnknownJob, "result or cancel for a job that has no record"
	if j.env.DataLost != nil && j.env.DataLost() {
		reason, msg = core.ReasonStateLost, "result or cancel for a job whose record Redis lost (it lost its data)"
	}
	entry := &store.DLQEntry{JobID: j.id, Reason: reason, TraceID: j.traceID, Message: msg,
		Subject: j.env.Subjects.Result}
	j.write(c, &store.Op{Kind: store.OpDLQ, JobID: j.id, DLQ: entry}, func(c actor.Context, r *store.Result) {
		j.env.Log.Warn("event for unknown job dead-lettered", "job_id", j.id, "trace_id", j.traceID,
			"reason", reason)
		publishDLQ(j.env, entry)
		j.ackAll()
		if len(j.deferred) > 0 {
			return // a submit is waiting: it activates with create
		}
		// Not ackAfterDone: a submit that reaches this actor after it
		// finished must go back to JetStream and create the job.
		j.finish(c)
	})
}

// advance does the next thing the job's state calls for.
func (j *JobActor) advance(c actor.Context) {
	switch j.state {
	case core.StatePending:
		j.checkPolicy(c)
	case core.StateScheduled:
		j.askRouter(c)
	case core.StateApprovalRequired:
		j.resumeApproval(c)
	case core.StateDispatched, core.StateRunning:
		j.watchDeadline(c)
	default:
		if j.state.Terminal() {
			j.finish(c)
		}
	}
}

// checkPolicy asks the input policy about a PENDING job (or a submitted job
// not yet created).
func (j *JobActor) checkPolicy(c actor.Context) {
	if j.req == nil {
		j.fail(c, core.ReasonInvalidRequest, "job record has no request", "")
		return
	}
	preq := safety.CheckRequest(j.req)
	if safety.IsInline(j.env.Policy) {
		// Answers from memory in microseconds: no reason to leave the mailbox.
		dec, err := j.env.Policy.Check(context.Background(), preq)
		j.onDecision(c, dec, err)
		return
	}
	// A remote kernel: ask from a goroutine and take the answer as a
	// message, so the mailbox never waits on the network.
	j.opEpoch++
	j.busy = true
	ep, self, root, policy, slots := j.opEpoch, c.Self(), j.env.Root, j.env.Policy, j.env.PolicySlots
	go func() {
		dec, err := checkBounded(policy, preq, slots)
		root.Send(self, &policyDone{epoch: ep, dec: dec, err: err})
	}()
}

// errPolicyBusy: every slot for remote checks stayed taken for the whole
// PolicyTimeout. Like an unavailable policy, it means "retry later".
var errPolicyBusy = errors.New("input policy: too many checks in flight on this node")

// checkBounded asks policy while holding one of slots (nil: no bound), so a
// node never has more than cap(slots) checks outstanding at a kernel: a
// kernel that has just come back is not buried under every job that waited
// for it. The wait for a slot and the check have a PolicyTimeout each: a
// check that waited must not reach the kernel with its time nearly spent,
// where its timeout would count against the kernel's circuit.
func checkBounded(policy safety.InputPolicy, preq *capv1.PolicyCheckRequest,
	slots chan struct{}) (*capv1.PolicyCheckResponse, error) {
	if slots != nil {
		wait := time.NewTimer(PolicyTimeout)
		select {
		case slots <- struct{}{}:
			wait.Stop()
			defer func() { <-slots }()
		case <-wait.C:
			return nil, errPolicyBusy
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), PolicyTimeout)
	defer cancel()
	return policy.Check(ctx, preq)
}

// onDecision acts on the input policy's answer.
func (j *JobActor) onDecision(c actor.Context, dec *capv1.PolicyCheckResponse, err error) {
	if err != nil || dec == nil {
		// Unavailable (or an open circuit): never a denial, always a retry.
		j.retryLater(c, core.ReasonSafetyUnavailable)
		if j.activated && j.timer != nil && j.env.SafetyWaiters != nil {
			j.waitingPolicy = true
			j.env.SafetyWaiters.add(j.id, c.Self())
		}
		return
	}
	if j.env.SafetyWaiters != nil {
		j.env.SafetyWaiters.wake(j.env.Root, SafetyWakeBatch)
	}
	if m := dec.GetConstraints().GetBudgets().GetMaxConcurrentJobs(); m > 0 {
		j.policyLimit = int(m)
	}
	// The decision is recorded with the job's next write.
	j.decision = safety.DecisionFields(dec)
	switch dec.Decision {
	case capv1.DecisionType_DECISION_TYPE_ALLOW_WITH_CONSTRAINTS:
		// The constraints travel to the worker in the request's env (the
		// names CAP workers read) and cap budget.deadline_ms.
		safety.ApplyConstraints(j.req, dec.Constraints)
		j.askRouter(c)
	case capv1.DecisionType_DECISION_TYPE_ALLOW:
		j.askRouter(c)
	case capv1.DecisionType_DECISION_TYPE_REQUIRE_HUMAN:
		j.requestApproval(c, dec)
	case capv1.DecisionType_DECISION_TYPE_THROTTLE:
		j.retryIn(c, core.ReasonSafetyThrottled, ThrottleDelay)
	default: // DENY and anything unknown
		j.deny(c, core.ReasonSafetyDenied, dec.Reason,
			[]string{"rule_id", dec.RuleId, "policy_reason", dec.Reason, "policy_snapshot", dec.PolicySnapshot})
	}
}

// requestApproval records APPROVAL_REQUIRED with the job hash and passivates:
// the lock is released and the actor stops. An approval (store.Decide) makes
// the job due, and whichever replica's due poller sees it wakes the job.
func (j *JobActor) requestApproval(c actor.Context, dec *capv1.PolicyCheckResponse) {
	j.apply(c, &store.Transition{Expect: store.Expect(core.StatePending),
		Path:    []store.Hop{{To: core.StateApprovalRequired, Reason: core.ReasonApprovalRequired}},
		Release: true, Due: -1,
		Fields: []string{"job_hash", safety.HashJobRequest(j.req), "rule_id", dec.RuleId,
			"policy_reason", dec.Reason, "policy_snapshot", dec.PolicySnapshot}},
		nil, func(c actor.Context) {
			j.env.Log.Info("job waits for approval", "job_id", j.id, "trace_id", j.traceID,
				"topic", j.req.GetTopic(), "rule_id", dec.RuleId)
		})
}

// resumeApproval acts on the decision recorded for an APPROVAL_REQUIRED job.
func (j *JobActor) resumeApproval(c actor.Context) {
	f := j.record
	by := []string{"approved_by", f["approval_by"], "approval_reason", f["approval_reason"]}
	switch store.Decision(f["approval_decision"]) {
	case store.DecisionApproved:
		if j.req == nil || safety.HashJobRequest(j.req) != f["job_hash"] || f["approval_hash"] != f["job_hash"] {
			j.deny(c, core.ReasonApprovalHashMismatch, "the job changed after approval was requested", by)
			return
		}
		j.transition(c, &store.Transition{Expect: store.Expect(core.StateApprovalRequired),
			Path: []store.Hop{{To: core.StateScheduled, Reason: core.ReasonApprovalGranted}}, Due: -1, Fields: by}, nil,
			func(c actor.Context) { j.askRouter(c) })
	case store.DecisionRejected:
		j.deny(c, core.ReasonApprovalRejected, f["approval_reason"], by)
	default:
		// Woken without a decision: wait again with no actor.
		j.passivate(c)
	}
}

// passivate gives the lock up and stops; the job waits in Redis.
func (j *JobActor) passivate(c actor.Context) {
	lv := j.lockValue
	j.env.Renewer.Forget(j.id, lv)
	j.lockValue = ""
	j.write(c, &store.Op{Kind: store.OpRelease, JobID: j.id, LockValue: lv}, func(c actor.Context, r *store.Result) {
		j.finish(c)
	})
}

func (j *JobActor) deny(c actor.Context, reason core.Reason, detail string, fields []string) {
	entry := j.dlqEntry(reason, detail, "")
	j.apply(c, &store.Transition{Expect: store.Expect(core.StatePending, core.StateScheduled, core.StateApprovalRequired),
		Path:   []store.Hop{{To: core.StateDenied, Reason: reason}},
		Fields: append(fields, "error_code", string(reason), "error_message", detail)}, entry,
		func(c actor.Context) {
			j.env.Log.Info("job denied", "job_id", j.id, "trace_id", j.traceID, "topic", j.req.GetTopic(),
				"reason", reason, "detail", detail)
			publishDLQ(j.env, entry)
			j.tellClient(capv1.JobStatus_JOB_STATUS_DENIED, reason, detail)
		})
}

// askRouter asks for a worker; the answer arrives as a *router.PickReply.
// With no room the router queues the job (see waitCapacity).
func (j *JobActor) askRouter(c actor.Context) {
	j.dropPick(c)
	j.opEpoch++
	j.busy = true
	if !j.queued {
		j.ticket++
	}
	submitted := j.created
	if submitted.IsZero() {
		submitted = j.firstEvent
	}
	c.Request(j.env.Router, &router.PickRequest{JobID: j.id, Req: j.req, Epoch: j.opEpoch,
		Wait: true, Ticket: j.ticket, Submitted: submitted})
}

func (j *JobActor) onPick(c actor.Context, p *router.PickReply) {
	if p.Queued {
		j.waitCapacity(c, p)
		return
	}
	if j.queued {
		j.queued = false // placed (or refused) on a recheck: not queued any more
	}
	if p.Reason != "" {
		j.placementFailed(c, p)
		return
	}
	j.picked = p.WorkerID
	limit := j.tenantLimit()
	if limit <= 0 || j.admitted {
		j.dispatchTo(c, p)
		return
	}
	// The tenant has a concurrency limit: take a slot (shared by every
	// replica) before dispatching, or wait like any transient failure.
	op := &store.Op{Kind: store.OpAdmit, JobID: j.id, TenantKey: j.env.Keys.TenantActive(safety.TenantOf(j.req)), Limit: limit}
	j.write(c, op, func(c actor.Context, r *store.Result) {
		if !r.Admitted {
			j.dropPick(c)
			j.placementFailed(c, &router.PickReply{Reason: core.ReasonTenantLimit,
				Detail: "tenant " + safety.TenantOf(j.req) + " has " + strconv.Itoa(limit) + " jobs running"})
			return
		}
		j.admitted = true
		j.dispatchTo(c, p)
	})
}

// tenantLimit is the job's tenant concurrency limit (0: none): the node's
// per-tenant setting, lowered by the policy's max_concurrent_jobs.
func (j *JobActor) tenantLimit() int {
	limit := 0
	if j.env.TenantLimit != nil {
		limit = j.env.TenantLimit(safety.TenantOf(j.req))
	}
	if j.policyLimit > 0 && (limit == 0 || j.policyLimit < limit) {
		limit = j.policyLimit
	}
	return limit
}

// dispatchTo records the job as dispatched to the picked worker and
// publishes it there.
func (j *JobActor) dispatchTo(c actor.Context, p *router.PickReply) {
	path := make([]store.Hop, 0, 2)
	if j.state == core.StatePending {
		path = append(path, store.Hop{To: core.StateScheduled, Reason: core.ReasonAllowed})
	}
	path = append(path, store.Hop{To: core.StateDispatched, Reason: core.ReasonDispatched})
	j.attempts++
	deadline, why := j.deadlineFor(core.StateDispatched)
	if p.StartsOnDelivery {
		// The worker will not say when it starts (stock CAP workers send
		// no progress): the job is bounded by its run, not by the wait
		// for a start that never gets reported.
		deadline, why = j.deadlineFor(core.StateRunning)
	}
	j.apply(c, &store.Transition{Expect: store.Expect(core.StatePending, core.StateScheduled), Path: path,
		Due: deadline.UnixMilli(),
		Fields: []string{"worker", p.WorkerID, "subj", p.Subject, "attempts", strconv.Itoa(j.attempts),
			"deadline", strconv.FormatInt(deadline.UnixMilli(), 10), "deadline_kind", string(why),
			"tslot", slotFlag(j.admitted), "resend", slotFlag(p.Resend), "sod", slotFlag(p.StartsOnDelivery)}}, nil,
		func(c actor.Context) {
			j.worker, j.subject = p.WorkerID, p.Subject
			j.picked = ""
			j.resend, j.resends = p.Resend, 0
			j.startsOnDelivery = p.StartsOnDelivery
			j.deadline, j.deadlineWhy = deadline, why
			data, err := bus.EncodeRequest(j.traceID, j.env.NodeID, j.req)
			if err == nil {
				err = j.env.Publish(p.Subject, data)
			}
			if err != nil {
				j.env.Log.Warn("dispatch publish failed", "job_id", j.id, "trace_id", j.traceID, "subject", p.Subject, "err", err)
				j.transition(c, &store.Transition{Expect: store.Expect(core.StateDispatched),
					Path: []store.Hop{{To: core.StateScheduled, Reason: core.ReasonDispatchFailed}}, Due: -1}, nil,
					func(c actor.Context) { j.retryLater(c, core.ReasonDispatchFailed) })
				return
			}
			if j.startsOnDelivery {
				// Started on delivery as far as anyone can tell: the
				// worker's eviction must not place it again (it may be
				// running, on that worker or — on a pool subject — on
				// another); its run's deadline bounds it.
				j.release(c, false)
			}
			j.env.Metrics.Dispatched.Inc()
			j.env.Metrics.DispatchLatency.Observe(time.Since(j.firstEvent).Seconds())
			j.waitWorker(c)
		})
}

// deadlineFor returns when a job entering state times out, and why: the
// state's own timeout or the job's budget deadline, whichever is first.
func (j *JobActor) deadlineFor(state core.State) (time.Time, core.Reason) {
	now := time.Now()
	at, why := now.Add(j.env.Timeouts.Dispatch), core.ReasonDispatchTimeout
	if state == core.StateRunning {
		at, why = now.Add(j.env.Timeouts.RunningFor(j.req.GetTopic())), core.ReasonRunningTimeout
	}
	created := j.created
	if created.IsZero() {
		created = now // not yet written: it is being created now
	}
	if ms := j.req.GetBudget().GetDeadlineMs(); ms > 0 {
		if b := created.Add(time.Duration(ms) * time.Millisecond); b.Before(at) {
			at, why = b, core.ReasonDeadlineExceeded
		}
	}
	return at, why
}

// watchDeadline arms the deadline of a DISPATCHED or RUNNING job, or times
// it out if the deadline has passed, repeats its dispatch when a resend is
// due, or parks the job once it has waited ParkAfter.
func (j *JobActor) watchDeadline(c actor.Context) {
	if j.deadline.IsZero() {
		j.deadline, j.deadlineWhy = j.deadlineFor(j.state)
	}
	now := time.Now()
	switch {
	case !now.Before(j.deadline):
		j.timeout(c)
	case j.parkAt.IsZero():
		j.waitWorker(c)
	case j.resendDue(now):
		j.resendDispatch(c, now)
	case !now.Before(j.parkAt) && !j.parkHeld():
		j.park(c)
	default:
		j.armWait(c)
	}
}

// waitWorker starts the wait of a job that is with its worker: its one timer
// fires at the deadline or, when sooner, when its dispatch is to be repeated
// or it parks.
func (j *JobActor) waitWorker(c actor.Context) {
	now := time.Now()
	j.parkAt = time.Time{}
	if j.env.ParkAfter > 0 {
		j.parkAt = now.Add(j.env.ParkAfter)
	}
	j.resendAt = time.Time{}
	if j.resend && j.state == core.StateDispatched && j.env.ResendAfter > 0 && j.req != nil {
		j.resendAt = now.Add(j.resendDelay())
	}
	j.armWait(c)
}

func (j *JobActor) armWait(c actor.Context) {
	at := j.deadline
	if !j.parkAt.IsZero() && j.parkAt.Before(at) && !j.parkHeld() {
		at = j.parkAt
	}
	if j.resendPending() && j.resendAt.Before(at) {
		at = j.resendAt
	}
	j.arm(c, at)
}

// Resending a dispatch. A direct dispatch is one core NATS publish: it is
// lost if the server restarts or the worker is reconnecting at that moment,
// and nothing tells the node. A worker that dedupes by job id
// (registry.LabelDedupe) lets the node repeat the publish while the job is
// DISPATCHED with no sign of the worker; a worker that already holds the
// job answers the repeat with a RUNNING progress, which ends the repeats.
// Jobs that finish within ResendAfter never see one.

func (j *JobActor) resendPending() bool {
	return j.state == core.StateDispatched && !j.resendAt.IsZero()
}

func (j *JobActor) resendDue(now time.Time) bool {
	return j.resendPending() && !now.Before(j.resendAt)
}

// parkHeld: a DISPATCHED job parks only once its resends are spent, since
// a parked job is not resent.
func (j *JobActor) parkHeld() bool {
	return j.resendPending() && j.resends < ResendsBeforePark
}

// resendDelay is the wait before repeat number j.resends+1.
func (j *JobActor) resendDelay() time.Duration {
	d := ResendCap
	if j.resends < 8 {
		d = min(j.env.ResendAfter<<j.resends, ResendCap)
	}
	return d
}

// resendDispatch repeats the dispatch to the same subject, or, while the
// node's NATS connection is down, waits a second for it to come back.
func (j *JobActor) resendDispatch(c actor.Context, now time.Time) {
	if j.env.Connected != nil && !j.env.Connected() {
		j.resendAt = now.Add(time.Second)
		j.armWait(c)
		return
	}
	data, err := bus.EncodeRequest(j.traceID, j.env.NodeID, j.req)
	if err == nil {
		err = j.env.Publish(j.subject, data)
	}
	if err != nil {
		j.env.Log.Warn("dispatch resend failed", "job_id", j.id, "trace_id", j.traceID, "subject", j.subject, "err", err)
	} else {
		j.env.Metrics.Resent.Inc()
		j.env.Log.Debug("dispatch resent", "job_id", j.id, "trace_id", j.traceID, "subject", j.subject,
			"resend", j.resends+1)
	}
	j.resends++
	j.resendAt = now.Add(j.resendDelay())
	j.armWait(c)
}

// park stops the actor of a job that waits for its worker, keeping the job
// this node's: the lock loses its TTL and is held through the node lease,
// and the job moves from the due set to the node's parked set, due at its
// deadline (store parkScript). Nothing else changes in Redis; the router
// still counts the dispatch. If the lock is no longer this actor's, the
// actor stops without side effects, as when its renewal is refused.
func (j *JobActor) park(c actor.Context) {
	lv := j.lockValue
	if lv == "" || len(j.acks) > 0 {
		j.armWait(c)
		return
	}
	// Not renewed from now on: a renewal racing the park would find the
	// parked value ("…|p") and be refused, harmlessly.
	j.env.Renewer.Forget(j.id, lv)
	j.lockValue = ""
	op := &store.Op{Kind: store.OpPark, JobID: j.id, Node: j.env.NodeID, LockValue: lv,
		ParkDue: j.deadline.UnixMilli()}
	j.write(c, op, func(c actor.Context, r *store.Result) {
		if !r.Parked {
			j.env.Log.Warn("job lock lost before parking; stopping without side effects", "job_id", j.id,
				"trace_id", j.traceID)
			j.finish(c)
			return
		}
		j.parked = true
		j.env.Metrics.Parked.Inc()
		j.finish(c)
	})
}

// timeout moves a DISPATCHED or RUNNING job to TIMEOUT and tells its worker.
func (j *JobActor) timeout(c actor.Context) {
	why := j.deadlineWhy
	if why == "" {
		why = core.ReasonDispatchTimeout
	}
	j.transition(c, &store.Transition{Expect: store.Expect(core.StateDispatched, core.StateRunning),
		Path: []store.Hop{{To: core.StateTimeout, Reason: why}}, Fields: []string{"error_code", string(why)}}, nil,
		func(c actor.Context) {
			j.env.Metrics.Timeouts.WithLabelValues(string(why)).Inc()
			j.env.Log.Info("job timed out", "job_id", j.id, "trace_id", j.traceID, "topic", j.req.GetTopic(),
				"reason", why, "worker_id", j.worker)
			j.cancelWorker(string(why))
			j.tellClient(capv1.JobStatus_JOB_STATUS_TIMEOUT, why, "the job passed its "+string(why))
		})
}

// tellClient publishes an outcome Troupe decided itself (cancelled, timed
// out, denied, failed to schedule) as a JobResult on the result subject,
// where CAP clients wait for their job's result: without it a client
// waits for ever for a result no worker will send. It names no worker, so
// no node takes it for a worker's answer; the node that reads it back from
// the result stream finds the job terminal and absorbs it.
func (j *JobActor) tellClient(status capv1.JobStatus, code core.Reason, msg string) {
	data, err := bus.EncodeResult(j.traceID, j.env.NodeID, &capv1.JobResult{JobId: j.id, Status: status,
		ErrorCode: string(code), ErrorMessage: msg})
	if err == nil {
		err = j.env.Publish(j.env.Subjects.Result, data)
	}
	if err != nil {
		j.env.Log.Warn("outcome publish failed", "job_id", j.id, "trace_id", j.traceID, "err", err)
	}
}

// cancelWorker publishes a JobCancel on sys.job.cancel, where CAP workers
// listen for them.
func (j *JobActor) cancelWorker(reason string) {
	data, err := bus.EncodeCancel(j.traceID, j.env.NodeID, &capv1.JobCancel{JobId: j.id, Reason: reason,
		RequestedBy: j.env.NodeID})
	if err == nil {
		err = j.env.Publish(j.env.Subjects.Cancel, data)
	}
	if err != nil {
		j.env.Log.Warn("cancel publish failed", "job_id", j.id, "trace_id", j.traceID, "err", err)
	}
}

// waitCapacity keeps a job the router has queued for room. The wait costs
// no Redis traffic: SCHEDULED with its reason is written when the wait
// begins or its reason changes, with no due time (the lock, kept by the
// node lease, covers the job; a graceful stop hands it on, see onStopping).
// A recheck in memory every CapacityRecheck guards against a lost wake.
// A pool with workers but no room is waited on for as long as it takes; a
// pool with no live workers (no_workers, stale_worker) is rechecked on the
// scheduling backoff and counts attempts, so a pool that never gets a
// worker fails the job as before (max_scheduling_retries).
func (j *JobActor) waitCapacity(c actor.Context, p *router.PickReply) {
	again := j.queued
	j.queued = true
	changed := !again || j.capReason != p.Reason
	j.capReason = p.Reason
	recheck := CapacityRecheck
	if p.Reason != core.ReasonPoolOverloaded {
		j.attempts++
		if j.attempts >= j.env.MaxSchedulingAttempts {
			j.withdraw(c)
			j.fail(c, core.ReasonMaxSchedulingRetries,
				"no placement after "+strconv.Itoa(j.attempts)+" attempts: "+p.Detail, p.Reason)
			return
		}
		recheck = j.env.Backoff(max(j.attempts, 1))
		changed = changed || again
	}
	at := time.Now().Add(recheck)
	if !changed && j.activated {
		j.arm(c, at)
		return
	}
	if !j.activated && !j.unwritten && j.env.CapacityGrace > 0 {
		if j.env.Unwritten.Add(1) <= j.env.MaxUnwrittenWaits {
			// Within the grace: nothing is written yet (see CapacityGraceDefault).
			j.unwritten = true
			j.arm(c, time.Now().Add(j.env.CapacityGrace))
			return
		}
		j.env.Unwritten.Add(-1) // the node holds as many as it may: write now
	}
	j.writeWait(c, at)
}

// writeWait records that the job waits for capacity: SCHEDULED with the
// reason, no due time, then the recheck at at.
func (j *JobActor) writeWait(c actor.Context, at time.Time) {
	j.leaveGrace()
	p := j.capReason
	j.env.Metrics.CapacityWaits.WithLabelValues(string(p)).Inc()
	j.apply(c, &store.Transition{Expect: store.Expect(core.StatePending, core.StateScheduled),
		Path: []store.Hop{{To: core.StateScheduled, Reason: p}}, Due: -1,
		Fields: []string{"attempts", strconv.Itoa(j.attempts), "last_reason", string(p)}},
		nil, func(c actor.Context) { j.arm(c, at) })
}

// leaveGrace ends a wait within the grace (written, placed or finished).
func (j *JobActor) leaveGrace() {
	if j.unwritten {
		j.unwritten = false
		j.env.Unwritten.Add(-1)
	}
}

// onPlaced acts on a placement the router made for the queued job.
func (j *JobActor) onPlaced(c actor.Context, m *router.Placed) {
	j.disarm()
	j.leaveGrace()
	if j.state != core.StatePending && j.state != core.StateScheduled {
		// Moved on meanwhile (cancelled, say): the slot goes back.
		if m.Reply.WorkerID != "" {
			c.Send(j.env.Router, &router.Released{WorkerID: m.Reply.WorkerID, JobID: j.id, Done: true})
		}
		return
	}
	j.onPick(c, m.Reply)
}

// dropPick tells the router that a pick this job was given will not be
// dispatched (the job moved on, or asks again), so the slot it counted is
// freed.
func (j *JobActor) dropPick(c actor.Context) {
	if j.picked != "" {
		c.Send(j.env.Router, &router.Released{WorkerID: j.picked, JobID: j.id, Done: true})
		j.picked = ""
	}
}

// withdraw takes the job out of the router's queue.
func (j *JobActor) withdraw(c actor.Context) {
	if j.queued {
		j.queued = false
		c.Send(j.env.Router, &router.Withdraw{JobID: j.id, Ticket: j.ticket})
	}
}

func (j *JobActor) placementFailed(c actor.Context, p *router.PickReply) {
	if router.Permanent(p.Reason) {
		now := time.Now()
		if j.firstFail.IsZero() {
			j.firstFail = now
		}
		if now.Sub(j.firstFail) >= j.env.PermanentGrace {
			j.fail(c, p.Reason, p.Detail, "")
			return
		}
	}
	j.attempts++
	if j.attempts >= j.env.MaxSchedulingAttempts {
		j.fail(c, core.ReasonMaxSchedulingRetries,
			"no placement after "+strconv.Itoa(j.attempts)+" attempts: "+p.Detail, p.Reason)
		return
	}
	j.env.Metrics.Retries.WithLabelValues(string(p.Reason)).Inc()
	// Record the attempt, its reason and when the job wakes (PENDING →
	// SCHEDULED on the first, SCHEDULED → SCHEDULED after), then wait.
	at := time.Now().Add(j.env.Backoff(j.attempts))
	j.apply(c, &store.Transition{Expect: store.Expect(core.StatePending, core.StateScheduled),
		Path: []store.Hop{{To: core.StateScheduled, Reason: p.Reason}}, Due: at.UnixMilli(),
		Fields: []string{"attempts", strconv.Itoa(j.attempts), "last_reason", string(p.Reason)}},
		nil, func(c actor.Context) { j.arm(c, at) })
}

// retryIn waits d (a throttling policy's answer) and decides again.
func (j *JobActor) retryIn(c actor.Context, why core.Reason, d time.Duration) {
	if !j.activated {
		j.activate(c, true, nil, nil, nil)
		return
	}
	j.env.Metrics.Retries.WithLabelValues(string(why)).Inc()
	j.arm(c, time.Now().Add(d))
}

// retryLater waits and advances again without a state change. A submitted
// job that is not yet created is created first (in PENDING), so its submit
// can be acked and its wait survives this node.
func (j *JobActor) retryLater(c actor.Context, why core.Reason) {
	if !j.activated {
		j.activate(c, true, nil, nil, nil) // advance() then decides again
		return
	}
	j.attempts++
	if j.attempts >= j.env.MaxSchedulingAttempts {
		j.fail(c, core.ReasonMaxSchedulingRetries, "gave up after "+strconv.Itoa(j.attempts)+" attempts", why)
		return
	}
	j.env.Metrics.Retries.WithLabelValues(string(why)).Inc()
	j.env.Log.Debug("job retry", "job_id", j.id, "trace_id", j.traceID, "reason", why, "attempt", j.attempts)
	j.arm(c, time.Now().Add(j.env.Backoff(j.attempts)))
}

// fail moves the job to FAILED with reason, dead-letters it, and finishes.
func (j *JobActor) fail(c actor.Context, reason core.Reason, detail string, last core.Reason) {
	entry := j.dlqEntry(reason, detail, last)
	fields := []string{"error_code", string(reason), "error_message", detail}
	if last != "" {
		fields = append(fields, "last_reason", string(last))
	}
	j.apply(c, &store.Transition{Expect: store.Expect(core.StatePending, core.StateScheduled, core.StateApprovalRequired),
		Path: []store.Hop{{To: core.StateFailed, Reason: reason}}, Fields: fields}, entry,
		func(c actor.Context) {
			j.env.Log.Warn("job failed", "job_id", j.id, "trace_id", j.traceID, "topic", j.req.GetTopic(),
				"reason", reason, "last_reason", last, "detail", detail)
			publishDLQ(j.env, entry)
			j.tellClient(capv1.JobStatus_JOB_STATUS_FAILED, reason, detail)
		})
}

// markRunning records DISPATCHED → RUNNING and moves the deadline to the
// running timeout.
func (j *JobActor) markRunning(c actor.Context) {
	deadline, why := j.deadlineFor(core.StateRunning)
	j.transition(c, &store.Transition{Expect: store.Expect(core.StateDispatched),
		Path: []store.Hop{{To: core.StateRunning, Reason: core.ReasonStarted}}, Due: deadline.UnixMilli(),
		Fields: []string{"deadline", strconv.FormatInt(deadline.UnixMilli(), 10), "deadline_kind", string(why)}},
		nil, func(c actor.Context) {
			j.deadline, j.deadlineWhy = deadline, why
			j.waitWorker(c)
		})
}

func (j *JobActor) onResult(c actor.Context, m *Result) {
	res := m.Res
	if j.state != core.StateDispatched && j.state != core.StateRunning {
		j.env.Log.Info("result ignored: job is not running", "job_id", j.id, "trace_id", j.traceID,
			"state", j.state, "status", res.Status)
		j.env.Metrics.Absorbed.WithLabelValues("result").Inc()
		ack(m.Delivery)
		return
	}
	var to core.State
	var reason core.Reason
	switch res.Status {
	case capv1.JobStatus_JOB_STATUS_SUCCEEDED:
		to, reason = core.StateSucceeded, core.ReasonCompleted
	case capv1.JobStatus_JOB_STATUS_FAILED, capv1.JobStatus_JOB_STATUS_DENIED:
		to, reason = core.StateFailed, core.ReasonWorkerFailed
	case capv1.JobStatus_JOB_STATUS_FAILED_FATAL:
		to, reason = core.StateFailed, core.ReasonWorkerFailedFatal
	case capv1.JobStatus_JOB_STATUS_CANCELLED:
		to, reason = core.StateCancelled, core.ReasonWorkerCancelled
	case capv1.JobStatus_JOB_STATUS_TIMEOUT:
		to, reason = core.StateTimeout, core.ReasonWorkerTimeout
	default:
		// A non-terminal status is progress.
		j.acks = append(j.acks, m.Delivery)
		if j.state == core.StateRunning {
			j.ackAll()
			return
		}
		j.markRunning(c)
		return
	}
	fields := []string{"result_ptr", res.ResultPtr, "worker", res.WorkerId,
		"execution_ms", strconv.FormatInt(res.ExecutionMs, 10)}
	if res.ErrorCode != "" || res.ErrorMessage != "" {
		fields = append(fields, "error_code", res.ErrorCode, "error_message", res.ErrorMessage)
	}
	path := make([]store.Hop, 0, 2)
	if j.state == core.StateDispatched && to == core.StateSucceeded {
		// The worker ran it: record RUNNING even if no progress was sent.
		path = append(path, store.Hop{To: core.StateRunning, Reason: core.ReasonStarted})
	}
	j.acks = append(j.acks, m.Delivery)
	if to == core.StateSucceeded && j.env.Output != nil {
		j.checkOutput(c, m, path)
		return
	}
	path = append(path, store.Hop{To: to, Reason: reason})
	t := &store.Transition{Expect: store.Expect(core.StateDispatched, core.StateRunning), Path: path, Fields: fields}
	j.sagaRecord(t, to, reason)
	j.transition(c, t, nil, func(c actor.Context) {
		j.env.Log.Debug("job finished", "job_id", j.id, "trace_id", j.traceID, "topic", j.req.GetTopic(), "state", to)
	})
}

// sagaRecord adds a workflow step's saga bookkeeping to its terminal write,
// in the same atomic step: a succeeded step with a compensation records its
// template next to its workflow's stack and joins the stack; a step failed
// fatally triggers the workflow's rollback. The keys expire
// env.SagaRetention after the write (see saga.RecordStep), not with the
// step's record.
func (j *JobActor) sagaRecord(t *store.Transition, to core.State, reason core.Reason) {
	wf := j.req.GetWorkflowId()
	if wf == "" || j.req.GetLabels()[saga.LabelIsCompensation] == "true" {
		// A compensation is not a step of its workflow: it records nothing
		// and, failing, does not roll the workflow back again.
		return
	}
	now := time.Now().UnixMilli()
	switch {
	case to == core.StateSucceeded:
		tmpl := saga.Template(j.req)
		if tmpl == nil {
			return
		}
		raw, err := proto.Marshal(tmpl)
		if err != nil {
			return
		}
		saga.RecordStep(t, wf, j.id, j.req.GetTopic(), raw, now, j.env.SagaRetention)
	case reason == core.ReasonWorkerFailedFatal:
		saga.RecordTrigger(t, wf, now, j.env.SagaRetention)
	}
}

func resultFields(res *capv1.JobResult, ptr string) []string {
	f := []string{"result_ptr", ptr, "worker", res.WorkerId, "execution_ms", strconv.FormatInt(res.ExecutionMs, 10)}
	if res.ErrorCode != "" || res.ErrorMessage != "" {
		f = append(f, "error_code", res.ErrorCode, "error_message", res.ErrorMessage)
	}
	return f
}

// checkOutput runs the output policy's phase 1 (metadata) before a result
// is called SUCCEEDED. It may ask a remote checker or store a redacted copy,
// so it runs off the mailbox and its outcome comes back as a message.
func (j *JobActor) checkOutput(c actor.Context, m *Result, path []store.Hop) {
	j.opEpoch++
	j.busy = true
	ep, self, root, gate := j.opEpoch, c.Self(), j.env.Root, j.env.Output
	oreq := safety.OutputRequest(j.req, m.Res)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), PolicyTimeout)
		o := gate.Phase1(ctx, oreq)
		cancel()
		root.Send(self, &outputDone{epoch: ep, outcome: o, res: m, path: path})
	}()
}

// onOutput writes what phase 1 decided: OUTPUT_QUARANTINED (with a DLQ
// entry and an audit line), or SUCCEEDED with the (possibly redacted)
// result pointer — and then hands the content scan to the scan pool.
func (j *JobActor) onOutput(c actor.Context, m *outputDone) {
	o := m.outcome
	fields := append(resultFields(m.res.Res, o.ResultPtr), o.Fields()...)
	expect := store.Expect(core.StateDispatched, core.StateRunning)
	if o.Quarantine {
		entry := j.dlqEntry(core.ReasonOutputQuarantined, o.Reason, "")
		path := append(m.path, store.Hop{To: core.StateOutputQuarantined, Reason: core.ReasonOutputQuarantined})
		j.transition(c, &store.Transition{Expect: expect, Path: path, Fields: fields}, entry, func(c actor.Context) {
			j.env.Output.Metrics.Quarantined(safety.PhaseMeta)
			j.env.Log.Warn("audit: output quarantined", "job_id", j.id, "trace_id", j.traceID,
				"topic", j.req.GetTopic(), "phase", safety.PhaseMeta, "rule_id", o.RuleID, "reason", o.Reason)
			publishDLQ(j.env, entry)
			j.tellClient(capv1.JobStatus_JOB_STATUS_OUTPUT_QUARANTINED, core.ReasonOutputQuarantined, o.Reason)
		})
		return
	}
	reason := core.ReasonCompleted
	if o.Redacted {
		reason = core.ReasonOutputRedacted
	}
	path := append(m.path, store.Hop{To: core.StateSucceeded, Reason: reason})
	t := &store.Transition{Expect: expect, Path: path, Fields: fields}
	j.sagaRecord(t, core.StateSucceeded, reason)
	j.transition(c, t, nil, func(c actor.Context) {
		if !o.ContentChecked {
			j.scanContent(safety.OutputRequest(j.req, &capv1.JobResult{JobId: j.id, Status: m.res.Res.Status,
				ResultPtr: o.ResultPtr, WorkerId: m.res.Res.WorkerId, ArtifactPtrs: m.res.Res.ArtifactPtrs}))
		}
	})
}

// scanContent queues phase 2 for a SUCCEEDED job. The scan runs on the
// node's scan pool, not in an actor; if it finds something, the job is
// downgraded to OUTPUT_QUARANTINED only if it is still SUCCEEDED.
func (j *JobActor) scanContent(oreq *capv1.OutputCheckRequest) {
	env, id, trace, topic := j.env, j.id, j.traceID, j.req.GetTopic()
	ok := env.Scans.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), safety.OutputContentBudgetDefault)
		defer cancel()
		o := env.Output.Phase2(ctx, oreq)
		if !o.Quarantine {
			// Allowed — or redacted after release, which this node does not
			// apply: the original was already released (see NOTES.md).
			return
		}
		op := &store.Op{Kind: store.OpDowngrade, JobID: id, Node: env.NodeID,
			T: &store.Transition{Path: []store.Hop{{To: core.StateOutputQuarantined, Reason: core.ReasonOutputQuarantined}},
				Fields: o.Fields()}}
		done := make(chan *store.Result, 1)
		op.Done = func(r *store.Result) { done <- r }
		env.Writer.Submit(op)
		r := <-done
		if r.OK() {
			env.Output.Metrics.Quarantined(safety.PhaseContent)
			env.Log.Warn("audit: output quarantined after release", "job_id", id, "trace_id", trace, "topic", topic,
				"phase", safety.PhaseContent, "rule_id", o.RuleID, "reason", o.Reason)
		}
	})
	if !ok {
		env.Output.Metrics.Skipped(safety.PhaseContent, "scan_queue_full")
	}
}

// onWorkerLost re-dispatches a job whose worker was evicted before it
// started the job.
func (j *JobActor) onWorkerLost(c actor.Context, m *WorkerLost) {
	if !j.activated || j.state != core.StateDispatched || j.worker != m.WorkerID || j.startsOnDelivery {
		return
	}
	if j.env.Redispatch != nil && !j.env.Redispatch(j.req.GetTopic()) {
		return
	}
	j.env.Log.Info("worker lost; dispatching elsewhere", "job_id", j.id, "trace_id", j.traceID,
		"topic", j.req.GetTopic(), "worker_id", m.WorkerID)
	j.transition(c, &store.Transition{Expect: store.Expect(core.StateDispatched),
		Path: []store.Hop{{To: core.StateScheduled, Reason: core.ReasonWorkerLost}}, Due: -1,
		Fields: []string{"lost_worker", m.WorkerID}}, nil, func(c actor.Context) { j.askRouter(c) })
}

// cancelUnwritten cancels a fresh job waiting for capacity within its
// grace: it leaves the queue and is created CANCELLED, in one write.
func (j *JobActor) cancelUnwritten(c actor.Context, m *Cancel) {
	j.disarm()
	j.withdraw(c)
	j.leaveGrace()
	j.acks = append(j.acks, m.Delivery)
	j.apply(c, &store.Transition{Expect: store.Expect(core.StatePending),
		Path: []store.Hop{{To: core.StateScheduled, Reason: j.capReason},
			{To: core.StateCancelled, Reason: core.ReasonCancelRequested}},
		Fields: []string{"cancel_reason", m.C.GetReason(), "cancelled_by", m.C.GetRequestedBy()}}, nil,
		func(c actor.Context) {
			j.env.Log.Info("job cancelled while waiting for capacity", "job_id", j.id, "trace_id", j.traceID,
				"topic", j.req.GetTopic(), "by", m.C.GetRequestedBy())
			j.tellClient(capv1.JobStatus_JOB_STATUS_CANCELLED, core.ReasonCancelRequested, m.C.GetReason())
		})
}

// onCancel moves a live job to CANCELLED. Workers listen on sys.job.cancel
// themselves, so a cancel that came from the bus has already reached the
// worker; the node publishes one only for the cancels it decides itself
// (timeouts).
func (j *JobActor) onCancel(c actor.Context, m *Cancel) {
	if j.state.Terminal() {
		j.env.Metrics.Absorbed.WithLabelValues("cancel").Inc()
		ack(m.Delivery)
		return
	}
	j.acks = append(j.acks, m.Delivery)
	j.transition(c, &store.Transition{Expect: store.Expect(j.state),
		Path:   []store.Hop{{To: core.StateCancelled, Reason: core.ReasonCancelRequested}},
		Fields: []string{"cancel_reason", m.C.GetReason(), "cancelled_by", m.C.GetRequestedBy()}}, nil,
		func(c actor.Context) {
			j.env.Log.Info("job cancelled", "job_id", j.id, "trace_id", j.traceID, "topic", j.req.GetTopic(),
				"by", m.C.GetRequestedBy())
			j.tellClient(capv1.JobStatus_JOB_STATUS_CANCELLED, core.ReasonCancelRequested, m.C.GetReason())
		})
}

// transition writes t (each hop checked against the legal table first) and,
// once it is durable, updates memory, acks pending deliveries and runs k.
// A fenced write means another owner has the job: the actor stops at once.
func (j *JobActor) transition(c actor.Context, t *store.Transition, dlq *store.DLQEntry, k func(c actor.Context)) {
	from := j.state
	for _, h := range t.Path {
		if !Legal(from, h.To) {
			err := &ErrIllegalTransition{From: from, To: h.To}
			j.env.Log.Error("refusing transition", "job_id", j.id, "trace_id", j.traceID, "err", err)
			j.ackAll()
			return
		}
		from = h.To
	}
	t.Op = newOpID()
	op := &store.Op{Kind: store.OpTransition, JobID: j.id, Node: j.env.NodeID, LockValue: j.lockValue, T: t, DLQ: dlq}
	active := func(s core.State) bool { return s == core.StateDispatched || s == core.StateRunning }
	freesSlot := j.admitted && active(j.state) && !active(t.Final())
	if freesSlot {
		op.TenantRelease = j.env.Keys.TenantActive(safety.TenantOf(j.req))
	}
	j.write(c, op, func(c actor.Context, r *store.Result) {
		if r.Step == store.StepConflict && r.Before == t.Final() && r.LastOp == t.Op {
			// An earlier try of this write landed (its reply was lost):
			// carry on as if this one had.
			r.Step = store.StepOK
		}
		switch r.Step {
		case store.StepOK:
			if freesSlot {
				j.admitted = false
			}
			if active(j.state) && (t.Final() == core.StateCancelled || t.Final() == core.StateTimeout) {
				// Ended here, but the worker may still be running it (a
				// stock worker hears no cancel): its slot stays counted
				// until the worker's own answer or its heartbeats show the
				// job gone (router.Released.Linger).
				c.Send(j.env.Router, &router.Released{WorkerID: j.worker, JobID: j.id, Done: true, Linger: true})
			} else if active(j.state) && !active(t.Final()) {
				j.release(c, true) // the worker is done with it
			} else if j.state == core.StateDispatched && t.Final() == core.StateRunning {
				j.release(c, false) // started: no longer waiting on the worker to take it
			}
			if j.env.Log.Enabled(context.Background(), slog.LevelDebug) {
				j.env.Log.Debug("job state", "job_id", j.id, "trace_id", j.traceID, "topic", j.req.GetTopic(),
					"from", j.state, "to", t.Final(), "reason", t.Path[len(t.Path)-1].Reason)
			}
			j.state = t.Final()
			j.lastReason = t.Path[len(t.Path)-1].Reason
			if !t.LockKept() {
				j.env.Renewer.Forget(j.id, j.lockValue)
				j.lockValue = ""
			}
			if j.state.Terminal() {
				j.env.Metrics.Completed.WithLabelValues(string(j.state)).Inc()
			}
		case store.StepFenced:
			j.env.Metrics.Fenced.Inc()
			j.lockValue = ""
			for _, d := range j.acks {
				nak(d, time.Second)
			}
			j.acks = j.acks[:0]
			if r.Before == "" && j.req != nil {
				// Nobody holds the lock: it expired (renewals failed) or
				// Redis lost its data. Nothing else owns the job, so take it
				// again; the events just handed back will be offered again.
				j.env.Log.Warn("job lock vanished; re-activating", "job_id", j.id, "trace_id", j.traceID,
					"state", j.state)
				j.recover(c)
				return
			}
			j.env.Log.Warn("transition refused: job owned by another node", "job_id", j.id,
				"trace_id", j.traceID, "to", t.Final(), "owner", r.Before)
			j.finish(c)
			return
		default:
			j.env.Log.Error("transition conflict", "job_id", j.id, "trace_id", j.traceID,
				"to", t.Final(), "status", r.Step, "state_in_redis", r.Before)
			if r.Before.Valid() {
				j.state = r.Before
			}
			j.ackAll()
			j.finish(c)
			return
		}
		j.ackAll()
		k(c)
		if (j.state.Terminal() || t.Release) && !j.done {
			j.finish(c)
		}
	})
}

// write hands op to the store writer. The continuation runs inside Receive
// once the op is done. A Redis error leaves the state unknown: the actor does
// nothing, keeps its deliveries, and tries the same op again after
// StateRetryDelay (fail closed).
func (j *JobActor) write(c actor.Context, op *store.Op, k func(c actor.Context, r *store.Result)) {
	j.opEpoch++
	j.busy = true
	ep, self, root := j.opEpoch, c.Self(), j.env.Root
	j.then = func(c actor.Context, r *store.Result) {
		if r.Err != nil {
			j.env.Metrics.FailClosed.WithLabelValues(j.req.GetTopic()).Inc()
			j.env.Log.Warn("job state unavailable; retrying", "job_id", j.id, "trace_id", j.traceID, "err", r.Err)
			for _, d := range j.acks {
				if d != nil {
					_ = d.InProgress()
				}
			}
			j.retryOp(c, op, k)
			return
		}
		k(c, r)
	}
	op.Done = func(r *store.Result) { root.Send(self, &storeDone{epoch: ep, res: r}) }
	j.env.Writer.Submit(op)
}

// retryOp repeats op after StateRetryDelay; meanwhile the actor stays busy,
// so no other event acts on a state it does not know.
func (j *JobActor) retryOp(c actor.Context, op *store.Op, k func(c actor.Context, r *store.Result)) {
	j.opEpoch++
	j.busy = true
	ep, self, root := j.opEpoch, c.Self(), j.env.Root
	j.then = func(c actor.Context, _ *store.Result) { j.write(c, op, k) }
	time.AfterFunc(StateRetryDelay, func() { root.Send(self, &storeDone{epoch: ep, res: &store.Result{}}) })
}

// arm sets the job's one wheel timer to at (replacing any other).
func (j *JobActor) arm(c actor.Context, at time.Time) {
	j.disarm()
	j.timerEpoch++
	j.timer = j.env.Wheel.Schedule(time.Until(at), c.Self(), j.timerEpoch)
}

func (j *JobActor) disarm() {
	if j.timer != nil {
		j.env.Wheel.Cancel(j.timer)
		j.timer = nil
	}
	j.timerEpoch++
}

// finish ends the actor's work: its supervisor will stop it.
func (j *JobActor) finish(c actor.Context) {
	if j.done {
		return
	}
	j.done = true
	j.disarm()
	j.withdraw(c)
	j.dropPick(c)
	j.leaveGrace()
	if j.lockValue != "" {
		j.env.Renewer.Forget(j.id, j.lockValue)
	}
	if j.state == core.StateDispatched && !j.parked {
		j.release(c, false)
	}
	if j.state.Terminal() {
		j.ackAfterDone = true
	}
	parkedDispatched := j.parked && j.state == core.StateDispatched
	var again []interface{}
	// Anything still deferred is absorbed by the done actor — except the
	// progress and eviction of a job parked in DISPATCHED, which reached it
	// while it was parking: they go to the job's next actor.
	for _, m := range j.deferred {
		switch m.(type) {
		case *Progress, *WorkerLost:
			if parkedDispatched {
				again = append(again, m)
				continue
			}
		}
		j.absorb(m)
	}
	j.deferred = nil
	c.Send(c.Parent(), &Finished{JobID: j.id, PID: c.Self(), Parked: parkedDispatched, Redeliver: again})
}

func slotFlag(admitted bool) string {
	if admitted {
		return "1"
	}
	return "0"
}

// newOpID identifies one write (see store.Transition.Op): unique enough
// that a retried write recognises itself and nothing else.
func newOpID() string {
	return strconv.FormatUint(rand.Uint64(), 36)
}

// release tells the router the job no longer waits for its worker to start
// it, and with done, that it no longer occupies the worker at all.
func (j *JobActor) release(c actor.Context, done bool) {
	if j.worker != "" {
		c.Send(j.env.Router, &router.Released{WorkerID: j.worker, JobID: j.id, Done: done})
	}
}

// onStopping releases the lock of a job still in flight when the actor is
// stopped from outside (node shutdown), so another replica can adopt it at
// once instead of waiting for the lock to expire.
//
// A job waiting for capacity has no due time (see waitCapacity): it is
// made due now as the lock goes, so the next replica's due poller places it.
func (j *JobActor) onStopping(c actor.Context) {
	j.disarm()
	j.stopWaitingPolicy()
	queued := j.queued
	j.withdraw(c)
	j.dropPick(c)
	j.leaveGrace()
	if j.lockValue != "" && !j.done {
		j.env.Renewer.Forget(j.id, j.lockValue)
		op := &store.Op{Kind: store.OpRelease, JobID: j.id, LockValue: j.lockValue, Done: func(*store.Result) {}}
		if queued && j.state == core.StateScheduled {
			op.Kind = store.OpTransition
			op.T = &store.Transition{Expect: store.Expect(core.StateScheduled),
				Path: []store.Hop{{To: core.StateScheduled, Reason: j.capReason}}, Due: time.Now().UnixMilli(),
				Release: true, Op: newOpID()}
		}
		j.env.Writer.Submit(op)
	}
	j.returnDeliveries()
}

// returnDeliveries hands every un-acked delivery back to JetStream.
func (j *JobActor) returnDeliveries() {
	for _, d := range j.acks {
		nak(d, 0)
	}
	j.acks = nil
	for _, m := range j.deferred {
		switch m := m.(type) {
		case *Submit:
			nak(m.Delivery, 0)
		case *Result:
			nak(m.Delivery, 0)
		case *Cancel:
			nak(m.Delivery, 0)
		}
	}
	j.deferred = nil
}

func (j *JobActor) ackAll() {
	for _, d := range j.acks {
		ack(d)
	}
	j.acks = j.acks[:0]
}

func (j *JobActor) dlqEntry(reason core.Reason, detail string, last core.Reason) *store.DLQEntry {
	return &store.DLQEntry{JobID: j.id, Topic: j.req.GetTopic(), Reason: reason, Message: detail,
		LastReason: last, TraceID: j.traceID, Subject: j.env.Subjects.Submit}
}

func ack(d Delivery) {
	if d != nil {
		_ = d.Ack()
	}
}

func nak(d Delivery, delay time.Duration) {
	if d != nil {
		_ = d.NakWithDelay(delay)
	}
}

// publishDLQ announces a DLQ entry on sys.job.dlq as CAP does: a JobResult
// with the failure status, error_code = reason, error_message = detail.
func publishDLQ(env *Env, e *store.DLQEntry) {
	data, err := bus.EncodeResult(e.TraceID, env.NodeID, &capv1.JobResult{JobId: e.JobID,
		Status: capv1.JobStatus_JOB_STATUS_FAILED, ErrorCode: string(e.Reason), ErrorMessage: e.Message})
	if err == nil {
		err = env.Publish(env.Subjects.DLQ, data)
	}
	if err != nil {
		env.Log.Warn("dlq publish failed", "job_id", e.JobID, "err", err)
	}
}

// PublishDLQ is publishDLQ for intake.
func PublishDLQ(env *Env, e *store.DLQEntry) { publishDLQ(env, e) }

// TraceState is what the mailbox tracer (jobtrace) records around every
// message: the job's state and the reason of its last change.
func (j *JobActor) TraceState() (string, string) { return string(j.state), string(j.lastReason) }

// TraceOrigin names the sender of messages that arrive without a PID
// (everything sent with Send), for the mailbox trace.
func TraceOrigin(msg interface{}) string {
	switch msg.(type) {
	case *Submit:
		return "intake:submit"
	case *Result:
		return "intake:result"
	case *Cancel:
		return "intake:cancel"
	case *Progress:
		return "intake:progress"
	case *Wake:
		return "due-poller"
	case *WorkerLost:
		return "router:evict"
	case *storeDone:
		return "store-writer"
	case *router.PickReply:
		return "router"
	case *wake:
		return "wheel"
	case *lockLost:
		return "lock-renewer"
	case *policyDone:
		return "policy"
	case *outputDone:
		return "output-policy"
	}
	return ""
}
