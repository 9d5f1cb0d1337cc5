package jobactor

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/internal/outputgate"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/tracing"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// JobActor owns one job while it is in flight: one supervised actor per
// in-flight job, the only writer of the job's state while it holds the
// job's Redis lock.
//
// It is a thin shell around the job's decision core (package lifecycle),
// where every rule of a job's life lives: it feeds each message in as an
// event, with the facts of the moment (the time, a fresh write id, ...),
// and carries out the effects the core returns, in order — store writes,
// publishes, router messages, timers, acks. The answers to its
// asynchronous steps (a write's outcome, the router's pick, the policy's
// decision) come back as messages and go into the core as events too.
//
// What it never does: block its mailbox on the network. Redis work goes
// through the store.Writer; the router answers by message; remote policy
// checks and output checks run in goroutines; timers live on the node's
// shared Wheel.
//
// Lifecycle: spawned by its shard supervisor on the first event for the job
// id; the core activates the job (takes the lock, reads or creates the
// record) and drives it until a terminal state, a passivating wait
// (approval), the discovery that another node owns the job, or parking;
// then the actor tells the supervisor it is Finished. Parking (see
// lifecycle.Job.park): the actor stops and the node keeps only the lock,
// through its node lease, and its router's record of the dispatch; the next
// event for the job spawns a fresh actor that activates it from its record.
type JobActor struct {
	env *Env // shared, immutable
	id  string
	job *lifecycle.Job
	// timer is the job's one timer on the node's wheel.
	timer TimerRef
	// trace is the job's OpenTelemetry spans (nil: tracing off); see
	// tracing.go in this package.
	trace *jobSpans
	// waitingKey: the concurrency key the job waits on among
	// Env.KeyWaiters ("": none), to leave when the actor stops.
	waitingKey string
	// started: the actor has had its first event; admitting: that event
	// was a submit, and the job counts in Env.Admitting until it is
	// dispatched, written as waiting, or its actor finishes or stops.
	started, admitting bool
	// touching: the Toucher keeps deliveries of the job's wait (Add, not
	// yet Remove).
	touching bool
	// held is the renewer's entry for the lock the job's core holds (the
	// last Hold's; nil: none): the actor's Forget and the writes it
	// submits (store.Op.Held) reach it without a look-up.
	held *store.HeldLock
	// wop is the store op carrying the core's last answered write (see
	// writeOp): a retry of the same write (Write.Retry) submits the same
	// store op again, so the store writes the same DLQ outbox entry (see
	// store.Op); any other write refills it.
	wop *writeOp
	// stamp holds stampDispatch's entries (no slice allocated per dispatch).
	stamp [4]string
	// allowAll is safety.AllowAll's answer to the job's last check, fed
	// back at once (askPolicy): the core reads it in that step and keeps
	// no pointer to it.
	allowAll lifecycle.PolicyDone
	// fin is the actor's first Finished, sent to its shard (finSent).
	fin     Finished
	finSent bool
	// self is the actor's PID, set at its first start and never again:
	// LockLost reads it on the lock renewer's goroutine.
	self *actor.PID
}

