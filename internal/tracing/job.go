// Package tracing gives a node's jobs OpenTelemetry spans: one span per job
// activation (from its submit, or its re-activation, to its terminal state,
// parking or hand-over), a child span per state the job passes through, and
// the W3C trace context a worker needs to continue the trace.
//
// It is off unless the node has a tracer provider (troupe.Config's
// TracerProvider or OTLPEndpoint, or OTEL_EXPORTER_OTLP_ENDPOINT): a nil
// *Tracer is tracing off, and the job actors then create no *Job and make
// no call into this package.
//
// Span names and attributes are listed in README, "Tracing with
// OpenTelemetry".
package tracing

import (
	"context"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// ScopeName is the instrumentation scope of Troupe's spans.
const ScopeName = "github.com/troupe-run/troupe"

// Span and event names.
const (
	// SpanJob is the span of one activation of a job.
	SpanJob = "troupe.job"
	// SpanStatePrefix + state ("troupe.job.RUNNING") is the span of one
	// state the job was in, a child of SpanJob.
	SpanStatePrefix = "troupe.job."
	// EventTransition marks, on a state span, a transition that kept the
	// state (SCHEDULED → SCHEDULED with a new wait reason, RUNNING →
	// RUNNING worker_lost).
	EventTransition = "troupe.transition"
	// EventDispatch marks, on the DISPATCHED span, each publish of the
	// job's request to a worker (the first and any resend).
	EventDispatch = "troupe.dispatch"
	// EventMessage is one message the job's actor handled (mailbox tracing
	// on), on the job span.
	EventMessage = "troupe.mailbox"
)

// Attribute keys.
const (
	AttrJobID      = attribute.Key("troupe.job.id")
	AttrTopic      = attribute.Key("troupe.job.topic")
	AttrNodeID     = attribute.Key("troupe.node.id")
	AttrCAPTraceID = attribute.Key("troupe.trace_id") // BusPacket.trace_id as the client sent it
	AttrResumed    = attribute.Key("troupe.job.resumed")
	AttrState      = attribute.Key("troupe.job.state")
	AttrReason     = attribute.Key("troupe.job.reason")
	AttrEnd        = attribute.Key("troupe.job.end")
	AttrParked     = attribute.Key("troupe.job.parked")
	AttrWorkerID   = attribute.Key("troupe.worker.id")

	AttrFrom       = attribute.Key("troupe.transition.from")
	AttrTransition = attribute.Key("troupe.transition.reason")
	AttrNext       = attribute.Key("troupe.transition.next")
	AttrNextReason = attribute.Key("troupe.transition.next_reason")

	AttrSubject = attribute.Key("troupe.dispatch.subject")
	AttrResend  = attribute.Key("troupe.dispatch.resend")

	AttrMessageType   = attribute.Key("troupe.message.type")
	AttrMessageSender = attribute.Key("troupe.message.sender")
	AttrStateBefore   = attribute.Key("troupe.message.state_before")
	AttrStateAfter    = attribute.Key("troupe.message.state_after")
	AttrHandleNanos   = attribute.Key("troupe.message.handle_ns")
)

// How a job span ends (AttrEnd).
const (
	EndTerminal   = "terminal"   // the job reached a terminal state
	EndParked     = "parked"     // parked waiting for its worker; a later activation continues
	EndPassivated = "passivated" // waiting for approval in Redis, with no actor
	EndReleased   = "released"   // another node owns the job, or its lock was lost
	EndStopped    = "stopped"    // the node stopped; another replica adopts the job
	EndRestarted  = "restarted"  // the actor failed and was restarted
)

// maxEarly bounds the mailbox events kept for a job span not yet started.
const maxEarly = 32

// Tracer makes the spans of one node's jobs. A nil *Tracer is tracing off.
type Tracer struct {
	tracer  trace.Tracer
	nodeID  string
	mailbox bool
}

// New returns a Tracer on tp for the node nodeID, or nil (off) when tp is
// nil. With mailbox, the job actors also record every message they handle
// (see Job.Message).
func New(tp trace.TracerProvider, nodeID string, mailbox bool) *Tracer {
	if tp == nil {
		return nil
	}
	return &Tracer{tracer: tp.Tracer(ScopeName), nodeID: nodeID, mailbox: mailbox}
}

// Mailbox reports whether job actors record their messages as span events.
func (t *Tracer) Mailbox() bool { return t != nil && t.mailbox }

// Job returns the tracing of one activation of job id, whose actor got its
// first message at first. Its span starts only with Start.
func (t *Tracer) Job(id string, first time.Time) *Job {
	return &Job{t: t, id: id, first: first}
}

// Job is the spans of one activation of a job (one actor's life). It is
// used from the job's actor only.
type Job struct {
	t     *Tracer
	id    string
	first time.Time
	ctx   context.Context // carries span
	span  trace.Span      // the job span; nil before Start and after End
	state trace.Span      // the current state's span; nil for a terminal state
	cur   string          // the current state
	why   string          // the reason it was entered
	early []message       // mailbox events before Start
}

type message struct {
	typ, sender, before, after string
	at                         time.Time
	took                       time.Duration
}

// Started reports whether the job span is open.
func (j *Job) Started() bool { return j.span != nil }

// First is when the activation's first message arrived.
func (j *Job) First() time.Time { return j.first }

// Backdate moves the activation's start back to at (when the job's submit
// was stored), if at is earlier and the job span has not started: the job
// span and its PENDING span then begin there.
func (j *Job) Backdate(at time.Time) {
	if j.span == nil && !at.IsZero() && at.Before(j.first) {
		j.first = at
	}
}

// State is the state whose span is current ("" before the first).
func (j *Job) State() string { return j.cur }

// Start opens the job span, from the activation's first message. Its place
// in the client's trace comes from capTraceID (BusPacket.trace_id of the
// submit, or the record's) and the traceparent in env (see Parent).
// Resumed: the activation continues a job an earlier one wrote.
func (j *Job) Start(capTraceID, topic string, env map[string]string, resumed bool) {
	if j.span != nil {
		return
	}
	ctx, link := Parent(capTraceID, j.id, env)
	attrs := []attribute.KeyValue{AttrJobID.String(j.id), AttrTopic.String(topic), AttrNodeID.String(j.t.nodeID)}
	if capTraceID != "" {
		attrs = append(attrs, AttrCAPTraceID.String(capTraceID))
	}
	if resumed {
		attrs = append(attrs, AttrResumed.Bool(true))
	}
	opts := []trace.SpanStartOption{trace.WithTimestamp(j.first), trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attrs...)}
	if link.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: link}))
	}
	j.ctx, j.span = j.t.tracer.Start(ctx, SpanJob, opts...)
	for _, m := range j.early {
		j.addMessage(m)
	}
	j.early = nil
}

