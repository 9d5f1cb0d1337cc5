package tracing

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/troupe-run/troupe/proto/capv1"
)

const (
	clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpan  = "00f067aa0ba902b7"
	clientTP    = "00-" + clientTrace + "-" + clientSpan + "-01"
)

func newRecorder(t *testing.T) (*Tracer, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithIDGenerator(IDGenerator()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return New(tp, "node-a", false), rec
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func TestParseTraceIDTakesHexAndUUIDsOnly(t *testing.T) {
	for s, ok := range map[string]bool{
		clientTrace:                            true,
		"4BF92F3577B34DA6A3CE929D0E0E4736":     true,
		"4bf92f35-77b3-4da6-a3ce-929d0e0e4736": true,
		"00000000000000000000000000000000":     false,
		"job-1":                                false,
		"4bf92f3577b34da6a3ce929d0e0e473":      false,
		"4bf92f3577b34da6a3ce929d0e0e473z":     false,
		"4bf92f35x77b3-4da6-a3ce-929d0e0e4736": false,
		"":                                     false,
	} {
		id, got := ParseTraceID(s)
		if got != ok {
			t.Errorf("ParseTraceID(%q) ok=%v, want %v", s, got, ok)
		}
		if ok && id.String() != clientTrace {
			t.Errorf("ParseTraceID(%q) = %s", s, id)
		}
	}
}

func TestParentChoosesTheClientsSpanTraceOrADerivedTrace(t *testing.T) {
	other := "0af7651916cd43dd8448eb211c80319c"
	cases := []struct {
		name, capTrace string
		env            map[string]string
		trace, parent  string // parent "": a root span
		link           string
	}{
		{"traceparent of the packet's trace", clientTrace, map[string]string{TraceparentKey: clientTP}, clientTrace, clientSpan, ""},
		{"upper-case env name", clientTrace, map[string]string{"TRACEPARENT": clientTP}, clientTrace, clientSpan, ""},
		{"traceparent, packet id not a trace id", "job-7", map[string]string{TraceparentKey: clientTP}, clientTrace, clientSpan, ""},
		{"packet trace id only", other, nil, other, "", ""},
		{"traceparent of another trace", other, map[string]string{TraceparentKey: clientTP}, other, "", clientSpan},
		{"bad traceparent", other, map[string]string{TraceparentKey: "00-zz-01"}, other, "", ""},
		{"neither", "job-7", nil, DerivedTraceID("job-7", "job-7").String(), "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr, rec := newRecorder(t)
			j := tr.Job("job-7", time.Now())
			j.Start(c.capTrace, "job.echo", c.env, false)
			j.End(EndTerminal, time.Now())
			s := rec.Ended()[0]
			if got := s.SpanContext().TraceID().String(); got != c.trace {
				t.Errorf("trace %s, want %s", got, c.trace)
			}
			parent := ""
			if s.Parent().IsValid() {
				parent = s.Parent().SpanID().String()
			}
			if parent != c.parent {
				t.Errorf("parent %q, want %q", parent, c.parent)
			}
			link := ""
			if ls := s.Links(); len(ls) > 0 {
				link = ls[0].SpanContext.SpanID().String()
			}
			if link != c.link {
				t.Errorf("link %q, want %q", link, c.link)
			}
			if got := attr(s, AttrCAPTraceID).AsString(); got != c.capTrace {
				t.Errorf("troupe.trace_id %q, want %q", got, c.capTrace)
			}
		})
	}
}

func TestDerivedTraceIDIsStableAndPerJobWithoutACAPTraceID(t *testing.T) {
	if DerivedTraceID("t", "a") != DerivedTraceID("t", "b") {
		t.Fatal("jobs of one CAP trace id got different trace ids")
	}
	if DerivedTraceID("", "a") == DerivedTraceID("", "b") || DerivedTraceID("", "a") != DerivedTraceID("", "a") {
		t.Fatal("a job without a CAP trace id must get its own stable trace id")
	}
}

// The job span is the parent of one span per state; a self-transition is
// an event; Inject names the current state's span; parking ends both
// spans marked parked, and a resumed activation starts a new job span in
// the same trace.
func TestJobSpansFollowStatesAndParkingAndResuming(t *testing.T) {
	tr, rec := newRecorder(t)
	t0 := time.Now()
	j := tr.Job("job-1", t0)
	j.Start(clientTrace, "job.echo", map[string]string{TraceparentKey: clientTP}, false)
	j.Enter("PENDING", "submitted", t0)
	j.Enter("SCHEDULED", "policy_allowed", t0.Add(time.Millisecond))
	j.Enter("SCHEDULED", "pool_overloaded", t0.Add(2*time.Millisecond))
	j.Enter("DISPATCHED", "dispatched", t0.Add(3*time.Millisecond))
	j.Dispatched("w1", "worker.w1.jobs", false, t0.Add(3*time.Millisecond))
	env := map[string]string{}
	j.Inject(env)
	traceID, spanID := j.IDs()
	j.End(EndParked, t0.Add(4*time.Millisecond))

	spans := rec.Ended()
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = s
	}
	job, disp, sched := byName[SpanJob], byName[SpanStatePrefix+"DISPATCHED"], byName[SpanStatePrefix+"SCHEDULED"]
	if len(spans) != 4 || job == nil || disp == nil || sched == nil || byName[SpanStatePrefix+"PENDING"] == nil {
		t.Fatalf("spans %d: %v", len(spans), byName)
	}
	for _, s := range spans {
		if s != job && s.Parent().SpanID() != job.SpanContext().SpanID() {
			t.Errorf("%s is not a child of the job span", s.Name())
		}
	}
	if !job.StartTime().Equal(t0) || job.SpanKind() != trace.SpanKindConsumer || disp.SpanKind() != trace.SpanKindProducer {
		t.Errorf("job span start %v kind %v, dispatched kind %v", job.StartTime(), job.SpanKind(), disp.SpanKind())
	}
	if len(sched.Events()) != 1 || sched.Events()[0].Name != EventTransition ||
		attr(sched, AttrNext).AsString() != "DISPATCHED" || attr(sched, AttrFrom).AsString() != "PENDING" {
		t.Errorf("SCHEDULED span: events %v attrs %v", sched.Events(), sched.Attributes())
	}
	if attr(disp, AttrTransition).AsString() != "dispatched" || attr(disp, AttrWorkerID).AsString() != "w1" ||
		len(disp.Events()) != 1 || disp.Events()[0].Name != EventDispatch {
		t.Errorf("DISPATCHED span: attrs %v events %v", disp.Attributes(), disp.Events())
	}
	want := "00-" + clientTrace + "-" + disp.SpanContext().SpanID().String() + "-01"
	if env[TraceparentKey] != want || traceID != clientTrace || spanID != disp.SpanContext().SpanID().String() {
		t.Errorf("injected %q (ids %s %s), want %q", env[TraceparentKey], traceID, spanID, want)
	}
	sc := SpanContextFromEnv(env)
	if got := trace.SpanContextFromContext(ContextFromRequest(context.Background(), &capv1.JobRequest{Env: env})); !got.Equal(sc) || !got.IsRemote() {
		t.Errorf("ContextFromRequest gave %v, want the DISPATCHED span %v", got, sc)
	}
	if !attr(job, AttrParked).AsBool() || !attr(disp, AttrParked).AsBool() || attr(job, AttrEnd).AsString() != EndParked ||
		attr(job, AttrState).AsString() != "DISPATCHED" {
		t.Errorf("parked job span attrs %v", job.Attributes())
	}

	// The job's next activation, woken by its result.
	j2 := tr.Job("job-1", t0.Add(time.Second))
	j2.Start(clientTrace, "job.echo", map[string]string{TraceparentKey: clientTP}, true)
	j2.Resume("DISPATCHED", "dispatched", t0.Add(time.Second))
	j2.Enter("SUCCEEDED", "worker_completed", t0.Add(2*time.Second))
	j2.End(EndTerminal, t0.Add(2*time.Second))
	spans = rec.Ended()[4:]
	if len(spans) != 3 {
		t.Fatalf("resumed activation: %d spans", len(spans))
	}
	var job2 sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == SpanJob {
			job2 = s
		}
	}
	if job2 == nil || job2.SpanContext().TraceID() != job.SpanContext().TraceID() || job2.Parent().SpanID() != job.Parent().SpanID() ||
		!attr(job2, AttrResumed).AsBool() || attr(job2, AttrState).AsString() != "SUCCEEDED" || job2.Status().Code == codes.Error {
		t.Fatalf("resumed job span %v", job2)
	}
}

