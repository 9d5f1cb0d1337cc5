package jobactor

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/internal/tracing"
	"github.com/troupe-run/troupe/proto/capv1"
)

// The job actor's OpenTelemetry hooks. Each is called only when the actor
// has a *jobSpans, which it gets at start only when Env.Tracing is set: with
// tracing off the actor's path is the one it had before tracing existed,
// plus a nil check per hook (see TestTracingOffAddsNoAllocation).
//
// The spans follow what the decision core reports: with Config.Trace set it
// emits a Moved effect for every state change that became durable and a
// Resumed effect when an activation finds the job's record; the job span
// starts with the first of them (so a job this node only forwards, or
// finds finished, gets none) and ends with the actor's Finish effect.

// jobSpans is one job actor's tracing state.
type jobSpans struct {
	job     *tracing.Job
	metrics *Metrics
	// obs are the histogram observations of the current message, recorded
	// once its effects are carried out, with an exemplar naming the span
	// current then (the DISPATCHED span for the dispatch latency).
	obs []lifecycle.Observe
	// ending is how the spans end once the current message is handled (a
	// Finish effect decided it), "" while the job goes on.
	ending string
	// submitted is when the stream stored the job's submit (the earliest
	// of the submits this actor got; zero: none or unknown).
	submitted time.Time
}

func newJobSpans(t *tracing.Tracer, id string, m *Metrics) *jobSpans {
	return &jobSpans{job: t.Job(id, time.Now()), metrics: m}
}

// stepTraced handles one message with tracing on: the message itself (a
// span event when mailbox tracing is on), then the observations and any
// end the step decided.
func (a *JobActor) stepTraced(c actor.Context, m any) {
	ts := a.trace
	if sub, ok := m.(*Submit); ok && !sub.Published.IsZero() &&
		(ts.submitted.IsZero() || sub.Published.Before(ts.submitted)) {
		ts.submitted = sub.Published
	}
	if !a.env.Tracing.Mailbox() {
		a.step(c, m)
		ts.settle()
		return
	}
	before, _ := a.TraceState()
	start := time.Now()
	a.step(c, m)
	after, _ := a.TraceState()
	sender := ""
	if p := c.Sender(); p != nil {
		sender = p.Id
	} else {
		sender = TraceOrigin(m)
	}
	ts.job.Message(fmt.Sprintf("%T", m), sender, before, after, start, time.Since(start))
	ts.settle()
}

// startSpan opens the job span, placed in the client's trace by the job's
// CAP trace id and the traceparent its request carries.
func (a *JobActor) startSpan(resumed bool) {
	j := a.job
	a.trace.job.Start(j.TraceID, j.Req.GetTopic(), j.Req.GetEnv(), resumed)
}

// traceMoved follows a durable state change: the first opens the job span
// (and, for a job just created, its PENDING span from the submit on); each
// hop ends the current state's span and starts the next.
func (a *JobActor) traceMoved(m lifecycle.Moved) {
	if a.trace == nil {
		return
	}
	tj := a.trace.job
	if !tj.Started() {
		if m.Created {
			// A job this activation creates begins where its submit was
			// stored, not where this actor began: the time the submit
			// waited in the stream (back pressure, every node busy) is its
			// PENDING time, as in its history.
			tj.Backdate(a.trace.submitted)
		}
		a.startSpan(false)
	}
	if m.Created && tj.State() == "" {
		tj.Enter(string(jobstate.StatePending), string(jobstate.ReasonSubmitted), a.trace.first())
	}
	now := time.Now()
	for i, h := range m.Path {
		at := now
		if i == 0 && m.Created && h.To == jobstate.StateScheduled && !m.WaitedAt.IsZero() && m.WaitedAt.Before(now) {
			at = m.WaitedAt // its wait for room, before the record existed, is its own span
		}
		tj.Enter(string(h.To), string(h.Reason), at)
	}
}

// traceResumed follows an activation that found the job's record: a new
// job span (resumed) in the job's trace, and a span for the state it is in.
func (a *JobActor) traceResumed(m lifecycle.Resumed) {
	if a.trace == nil {
		return
	}
	if !a.trace.job.Started() {
		a.startSpan(true)
	}
	a.trace.job.Resume(string(m.State), string(m.Reason), time.Now())
}

func (ts *jobSpans) first() time.Time { return ts.job.First() }

// observe keeps a histogram observation for settle.
func (ts *jobSpans) observe(o lifecycle.Observe) { ts.obs = append(ts.obs, o) }

// request returns the request to publish to the worker: a copy of req
// whose env carries the traceparent of the current state's span (the
// DISPATCHED span), so the worker continues the job's trace. req itself is
// not changed: it is the job's record, and other goroutines (a policy
// check) may be reading it.
func (ts *jobSpans) request(req *capv1.JobRequest) *capv1.JobRequest {
	if !ts.job.Started() {
		return req
	}
	out := proto.Clone(req).(*capv1.JobRequest)
	if out.Env == nil {
		out.Env = map[string]string{}
	}
	ts.job.Inject(out.Env)
	return out
}

// dispatched records a publish of the request on the DISPATCHED span.
func (ts *jobSpans) dispatched(worker, subject string, resend bool) {
	ts.job.Dispatched(worker, subject, resend, time.Now())
}

// finish decides how the spans end once the current message is handled.
func (ts *jobSpans) finish(state jobstate.State, parked bool) {
	switch {
	case state.Terminal():
		ts.ending = tracing.EndTerminal
	case parked:
		ts.ending = tracing.EndParked
	case state == jobstate.StateApprovalRequired:
		ts.ending = tracing.EndPassivated
	default:
		ts.ending = tracing.EndReleased
	}
}

// settle records the message's observations, with exemplars, then ends
// the spans if the message finished the job's actor.
func (ts *jobSpans) settle() {
	if len(ts.obs) > 0 {
		tid, sid := ts.job.IDs()
		for _, o := range ts.obs {
			ts.metrics.observeTraced(o, tid, sid)
		}
		ts.obs = ts.obs[:0]
	}
	if ts.ending != "" {
		ts.job.End(ts.ending, time.Now())
		ts.ending = ""
	}
}

// end ends the spans now (the actor stops or restarts); an end already
// decided wins over how.
func (ts *jobSpans) end(how string) {
	if ts.ending == "" {
		ts.ending = how
	}
	ts.settle()
}