// Enter records that the job entered state to for reason at at: the
// current state's span ends and to's begins (a terminal state's span ends
// where it begins). Entering the current state again is an EventTransition
// on its span.
func (j *Job) Enter(to, reason string, at time.Time) { j.enter(to, reason, at, false) }

// Resume starts the span of the state an activation found the job in
// (entered earlier, for reason), marked resumed.
func (j *Job) Resume(state, reason string, at time.Time) { j.enter(state, reason, at, true) }

func (j *Job) enter(to, reason string, at time.Time, resumed bool) {
	if j.span == nil {
		return
	}
	if to == j.cur && j.state != nil {
		j.state.AddEvent(EventTransition, trace.WithTimestamp(at),
			trace.WithAttributes(AttrTransition.String(reason)))
		j.why = reason
		return
	}
	from := j.cur
	if j.state != nil {
		j.state.SetAttributes(AttrNext.String(to), AttrNextReason.String(reason))
		j.state.End(trace.WithTimestamp(at))
		j.state = nil
	}
	attrs := []attribute.KeyValue{AttrState.String(to), AttrTransition.String(reason)}
	if from != "" {
		attrs = append(attrs, AttrFrom.String(from))
	}
	if resumed {
		attrs = append(attrs, AttrResumed.Bool(true))
	}
	kind := trace.SpanKindInternal
	if to == string(jobstate.StateDispatched) {
		kind = trace.SpanKindProducer // its context goes to the worker
	}
	_, s := j.t.tracer.Start(j.ctx, SpanStatePrefix+to, trace.WithTimestamp(at), trace.WithSpanKind(kind),
		trace.WithAttributes(attrs...))
	j.cur, j.why = to, reason
	if jobstate.State(to).Terminal() {
		s.End(trace.WithTimestamp(at))
		return
	}
	j.state = s
}