// LockLost tells the job, from the lock renewer's goroutine, that its lock
// of value could not be kept (store.LockLoser).
func (a *JobActor) LockLost(value string, vanished bool) {
	a.env.Root.Send(a.self, &lifecycle.LockLost{LockValue: value, Vanished: vanished})
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
func (a *JobActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		if a.self == nil {
			a.self = c.Self()
		}
		a.id = jobIDFromPID(c)
		a.job = lifecycle.New(a.env.core, a.id, rand.Uint64())
		a.env.Metrics.LiveActors.Inc()
		if a.env.Tracing != nil {
			a.trace = newJobSpans(a.env.Tracing, a.id, a.env.Metrics)
		}
	case *actor.Stopping:
		a.step(c, &lifecycle.Stopping{})
	case *actor.Stopped:
		a.admitted()
		if a.waitingKey != "" && a.env.KeyWaiters != nil {
			a.env.KeyWaiters.remove(a.waitingKey, a.id)
		}
		a.env.Metrics.LiveActors.Dec()
		if a.trace != nil {
			a.trace.end(tracing.EndStopped)
		}
		// protoactor's child set keeps a stopped child's PID (and through
		// it the actor) reachable until the slot is reused: drop what the
		// actor references so that costs a struct, not the job.
		if a.wop != nil {
			a.wop.release()
		}
		// The actor's wheel entry goes to the next job's actor: a late
		// wake for this one was sent with its epoch and PID, not the entry.
		a.env.Wheel.Release(a.timer)
		a.job, a.timer, a.trace, a.wop = nil, nil, nil, nil
	case *actor.Restarting:
		a.admitted()
		a.env.Metrics.LiveActors.Dec() // Started follows and counts it again
		a.step(c, &lifecycle.Restarting{})
		if a.trace != nil {
			a.trace.end(tracing.EndRestarted)
		}
	case *Crash:
		crash(m)
	case actor.SystemMessage, actor.AutoReceiveMessage:
	case *lifecycle.WriteDone:
		// Its writeOp's own answer, read once this step is done with it
		// (writeOp.msg).
		w := a.wop
		a.handle(c, m)
		w.consumed(m)
	default:
		a.handle(c, m)
	}
}

// handle steps the core with a message from outside the actor system.
func (a *JobActor) handle(c actor.Context, m any) {
	if a.trace != nil {
		a.stepTraced(c, m)
		return
	}
	a.step(c, m)
}

// step feeds ev to the core and carries out its effects. An effect may
// answer at once (an inline policy's decision, a failed publish): that
// answer is the next event.
func (a *JobActor) step(c actor.Context, ev any) {
	if a.job == nil {
		return
	}
	if !a.started {
		a.started = true
		if _, ok := ev.(*lifecycle.Submit); ok {
			a.admitting = true
			a.env.Admitting.Add(1)
		}
	}
	for ev != nil {
		var next any
		for _, e := range a.job.Step(ev, a) {
			if n := a.do(c, e); n != nil {
				next = n
			}
		}
		// do keeps no effect: their storage goes back for the next step.
		a.job.Consumed()
		ev = next
	}
}

// The shell is the core's Inputs: the facts of the moment, read only when
// a decision needs them.

func (a *JobActor) Now() time.Time  { return time.Now() }
func (a *JobActor) OpID() uint64    { return rand.Uint64() }
func (a *JobActor) GraceRoom() bool { return a.env.Unwritten.Load() < a.env.MaxUnwrittenWaits }
func (a *JobActor) DataLost() bool  { return a.env.DataLost != nil && a.env.DataLost() }
func (a *JobActor) Connected() bool { return a.env.Connected == nil || a.env.Connected() }
func (a *JobActor) Count(m lifecycle.Metric, label string) {
	if m == lifecycle.MCapacityWaits {
		a.admitted() // written as waiting: its submit is acked
	}
	a.env.Metrics.count(lifecycle.Count{M: m, Label: label}, a.env.Output)
}

// admitted ends the job's count in Env.Admitting, once.
func (a *JobActor) admitted() {
	if a.admitting {
		a.admitting = false
		a.env.Admitting.Add(-1)
	}
}
func (a *JobActor) Observe(m lifecycle.Metric, v float64) {
	if a.trace != nil {
		a.trace.observe(lifecycle.Observe{M: m, Value: v})
		return
	}
	a.env.Metrics.observe(lifecycle.Observe{M: m, Value: v})
}

// heldFor is the renewer's entry for op's lock, if the actor holds it
// (the op's Held), else nil.
func (a *JobActor) heldFor(op *store.Op) *store.HeldLock {
	if h := a.held; h != nil && op.LockValue != "" && h.Value() == op.LockValue {
		return h
	}
	return nil
}