func TestFailedJobSpanHasAnErrorStatus(t *testing.T) {
	tr, rec := newRecorder(t)
	j := tr.Job("job-1", time.Now())
	j.Start("", "job.echo", nil, false)
	j.Enter("PENDING", "submitted", time.Now())
	j.Enter("FAILED", "worker_failed", time.Now())
	j.End(EndTerminal, time.Now())
	for _, s := range rec.Ended() {
		if s.Name() == SpanJob && (s.Status().Code != codes.Error || s.Status().Description != "worker_failed") {
			t.Fatalf("FAILED job span status %v", s.Status())
		}
	}
}

func TestMailboxMessagesBeforeTheSpanAreKept(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := New(tp, "node-a", true)
	if !tr.Mailbox() || (*Tracer)(nil).Mailbox() {
		t.Fatal("Mailbox flag")
	}
	j := tr.Job("job-1", time.Now())
	j.Message("*actors.Submit", "intake:submit", "", "PENDING", time.Now(), time.Microsecond)
	j.Start("", "job.echo", nil, false)
	j.Message("*lifecycle.WriteDone", "store-writer", "PENDING", "DISPATCHED", time.Now(), time.Microsecond)
	j.End(EndTerminal, time.Now())
	ev := rec.Ended()[0].Events()
	if len(ev) != 2 || ev[0].Name != EventMessage || ev[0].Attributes[0].Value.AsString() != "actors.Submit" {
		t.Fatalf("mailbox events %v", ev)
	}
}

func TestIDGeneratorGivesRootSpansTheWantedTraceID(t *testing.T) {
	want, _ := ParseTraceID(clientTrace)
	g := IDGenerator()
	if tid, sid := g.NewIDs(WithTraceID(context.Background(), want)); tid != want || !sid.IsValid() {
		t.Fatalf("NewIDs = %s %s", tid, sid)
	}
	if tid, _ := g.NewIDs(context.Background()); tid == want || !tid.IsValid() {
		t.Fatalf("NewIDs without a wanted id = %s", tid)
	}
}

func TestNilTracerIsOff(t *testing.T) {
	if New(nil, "n", true) != nil {
		t.Fatal("New(nil) is not nil")
	}
}
