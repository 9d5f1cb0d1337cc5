package actors

import (
	"context"
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
//     error means "unknown", and the actor waits and asks again.
//   - A request is published to a worker only after DISPATCHED is durable, so
//     a stale owner can never dispatch a job a second time.
//   - A JetStream message is acked only after its effect is durable; until
//     then a crash means redelivery, and redelivery is harmless (a duplicate
//     submit of a live job changes nothing; a result for a finished job is
//     absorbed).
//
// What it never does: block its mailbox on the network. Redis work goes
// through the store.Writer and comes back as a storeDone message; the router
// answers by message; timers send wake messages.
//
// Lifecycle: spawned by its shard supervisor on the first Submit or Result
// for the job id; activation takes the lock and reads (or creates) the record;
// the actor drives the job until a terminal state or until it learns another
// node owns the job, then tells the supervisor it is Finished.
type JobActor struct {
	env *Env // shared, immutable

	// Owned by the actor; touched only inside Receive.
	id        string
	activated bool
	done      bool
	state     core.State
	fence     int64
	lockValue string
	req       *capv1.JobRequest
	traceID   string
	worker    string
	subject   string
	attempts  int
	firstFail time.Time // first permanent routing error, for the grace window

	// epoch numbers the one outstanding asynchronous step (a store op, a
	// router question or a timer). A reply with another epoch answers a
	// question the actor no longer asks and is dropped.
	epoch uint64
	// busy is true while a store op or a router question is outstanding;
	// events arriving meanwhile wait in deferred, in order.
	busy     bool
	deferred []interface{}
	// then continues after the outstanding store op.
	then func(c actor.Context, r *store.Result)
	// acks are deliveries to acknowledge once the current op is durable.
	acks []Delivery
	// naks are deliveries to hand back to JetStream when this actor stops
	// without handling them (another node owns the job).
	timer *time.Timer
}

// NewJobProps returns the props every job actor of a node is spawned with.
// The actor learns its job id from its name (see jobIDFromPID).
func NewJobProps(env *Env) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &JobActor{env: env} })
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
	case *actor.Stopping:
		j.stopTimer()
		if j.lockValue != "" && !j.state.Terminal() && !j.done {
			// Stopped while owning a live job (shutdown): give the lock up
			// so another replica can adopt at once.
			j.env.Renewer.Forget(j.id, j.lockValue)
			j.env.Writer.Submit(&store.Op{Kind: store.OpRelease, JobID: j.id, LockValue: j.lockValue,
				Done: func(*store.Result) {}})
		}
	case *actor.Restarting, *actor.Stopped:
	case *storeDone:
		if m.epoch != j.epoch || !j.busy {
			return
		}
		j.busy = false
		k := j.then
		j.then = nil
		k(c, m.res)
		j.drain(c)
	case *router.PickReply:
		if m.Epoch != j.epoch || !j.busy {
			return
		}
		j.busy = false
		j.onPick(c, m)
		j.drain(c)
	case *wake:
		if m.epoch != j.epoch || j.busy || j.done {
			return
		}
		j.timer = nil
		j.advance(c)
		j.drain(c)
	case *lockLost:
		if m.lockValue == j.lockValue && !j.done {
			j.env.Log.Warn("job lock lost; stopping without side effects", "job_id", j.id, "trace_id", j.traceID)
			j.lockValue = ""
			j.finish(c)
		}
	case *Inspect:
		c.Respond(&Snapshot{JobID: j.id, State: j.state, Fence: j.fence, Attempts: j.attempts,
			Worker: j.worker, Subject: j.subject, Done: j.done})
	default:
		if j.busy {
			j.deferred = append(j.deferred, m)
			return
		}
		j.handle(c, m)
	}
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