// Dispatched records a publish of the job's request to worker on subject
// (resend: a repeat) on the current state's span.
func (j *Job) Dispatched(worker, subject string, resend bool, at time.Time) {
	if j.state == nil {
		return
	}
	j.state.SetAttributes(AttrWorkerID.String(worker))
	j.state.AddEvent(EventDispatch, trace.WithTimestamp(at), trace.WithAttributes(AttrWorkerID.String(worker),
		AttrSubject.String(subject), AttrResend.Bool(resend)))
}

// Inject writes into env the W3C trace context (traceparent, tracestate)
// of the current state's span — the DISPATCHED span when the job's request
// is published — or of the job span when there is none.
func (j *Job) Inject(env map[string]string) {
	s := j.current()
	if s == nil {
		return
	}
	inject(trace.ContextWithSpan(context.Background(), s), env)
}

func (j *Job) current() trace.Span {
	if j.state != nil {
		return j.state
	}
	return j.span
}

// IDs returns the hex trace and span ids of the current span, for a
// metric exemplar; empty when no span is open or its trace is not sampled.
func (j *Job) IDs() (traceID, spanID string) {
	s := j.current()
	if s == nil {
		return "", ""
	}
	sc := s.SpanContext()
	if !sc.IsSampled() {
		return "", ""
	}
	return sc.TraceID().String(), sc.SpanID().String()
}

// Message records one message the job's actor handled (mailbox tracing):
// its type, who sent it, the job's state before and after, and how long
// the actor took. Before Start the message is kept (up to maxEarly) and
// added when the span starts.
func (j *Job) Message(typ, sender, before, after string, at time.Time, took time.Duration) {
	m := message{typ: strings.TrimPrefix(typ, "*"), sender: sender, before: before, after: after, at: at, took: took}
	if j.span == nil {
		if len(j.early) < maxEarly {
			j.early = append(j.early, m)
		}
		return
	}
	j.addMessage(m)
}

func (j *Job) addMessage(m message) {
	attrs := []attribute.KeyValue{AttrMessageType.String(m.typ), AttrHandleNanos.Int64(int64(m.took))}
	if m.sender != "" {
		attrs = append(attrs, AttrMessageSender.String(m.sender))
	}
	if m.before != "" {
		attrs = append(attrs, AttrStateBefore.String(m.before))
	}
	if m.after != "" {
		attrs = append(attrs, AttrStateAfter.String(m.after))
	}
	j.span.AddEvent(EventMessage, trace.WithTimestamp(m.at), trace.WithAttributes(attrs...))
}

// End ends the activation's spans at at; how says why (EndTerminal,
// EndParked, ...). A parked job's spans carry troupe.job.parked=true: the
// job is still in flight, and its next activation starts a new job span in
// the same trace. A job that ends FAILED, TIMEOUT, DENIED or
// OUTPUT_QUARANTINED gets an error status. End before Start does nothing.
func (j *Job) End(how string, at time.Time) {
	if j.span == nil {
		j.early = nil
		return
	}
	parked := how == EndParked
	if j.state != nil {
		if parked {
			j.state.SetAttributes(AttrParked.Bool(true))
		}
		j.state.End(trace.WithTimestamp(at))
		j.state = nil
	}
	j.span.SetAttributes(AttrState.String(j.cur), AttrReason.String(j.why), AttrEnd.String(how))
	if parked {
		j.span.SetAttributes(AttrParked.Bool(true))
	}
	if how == EndTerminal && failed(jobstate.State(j.cur)) {
		j.span.SetStatus(codes.Error, j.why)
	}
	j.span.End(trace.WithTimestamp(at))
	j.span, j.ctx = nil, nil
}

func failed(s jobstate.State) bool {
	switch s {
	case jobstate.StateFailed, jobstate.StateTimeout, jobstate.StateDenied, jobstate.StateOutputQuarantined:
		return true
	}
	return false
}