// do carries out one effect; it returns an event to feed back at once, if any.
func (a *JobActor) do(c actor.Context, e lifecycle.Effect) any {
	env := a.env
	switch e := e.(type) {
	case *lifecycle.Write:
		if e.Epoch == 0 {
			// Only a stopping actor writes without waiting (its lock's
			// release, onStopping): nobody waits for the answer, but a
			// failure means the lock stays until its TTL runs out, and no
			// other replica adopts the job before: say so.
			op := storeOp(e.Op)
			op.Held = a.heldFor(op)
			log, id := env.Log, op.JobID
			op.Done = func(r *store.Result) {
				if r != nil && r.Err != nil {
					log.Warn("job lock not released at stop; it is left to expire", "job_id", id, "err", r.Err)
				}
			}
			env.Writer.Submit(op)
			break
		}
		w := a.wop
		if !e.Retry || w == nil || w.of != e.Op || w.inFlight.Load() {
			if w == nil || w.inFlight.Load() {
				w = newWriteOp(c.Self(), env.Root)
				a.wop = w
			}
			fillStoreOp(&w.op, e.Op)
			w.op.Held = a.heldFor(&w.op)
			w.of = e.Op
		}
		w.epoch = e.Epoch
		w.op.Done = w.done
		w.inFlight.Store(true)
		env.Writer.Submit(&w.op)
	case lifecycle.RetryWrite:
		self, root, ep := c.Self(), env.Root, e.Epoch
		time.AfterFunc(e.After, func() { root.Send(self, &lifecycle.RetryNow{Epoch: ep}) })
	case *lifecycle.AskRouter:
		c.Request(env.Router, e.Req)
	case *lifecycle.ToRouter:
		c.Send(env.Router, e.Msg)
	case *lifecycle.AskPolicy:
		return a.askPolicy(c, *e)
	case lifecycle.AskKeySlot, lifecycle.WaitKey, lifecycle.ReleaseKey, lifecycle.CancelJob:
		a.keyEffect(c, e)
	case lifecycle.WakePolicyWaiters:
		if env.SafetyWaiters != nil {
			env.SafetyWaiters.wake(env.Root, SafetyWakeBatch)
		}
	case lifecycle.WaitPolicy:
		if env.SafetyWaiters != nil {
			if e.On {
				env.SafetyWaiters.add(a.id, c.Self())
			} else {
				env.SafetyWaiters.remove(a.id)
			}
		}
	case lifecycle.AskOutput:
		self, root, gate, ep := c.Self(), env.Root, env.Output, e.Epoch
		oreq := outputgate.Request(a.job.Req, e.Res.Res)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), PolicyTimeout)
			o := gate.Phase1(ctx, oreq)
			cancel()
			root.Send(self, &lifecycle.OutputDone{Epoch: ep, Outcome: outputOutcome(o), Res: e.Res, Path: e.Path})
		}()
	case lifecycle.ScanContent:
		scanContent(env, a.id, a.job.TraceID, a.job.Req.GetTopic(), outputgate.Request(a.job.Req, e.Res))
	case *lifecycle.PublishRequest:
		a.admitted()
		return a.publishRequest(*e)
	case lifecycle.TellClient:
		a.tellClient(e)
	case lifecycle.CancelWorker:
		a.cancelWorker(e.Reason)
	case lifecycle.PublishDLQ:
		publishDLQ(env, e.Entry)
	case *lifecycle.Arm:
		// The actor's one wheel entry, moved (no entry allocated per timer).
		a.timer = env.Wheel.Reschedule(a.timer, time.Until(e.At), c.Self(), e.Epoch)
	case lifecycle.Disarm:
		if a.timer != nil {
			env.Wheel.Cancel(a.timer) // kept for the next Arm
		}
	case lifecycle.Refusal:
		if e.Refuse != nil {
			e.Refuse(e.Reason, e.Detail)
		} else if e.D != nil {
			_ = e.D.Ack()
		}
	case *lifecycle.Ack:
		// The job's submit is acked only once its record exists: it has
		// left the stream's keeping, so it no longer counts in the node's
		// admissions (a job waiting for a tenant slot, a THROTTLE or an
		// unavailable policy must not hold intake for every tenant).
		a.admitted()
		_ = e.D.Ack()
	case lifecycle.Nak:
		_ = e.D.NakWithDelay(e.Delay)
	case lifecycle.Touch:
		_ = e.D.InProgress()
	case *lifecycle.Hold:
		// The actor is its own store.LockLoser (LockLost): no closure per job.
		a.held = env.Renewer.HoldFor(a.id, e.LockValue, a)
		if env.Alone != nil {
			env.Alone.Remove(a.id)
		}
	case lifecycle.Alone:
		if env.Alone != nil {
			env.Alone.Add(a.id, e.Kind, e.Due)
		}
	case *lifecycle.Forget:
		if h := a.held; h != nil && h.Value() == e.LockValue {
			env.Renewer.ForgetHeld(h)
		} else {
			env.Renewer.Forget(a.id, e.LockValue)
		}
	case lifecycle.Forward:
		a.forward(e)
	case lifecycle.Finish:
		a.admitted()
		if a.trace != nil {
			a.trace.finish(a.job.State, e.Parked)
		}
		f := &Finished{}
		if !a.finSent {
			// The actor's first Finished (as a rule its only one) is its
			// own field: the shard reads it and keeps nothing of it. A
			// second gets its own, the first perhaps not read yet.
			a.finSent, f = true, &a.fin
		}
		*f = Finished{JobID: a.id, PID: c.Self(), Parked: e.Parked, Running: e.Running, Redeliver: e.Redeliver}
		c.Send(c.Parent(), f)
	case lifecycle.Redeliver:
		c.Send(c.Parent(), &Redeliver{JobID: a.id, Msgs: e.Msgs})
	case lifecycle.Terminal:
		if env.OnTerminal != nil {
			env.OnTerminal(a.id)
		}
	case *lifecycle.Grace:
		env.Unwritten.Add(e.Delta)
		if env.Toucher != nil {
			// A wait whose deliveries their fetch loop keeps in progress
			// (every submit pulled by the node's own loops, so nearly
			// every wait) leaves the Toucher nothing to touch: it is not
			// added, nor removed (a lock, a map entry made and deleted and
			// a queue entry a waiting job, issue 33 round 11). The core
			// pairs each wait's +1 with its -1 in the same actor
			// (leaveGrace, on Stopping and Restarting too).
			switch {
			case e.Delta > 0:
				env.Metrics.UnwrittenWaits.Inc()
				if Touches(e.Deliveries) {
					env.Toucher.Add(a.id, e.Deliveries)
					a.touching = true
				} else if a.touching {
					env.Toucher.Remove(a.id)
					a.touching = false
				}
			case a.touching:
				env.Toucher.Remove(a.id)
				a.touching = false
			}
		}
	case lifecycle.Admitted:
		a.admitted()
	case lifecycle.Log:
		env.Log.Log(context.Background(), e.Level, e.Msg, e.Args...)
	case lifecycle.Count:
		env.Metrics.count(e, env.Output)
	case lifecycle.Observe:
		if a.trace != nil {
			a.trace.observe(e)
		} else {
			env.Metrics.observe(e)
		}
	case lifecycle.TakeTokens:
		return a.takeTokens(c, e)
	case lifecycle.LeaveTokens:
		if env.Rates != nil {
			env.Rates.Leave(a.id, e.Bucket, e.Epoch, e.Return)
		}
	case lifecycle.ParkTokens:
		a.parkTokens(c, e)
	case lifecycle.Moved:
		a.traceMoved(e)
	case lifecycle.Resumed:
		a.traceResumed(e)
	}
	return nil
}