// handle processes one input event (Submit, Result, Progress).
func (j *JobActor) handle(c actor.Context, m interface{}) {
	if j.done {
		j.absorb(m)
		return
	}
	switch m := m.(type) {
	case *Submit:
		if j.traceID == "" {
			j.traceID = m.TraceID
		}
		if !j.activated {
			if j.req == nil {
				j.req = m.Req
			}
			j.acks = append(j.acks, m.Delivery)
			j.activate(c, true)
			return
		}
		// A duplicate submit of a live job: nothing changes.
		ack(m.Delivery)
	case *Result:
		if j.traceID == "" {
			j.traceID = m.TraceID
		}
		if !j.activated {
			j.deferred = append([]interface{}{m}, j.deferred...)
			j.activate(c, false)
			return
		}
		j.onResult(c, m)
	case *Progress:
		if j.activated && j.state == core.StateDispatched {
			j.transition(c, []store.Step{{Expect: store.Expect(core.StateDispatched), To: core.StateRunning,
				Reason: core.ReasonStarted}}, nil, func(c actor.Context, r *store.Result) {})
		}
	}
}

// absorb handles an event that reaches the actor after it finished.
func (j *JobActor) absorb(m interface{}) {
	var d Delivery
	switch m := m.(type) {
	case *Submit:
		d = m.Delivery
	case *Result:
		d = m.Delivery
	default:
		return
	}
	if j.state.Terminal() {
		ack(d) // duplicate for a finished job: absorbed
		return
	}
	// Another node owns the job: let JetStream offer the message again.
	nak(d, time.Second)
}

// activate takes the job's lock and learns its state.
func (j *JobActor) activate(c actor.Context, create bool) {
	op := &store.Op{Kind: store.OpActivate, JobID: j.id, Node: j.env.NodeID, Create: create, TraceID: j.traceID}
	if create && j.req != nil {
		op.Topic = j.req.Topic
		op.Tenant = safety.TenantOf(j.req)
		op.Request, _ = proto.Marshal(j.req)
	}
	j.write(c, op, func(c actor.Context, r *store.Result) {
		switch r.Status {
		case store.ActivateCreated, store.ActivateAdopted:
			j.activated = true
			j.state, j.fence = r.State, r.Fence
			j.lockValue = store.LockValue(j.env.NodeID, r.Fence)
			self, root, lv := c.Self(), j.env.Root, j.lockValue
			j.env.Renewer.Hold(j.id, lv, func() { root.Send(self, &lockLost{lockValue: lv}) })
			if r.Status == store.ActivateAdopted {
				j.worker, j.subject = r.Worker, r.Subject
				if len(r.Request) > 0 {
					req := &capv1.JobRequest{}
					if err := proto.Unmarshal(r.Request, req); err == nil {
						j.req = req
					}
				}
			}
			j.ackAll()
			j.advance(c)
		case store.ActivateTerminal:
			j.state = r.State
			j.ackAll()
			j.finish(c)
		case store.ActivateBusy:
			// Another node owns the job. Submits are duplicates of a live job;
			// results must reach the owner, so they go back to JetStream.
			j.state = r.State
			j.ackAll()
			j.finish(c)
		case store.ActivateNotFound:
			j.unknownJob(c)
		}
	})
}

// unknownJob dead-letters the results that arrived for a job with no record.
func (j *JobActor) unknownJob(c actor.Context) {
	var pending []interface{}
	for _, m := range j.deferred {
		if _, ok := m.(*Submit); ok {
			pending = append(pending, m)
			continue
		}
		if r, ok := m.(*Result); ok {
			j.acks = append(j.acks, r.Delivery)
		}
	}
	j.deferred = pending
	entry := &store.DLQEntry{JobID: j.id, Reason: core.ReasonUnknownJob, TraceID: j.traceID,
		Message: "result for a job that has no record", Subject: j.env.Subjects.Result}
	j.write(c, &store.Op{Kind: store.OpDLQ, JobID: j.id, DLQ: entry}, func(c actor.Context, r *store.Result) {
		j.env.Log.Warn("result for unknown job dead-lettered", "job_id", j.id, "trace_id", j.traceID,
			"reason", core.ReasonUnknownJob)
		publishDLQ(j.env, entry)
		j.ackAll()
		if len(j.deferred) > 0 {
			return // a submit is waiting: it will activate with create
		}
		j.done = true
		c.Send(c.Parent(), &Finished{JobID: j.id, PID: c.Self()})
	})
}