// askPolicy asks the input policy. An inline policy answers from memory in
// microseconds: its answer is the next event. A remote kernel is asked from
// a goroutine and answers by message, so the mailbox never waits on the
// network.
func (a *JobActor) askPolicy(c actor.Context, e lifecycle.AskPolicy) any {
	if _, ok := a.env.Policy.(safety.AllowAll); ok {
		// The answer is the next event, stepped before do runs again:
		// the actor's own PolicyDone serves every job's check.
		a.allowAll = allowAllDone(e.Epoch)
		return &a.allowAll
	}
	preq := safety.CheckRequest(e.Req)
	if safety.IsInline(a.env.Policy) {
		dec, err := a.env.Policy.Check(context.Background(), preq)
		return policyDone(e.Epoch, dec, err)
	}
	self, root, policy, slots, ep := c.Self(), a.env.Root, a.env.Policy, a.env.PolicySlots, e.Epoch
	go func() {
		dec, err := checkBounded(policy, preq, slots)
		root.Send(self, policyDone(ep, dec, err))
	}()
	return nil
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

// publishRequest publishes the job's request; a first dispatch that could
// not be published is reported back to the core.
func (a *JobActor) publishRequest(e lifecycle.PublishRequest) any {
	j := a.job
	req := j.Req
	if a.trace != nil {
		req = a.trace.request(req)
	}
	if j.Retries() {
		// Dispatched under its attempt's id, with the attempt's number
		// (lifecycle/retry.go): a copy, the job's request stays as it is.
		req = attemptRequest(req, j.WorkerJobID(), j.Attempt())
	}
	data, err := bus.EncodeRequestEnv(j.TraceID, a.env.NodeID, req, a.stampDispatch(e.Subject)...)
	if err == nil {
		err = a.env.Publish(e.Subject, data)
	}
	if a.trace != nil && err == nil {
		a.trace.dispatched(j.Worker, e.Subject, e.Resend)
	}
	switch {
	case err != nil && e.Resend:
		a.env.Log.Warn("dispatch resend failed", "job_id", a.id, "trace_id", j.TraceID, "subject", e.Subject, "err", err)
	case err != nil:
		return &lifecycle.PublishFailed{Err: err}
	}
	return nil
}

// stampDispatch is what a direct dispatch adds to its request's env: what
// the node has heard of its worker (Env.DispatchStamp). `troupe worker`
// drops a dispatch that reaches it after a silence the node could have
// evicted it for, since the node may have placed the job elsewhere
// meanwhile (worker.StaleDispatch). A pool-subject dispatch is not stamped
// (nil): NATS picks its receiver, whose heartbeats the stamp would not
// describe. The entries are appended to the encoded request
// (bus.Encoder.RequestEnv): the job's own request is never changed (its
// labels place it, its hash approves it), nor copied.
func (a *JobActor) stampDispatch(subject string) []string {
	w := a.job.Worker
	if a.env.DispatchStamp == nil || w == "" || !a.env.Subjects.IsWorker(subject, w) {
		return nil
	}
	heard, window, ok := a.env.DispatchStamp(w)
	if !ok {
		return nil
	}
	// Both numbers in one string, cut in two: one allocation, not two.
	var buf [40]byte
	b := strconv.AppendInt(buf[:0], heard.UnixNano(), 10)
	n := len(b)
	nums := string(strconv.AppendInt(b, window.Milliseconds(), 10))
	a.stamp = [4]string{registry.EnvHeardBeat, nums[:n], registry.EnvEvictAfter, nums[n:]}
	return a.stamp[:]
}

// tellClient publishes an outcome Troupe decided itself (cancelled, timed
// out, denied, failed to schedule) as a JobResult on the result subject,
// where CAP clients wait for their job's result: without it a client waits
// for ever for a result no worker will send. It names no worker, so no node
// takes it for a worker's answer; the node that reads it back from the
// result stream finds the job terminal and absorbs it.
func (a *JobActor) tellClient(e lifecycle.TellClient) {
	if e.Once && a.env.Writer != nil && a.env.Keys != nil {
		a.tellClientOnce(e)
		return
	}
	res := e.Res
	if res == nil {
		res = &capv1.JobResult{JobId: a.id, Status: e.Status, ErrorCode: string(e.Code), ErrorMessage: e.Msg}
	}
	data, err := bus.EncodeResult(a.job.TraceID, a.env.NodeID, res)
	if err == nil {
		err = a.env.Publish(a.env.Subjects.Result, data)
	}
	if err != nil {
		a.env.Log.Warn("outcome publish failed", "job_id", a.id, "trace_id", a.job.TraceID, "err", err)
	}
}

// attemptRequest is req as attempt n of a job that may retry is
// dispatched: under the attempt's id, its number in the env
// (lifecycle.EnvAttempt).
func attemptRequest(req *capv1.JobRequest, id string, n int) *capv1.JobRequest {
	out := proto.Clone(req).(*capv1.JobRequest)
	out.JobId = id
	if out.Env == nil {
		out.Env = make(map[string]string, 1)
	}
	out.Env[lifecycle.EnvAttempt] = strconv.Itoa(n)
	return out
}

// tellClientOnce tells the client only if no replica told it e's outcome
// before: a claim of the job's told-key in Redis (kept for the retention of
// idempotency keys) picks the one teller. If Redis cannot be asked, the
// client is told anyway: a repeat is better than silence.
func (a *JobActor) tellClientOnce(e lifecycle.TellClient) {
	env, trace, id := a.env, a.job.TraceID, a.id
	token := env.NodeID + "/" + strconv.FormatInt(time.Now().UnixNano(), 36)
	op := &store.Op{Kind: store.OpClaim, JobID: token, IdemKey: env.Keys.Tag(id) + "told:" + id}
	op.Done = func(r *store.Result) {
		if r.Err == nil && r.Holder != token {
			return // told already
		}
		data, err := bus.EncodeResult(trace, env.NodeID, &capv1.JobResult{JobId: id, Status: e.Status,
			ErrorCode: string(e.Code), ErrorMessage: e.Msg})
		if err == nil {
			err = env.Publish(env.Subjects.Result, data)
		}
		if err != nil {
			env.Log.Warn("outcome publish failed", "job_id", id, "trace_id", trace, "err", err)
		}
	}
	env.Writer.Submit(op)
}

// cancelWorker publishes a JobCancel on sys.job.cancel, where CAP workers
// listen for them.
func (a *JobActor) cancelWorker(reason string) {
	data, err := bus.EncodeCancel(a.job.TraceID, a.env.NodeID, &capv1.JobCancel{JobId: a.job.WorkerJobID(), Reason: reason,
		RequestedBy: a.env.NodeID})
	if err == nil {
		err = a.env.Publish(a.env.Subjects.Cancel, data)
	}
	if err != nil {
		a.env.Log.Warn("cancel publish failed", "job_id", a.id, "trace_id", a.job.TraceID, "err", err)
	}
}

// forward hands a result or cancel to the node that owns the job, over a
// request to that node's inbox; the JetStream message is acked only when
// the owner answers that it took the event, handed back otherwise.
func (a *JobActor) forward(e lifecycle.Forward) {
	if a.env.Forward == nil {
		_ = e.D.NakWithDelay(time.Second)
		return
	}
	forward, metric, env, id := a.env.Forward, a.env.Metrics.Forwarded, a.env, a.id
	go func() {
		if err := forward(e.Holder, e.Kind, e.Raw); err == nil {
			metric.WithLabelValues("taken").Inc()
			if e.D != nil {
				_ = e.D.Ack()
			}
		} else {
			metric.WithLabelValues("returned").Inc()
			if e.D != nil {
				_ = e.D.NakWithDelay(ForwardRetryDelay(err, env.OwnerWait, env.LockTTL, id))
			}
		}
	}()
}

// ForwardRetryMax bounds ForwardRetryDelay.
const ForwardRetryMax = 2 * time.Minute

// ErrOwnerGone: no node listens on the inbox of the job's owner (it died,
// or lost its NATS connection).
var ErrOwnerGone = errors.New("forward: no node answers for the job's owner")

// ForwardRetryDelay is how long a result or cancel whose forward to the
// job's owner failed with err waits before JetStream offers it again. An
// owner that is gone (ErrOwnerGone) and not merely cut off from NATS for a
// moment (remaining, store.Store.OwnerWait, first waits out a fresh node
// lease of the owner's) holds the job until its lock lapses,
// and only then can this node take the job over: the event waits for the
// lock's remaining TTL (a parked lock's: its node's lease's; a lock TTL
// when neither is known), at most ForwardRetryMax, and is
// then taken here at the first offer. (Retried a second apart, the
// submit consumer's BackOff spread the offers 5, 10, 20 s… apart: a lock
// of 45 s took 4 tries per event and ~7 s past its lapse —
// faults/TestFaultNodeKilledResultsWaitForItsLocks.) Any other failure (the
// owner refused the event, or did not answer in time) is retried after a
// second.
func ForwardRetryDelay(err error, remaining func(context.Context, string) (time.Duration, error), lockTTL time.Duration,
	jobID string) time.Duration {
	if !errors.Is(err, ErrOwnerGone) || remaining == nil {
		return time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	d, rerr := remaining(ctx, jobID)
	switch {
	case rerr != nil:
		d = time.Second
	case d < 0:
		d = lockTTL
	default:
		d += 250 * time.Millisecond
	}
	return min(max(d, time.Second), ForwardRetryMax)
}

// scanContent queues phase 2 for a SUCCEEDED job. The scan runs on the
// node's scan pool, not in an actor; if it finds something, the job is
// downgraded to OUTPUT_QUARANTINED only if it is still SUCCEEDED.
func scanContent(env *Env, id, trace, topic string, oreq *capv1.OutputCheckRequest) {
	ok := env.Scans.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), outputgate.ContentBudgetDefault)
		defer cancel()
		o := env.Output.Phase2(ctx, oreq)
		if !o.Quarantine {
			// Allowed — or redacted after release, which this node does not
			// apply: the original was already released.
			return
		}
		op := &store.Op{Kind: store.OpDowngrade, JobID: id, Node: env.NodeID,
			T: &store.Transition{Path: []store.Hop{{To: jobstate.StateOutputQuarantined, Reason: jobstate.ReasonOutputQuarantined}},
				Fields: o.Fields()}}
		done := make(chan *store.Result, 1)
		op.Done = func(r *store.Result) { done <- r }
		env.Writer.Submit(op)
		r := <-done
		if r.OK() {
			env.Output.Metrics.Quarantined(outputgate.PhaseContent)
			env.Log.Warn("audit: output quarantined after release", "job_id", id, "trace_id", trace, "topic", topic,
				"phase", outputgate.PhaseContent, "rule_id", o.RuleID, "reason", o.Reason)
		}
	})
	if !ok {
		env.Output.Metrics.Skipped(outputgate.PhaseContent, "scan_queue_full")
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
func (a *JobActor) TraceState() (string, string) {
	if a.job == nil {
		return "", ""
	}
	return a.job.TraceState()
}

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
	case *lifecycle.WriteDone, *lifecycle.RetryNow:
		return "store-writer"
	case *router.PickReply, *router.Placed:
		return "router"
	case *lifecycle.Timer:
		return "wheel"
	case *lifecycle.LockLost:
		return "lock-renewer"
	case *lifecycle.PolicyDone, *lifecycle.PolicyBack:
		return "policy"
	case *lifecycle.OutputDone:
		return "output-policy"
	}
	return ""
}