// advance does the next thing the job's state calls for.
func (j *JobActor) advance(c actor.Context) {
	switch j.state {
	case core.StatePending:
		j.checkPolicy(c)
	case core.StateScheduled:
		j.askRouter(c)
	case core.StateDispatched, core.StateRunning, core.StateApprovalRequired:
		// Waiting for the worker (or a human); nothing to do until an event.
	default:
		if j.state.Terminal() {
			j.finish(c)
		}
	}
}

// checkPolicy asks the input policy about a PENDING job.
func (j *JobActor) checkPolicy(c actor.Context) {
	if j.req == nil {
		j.fail(c, core.ReasonInvalidRequest, "job record has no request", "")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	dec, err := j.env.Policy.Check(ctx, safety.CheckRequest(j.req))
	cancel()
	if err != nil {
		j.retryLater(c, core.ReasonSafetyUnavailable)
		return
	}
	switch dec.Decision {
	case capv1.DecisionType_DECISION_TYPE_ALLOW, capv1.DecisionType_DECISION_TYPE_ALLOW_WITH_CONSTRAINTS:
		j.askRouter(c)
	case capv1.DecisionType_DECISION_TYPE_REQUIRE_HUMAN:
		j.transition(c, []store.Step{{Expect: store.Expect(core.StatePending), To: core.StateApprovalRequired,
			Reason: core.ReasonApprovalRequired, Fields: []string{"rule_id", dec.RuleId, "policy_reason", dec.Reason}}},
			nil, func(c actor.Context, r *store.Result) {})
	case capv1.DecisionType_DECISION_TYPE_THROTTLE:
		j.retryLater(c, core.ReasonSafetyThrottled)
	default: // DENY and anything unknown
		j.deny(c, dec)
	}
}

func (j *JobActor) deny(c actor.Context, dec *capv1.PolicyCheckResponse) {
	entry := j.dlqEntry(core.ReasonSafetyDenied, dec.Reason, "")
	j.transition(c, []store.Step{{Expect: store.Expect(core.StatePending, core.StateScheduled), To: core.StateDenied,
		Reason: core.ReasonSafetyDenied, Terminal: true,
		Fields: []string{"rule_id", dec.RuleId, "policy_reason", dec.Reason}}}, entry,
		func(c actor.Context, r *store.Result) {
			j.env.Log.Info("job denied", "job_id", j.id, "trace_id", j.traceID, "topic", j.req.GetTopic(),
				"rule_id", dec.RuleId, "reason", dec.Reason)
			publishDLQ(j.env, entry)
		})
}

// askRouter asks for a worker; the answer arrives as a *router.PickReply.
func (j *JobActor) askRouter(c actor.Context) {
	j.epoch++
	j.busy = true
	c.Request(j.env.Router, &router.PickRequest{JobID: j.id, Req: j.req, Epoch: j.epoch})
}

func (j *JobActor) onPick(c actor.Context, p *router.PickReply) {
	if p.Reason != "" {
		j.placementFailed(c, p)
		return
	}
	steps := make([]store.Step, 0, 2)
	if j.state == core.StatePending {
		steps = append(steps, store.Step{Expect: store.Expect(core.StatePending), To: core.StateScheduled,
			Reason: core.ReasonAllowed})
	}
	j.attempts++
	steps = append(steps, store.Step{Expect: store.Expect(core.StateScheduled), To: core.StateDispatched,
		Reason: core.ReasonDispatched,
		Fields: []string{"worker", p.WorkerID, "subj", p.Subject, "attempts", strconv.Itoa(j.attempts)}})
	j.transition(c, steps, nil, func(c actor.Context, r *store.Result) {
		j.worker, j.subject = p.WorkerID, p.Subject
		data, err := bus.EncodeRequest(j.traceID, j.env.NodeID, j.req)
		if err == nil {
			err = j.env.Publish(p.Subject, data)
		}
		if err != nil {
			j.env.Log.Warn("dispatch publish failed", "job_id", j.id, "trace_id", j.traceID, "subject", p.Subject, "err", err)
			j.transition(c, []store.Step{{Expect: store.Expect(core.StateDispatched), To: core.StateScheduled,
				Reason: core.ReasonDispatchFailed}}, nil, func(c actor.Context, r *store.Result) {
				j.retryLater(c, core.ReasonDispatchFailed)
			})
		}
	})
}

// permanent reports whether a routing reason will not fix itself without a
// config change.
func permanent(r core.Reason) bool {
	switch r {
	case core.ReasonTopicUnmapped, core.ReasonPreferredPoolUnmapped, core.ReasonRequiresUnsatisfied:
		return true
	}
	return false
}

func (j *JobActor) placementFailed(c actor.Context, p *router.PickReply) {
	if permanent(p.Reason) {
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
	// Record the attempt and its reason (PENDING → SCHEDULED on the first,
	// SCHEDULED → SCHEDULED after), then wait.
	j.transition(c, []store.Step{{Expect: store.Expect(core.StatePending, core.StateScheduled), To: core.StateScheduled,
		Reason: p.Reason, Fields: []string{"attempts", strconv.Itoa(j.attempts), "last_reason", string(p.Reason)}}},
		nil, func(c actor.Context, r *store.Result) {
			j.sleep(c, j.env.Backoff(j.attempts))
		})
}

// retryLater waits and advances again without a state change.
func (j *JobActor) retryLater(c actor.Context, why core.Reason) {
	j.attempts++
	if j.attempts >= j.env.MaxSchedulingAttempts {
		j.fail(c, core.ReasonMaxSchedulingRetries, "gave up after "+strconv.Itoa(j.attempts)+" attempts", why)
		return
	}
	j.env.Log.Debug("job retry", "job_id", j.id, "trace_id", j.traceID, "reason", why, "attempt", j.attempts)
	j.sleep(c, j.env.Backoff(j.attempts))
}

// fail moves the job to FAILED with reason, dead-letters it, and finishes.
func (j *JobActor) fail(c actor.Context, reason core.Reason, detail string, last core.Reason) {
	entry := j.dlqEntry(reason, detail, last)
	fields := []string{"error_code", string(reason), "error_message", detail}
	if last != "" {
		fields = append(fields, "last_reason", string(last))
	}
	j.transition(c, []store.Step{{Expect: store.Expect(core.StatePending, core.StateScheduled,
		core.StateApprovalRequired), To: core.StateFailed, Reason: reason, Terminal: true, Fields: fields}}, entry,
		func(c actor.Context, r *store.Result) {
			j.env.Log.Warn("job failed", "job_id", j.id, "trace_id", j.traceID, "topic", j.req.GetTopic(),
				"reason", reason, "last_reason", last, "detail", detail)
			publishDLQ(j.env, entry)
		})
}

func (j *JobActor) onResult(c actor.Context, m *Result) {
	res := m.Res
	if j.state != core.StateDispatched && j.state != core.StateRunning {
		j.env.Log.Info("result ignored: job is not running", "job_id", j.id, "trace_id", j.traceID,
			"state", j.state, "status", res.Status)
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
		j.transition(c, []store.Step{{Expect: store.Expect(core.StateDispatched), To: core.StateRunning,
			Reason: core.ReasonStarted}}, nil, func(c actor.Context, r *store.Result) {})
		return
	}
	fields := []string{"result_ptr", res.ResultPtr, "worker", res.WorkerId,
		"execution_ms", strconv.FormatInt(res.ExecutionMs, 10)}
	if res.ErrorCode != "" || res.ErrorMessage != "" {
		fields = append(fields, "error_code", res.ErrorCode, "error_message", res.ErrorMessage)
	}
	steps := make([]store.Step, 0, 2)
	if j.state == core.StateDispatched && to == core.StateSucceeded {
		// The worker ran it: record RUNNING even if no progress was sent.
		steps = append(steps, store.Step{Expect: store.Expect(core.StateDispatched), To: core.StateRunning,
			Reason: core.ReasonStarted})
	}
	steps = append(steps, store.Step{Expect: store.Expect(core.StateDispatched, core.StateRunning), To: to,
		Reason: reason, Terminal: true, Fields: fields})
	j.acks = append(j.acks, m.Delivery)
	j.transition(c, steps, nil, func(c actor.Context, r *store.Result) {
		j.env.Log.Debug("job finished", "job_id", j.id, "trace_id", j.traceID, "topic", j.req.GetTopic(), "state", to)
	})
}

// transition writes steps (each checked against the legal table first) and,
// once they are durable, updates memory, acks pending deliveries and runs k.
// A fenced write means another owner has the job: the actor stops at once.
func (j *JobActor) transition(c actor.Context, steps []store.Step, dlq *store.DLQEntry,
	k func(c actor.Context, r *store.Result)) {
	from := j.state
	for _, s := range steps {
		if !Legal(from, s.To) {
			err := &ErrIllegalTransition{From: from, To: s.To}
			j.env.Log.Error("refusing transition", "job_id", j.id, "trace_id", j.traceID, "err", err)
			return
		}
		from = s.To
	}
	op := &store.Op{Kind: store.OpTransition, JobID: j.id, Node: j.env.NodeID, LockValue: j.lockValue,
		Steps: steps, DLQ: dlq}
	j.write(c, op, func(c actor.Context, r *store.Result) {
		for i, sr := range r.Steps {
			switch sr.Status {
			case store.StepOK:
				j.state = steps[i].To
			case store.StepFenced:
				j.env.Log.Warn("transition refused: job owned by another node", "job_id", j.id,
					"trace_id", j.traceID, "to", steps[i].To)
				j.lockValue = ""
				j.naks()
				j.finish(c)
				return
			default:
				j.env.Log.Error("transition conflict", "job_id", j.id, "trace_id", j.traceID,
					"to", steps[i].To, "status", sr.Status, "state_in_redis", sr.Before)
				if sr.Before.Valid() {
					j.state = sr.Before
				}
				j.ackAll()
				j.finish(c)
				return
			}
		}
		j.ackAll()
		k(c, r)
		if j.state.Terminal() && !j.done {
			j.finish(c)
		}
	})
}

// write hands op to the store writer. The continuation runs inside Receive
// once the op is done. A Redis error leaves the state unknown: the actor does
// nothing, keeps its deliveries, and tries the same op again after
// StateRetryDelay (fail closed).
func (j *JobActor) write(c actor.Context, op *store.Op, k func(c actor.Context, r *store.Result)) {
	j.epoch++
	j.busy = true
	ep, self, root := j.epoch, c.Self(), j.env.Root
	j.then = func(c actor.Context, r *store.Result) {
		if r.Err != nil {
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

func (j *JobActor) retryOp(c actor.Context, op *store.Op, k func(c actor.Context, r *store.Result)) {
	j.epoch++
	j.busy = true
	ep, self, root := j.epoch, c.Self(), j.env.Root
	j.then = func(c actor.Context, _ *store.Result) { j.write(c, op, k) }
	j.timer = time.AfterFunc(StateRetryDelay, func() { root.Send(self, &storeDone{epoch: ep, res: &store.Result{}}) })
}

// sleep arms the job's one timer; when it fires the job advances again.
func (j *JobActor) sleep(c actor.Context, d time.Duration) {
	j.stopTimer()
	j.epoch++
	ep, self, root := j.epoch, c.Self(), j.env.Root
	j.timer = time.AfterFunc(d, func() { root.Send(self, &wake{epoch: ep}) })
}

func (j *JobActor) stopTimer() {
	if j.timer != nil {
		j.timer.Stop()
		j.timer = nil
	}
}

// finish ends the actor's work: its supervisor will stop it.
func (j *JobActor) finish(c actor.Context) {
	if j.done {
		return
	}
	j.done = true
	j.stopTimer()
	if j.lockValue != "" {
		j.env.Renewer.Forget(j.id, j.lockValue)
	}
	// Anything still deferred is absorbed by the done actor.
	for _, m := range j.deferred {
		j.absorb(m)
	}
	j.deferred = nil
	c.Send(c.Parent(), &Finished{JobID: j.id, PID: c.Self()})
}

func (j *JobActor) ackAll() {
	for _, d := range j.acks {
		ack(d)
	}
	j.acks = j.acks[:0]
}

func (j *JobActor) naks() {
	for _, d := range j.acks {
		nak(d, time.Second)
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
