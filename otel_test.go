package troupe_test

import (
	"context"
	"encoding/hex"
	"net"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/tracing"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// Tests of the node's OpenTelemetry traces, against an OTLP/gRPC receiver
// in the test process.

// otlpReceiver is an OTLP trace service that keeps every span it is sent.
type otlpReceiver struct {
	coltrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.Span
	res   []*commonpb.KeyValue
}

func (r *otlpReceiver) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		r.res = rs.GetResource().GetAttributes()
		for _, ss := range rs.GetScopeSpans() {
			r.spans = append(r.spans, ss.GetSpans()...)
		}
	}
	return &coltrace.ExportTraceServiceResponse{}, nil
}

// startOTLPReceiver serves an otlpReceiver on 127.0.0.1 and returns it
// with its address.
func startOTLPReceiver(t *testing.T) (*otlpReceiver, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &otlpReceiver{}
	srv := grpc.NewServer()
	coltrace.RegisterTraceServiceServer(srv, r)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return r, lis.Addr().String()
}

// jobSpans returns the spans received for jobID's trace: its job spans
// (troupe.job with troupe.job.id = jobID) and every span whose parent is
// one of them.
func (r *otlpReceiver) jobSpans(jobID string) (jobs, states []*tracepb.Span) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := map[string]bool{}
	for _, s := range r.spans {
		if s.GetName() == tracing.SpanJob && strAttr(s.GetAttributes(), string(tracing.AttrJobID)) == jobID {
			jobs = append(jobs, s)
			ids[hex.EncodeToString(s.GetSpanId())] = true
		}
	}
	for _, s := range r.spans {
		if ids[hex.EncodeToString(s.GetParentSpanId())] {
			states = append(states, s)
		}
	}
	return jobs, states
}

func strAttr(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			if v, ok := kv.GetValue().GetValue().(*commonpb.AnyValue_BoolValue); ok {
				if v.BoolValue {
					return "true"
				}
				return "false"
			}
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// A client's trace: BusPacket.trace_id and the traceparent of the client's
// span in JobRequest.env.
const (
	clientTraceID = "5b8efff798038103d269b633813fc60c"
	clientSpanID  = "eee19b7ec3c1b174"
)

func (f *fixture) submitTraced(req *capv1.JobRequest) {
	f.t.Helper()
	req.Env = map[string]string{tracing.TraceparentKey: "00-" + clientTraceID + "-" + clientSpanID + "-01"}
	data, err := bus.EncodeRequest(clientTraceID, "test-client", req)
	if err != nil {
		f.t.Fatal(err)
	}
	f.publishRaw(f.subj.Submit, data)
}

// traceparents records the traceparent of every request a worker
// receives, and the span its handler's context names as parent.
type traceparents struct {
	mu  sync.Mutex
	tp  map[string]string
	ctx map[string]string
}

func newTraceparents() *traceparents {
	return &traceparents{tp: map[string]string{}, ctx: map[string]string{}}
}

func (p *traceparents) handled(ctx context.Context, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ctx[id] = trace.SpanContextFromContext(ctx).SpanID().String()
}

func (p *traceparents) ctxSpan(id string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ctx[id]
}

func (p *traceparents) hook(_ string, req *capv1.JobRequest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tp[req.JobId] = req.GetEnv()[tracing.TraceparentKey]
}

func (p *traceparents) of(id string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tp[id]
}

// tracingWorker starts a worker that reports starts (progress) and answers
// each job once release(job) is closed, if release is set.
func (f *fixture) tracingWorker(tp *traceparents, release func(id string) <-chan struct{}) {
	f.t.Helper()
	done := make(chan struct{})
	f.t.Cleanup(func() { close(done) })
	w, err := worker.Start(f.env.NATS, worker.Config{ID: "w1", Pool: "echo", Topics: []string{"job.echo"}, Direct: true,
		SubjectPrefix: f.subj.Prefix(), Heartbeat: time.Second, Progress: true, OnReceive: tp.hook,
		Handler: func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
			tp.handled(ctx, req.JobId)
			if release != nil {
				select {
				case <-release(req.JobId):
				case <-ctx.Done():
				case <-done:
				}
			}
			return worker.Echo(ctx, req)
		}})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(w.Stop)
	f.waitWorkers(1)
}

// stopAndFlush stops the node, which flushes its last spans to the receiver.
func (f *fixture) stopAndFlush() {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := f.node.Stop(ctx); err != nil {
		f.t.Fatal(err)
	}
}

func TestJobSpanContinuesTheClientsTraceWithAStateSpanPerStateAndTheWorkerGetsTheDispatchedSpan(t *testing.T) {
	t.Parallel()
	recv, addr := startOTLPReceiver(t)
	f := newFixture(t, func(c *troupe.Config) {
		c.OTLPEndpoint = addr
		c.Tuning.JobTrace = true // mailbox tracing: span events per message
	})
	tp := newTraceparents()
	f.tracingWorker(tp, nil)

	f.submitTraced(echoReq("job-otel"))
	r := f.waitState("job-otel", jobstate.StateSucceeded)
	if r.TraceID != clientTraceID {
		t.Fatalf("record trace id %q", r.TraceID)
	}
	exemplar := dispatchExemplar(t, f.node)
	f.stopAndFlush()

	jobs, states := recv.jobSpans("job-otel")
	if len(jobs) != 1 {
		t.Fatalf("%d job spans, want 1 (%d state spans)", len(jobs), len(states))
	}
	job := jobs[0]
	if got := hex.EncodeToString(job.GetTraceId()); got != clientTraceID {
		t.Fatalf("job span trace %s, want the client's %s", got, clientTraceID)
	}
	if got := hex.EncodeToString(job.GetParentSpanId()); got != clientSpanID {
		t.Fatalf("job span parent %s, want the client's span %s", got, clientSpanID)
	}
	a := job.GetAttributes()
	if strAttr(a, string(tracing.AttrState)) != "SUCCEEDED" || strAttr(a, string(tracing.AttrEnd)) != tracing.EndTerminal ||
		strAttr(a, string(tracing.AttrTopic)) != "job.echo" || strAttr(a, string(tracing.AttrNodeID)) != "node-a" ||
		strAttr(a, string(tracing.AttrCAPTraceID)) != clientTraceID {
		t.Fatalf("job span attributes %v", a)
	}

	// One child span per state, in order, each with the reason it was
	// entered for.
	want := []struct{ state, reason jobstate.State }{
		{jobstate.StatePending, jobstate.State(jobstate.ReasonSubmitted)},
		{jobstate.StateScheduled, jobstate.State(jobstate.ReasonAllowed)},
		{jobstate.StateDispatched, jobstate.State(jobstate.ReasonDispatched)},
		{jobstate.StateRunning, jobstate.State(jobstate.ReasonStarted)},
		{jobstate.StateSucceeded, ""},
	}
	if len(states) != len(want) {
		t.Fatalf("%d state spans, want %d: %v", len(states), len(want), states)
	}
	byName := map[string]*tracepb.Span{}
	for _, s := range states {
		byName[s.GetName()] = s
		if hex.EncodeToString(s.GetTraceId()) != clientTraceID {
			t.Fatalf("state span %s in trace %x", s.GetName(), s.GetTraceId())
		}
	}
	var prevEnd uint64
	for _, w := range want {
		s := byName[tracing.SpanStatePrefix+string(w.state)]
		if s == nil {
			t.Fatalf("no span for %s: %v", w.state, states)
		}
		reason := strAttr(s.GetAttributes(), string(tracing.AttrTransition))
		if w.reason != "" && reason != string(w.reason) || reason == "" {
			t.Fatalf("%s span reason %q, want %q", w.state, reason, w.reason)
		}
		if s.GetStartTimeUnixNano() < prevEnd {
			t.Fatalf("%s span starts before the previous state's ends", w.state)
		}
		prevEnd = s.GetEndTimeUnixNano()
	}
	dispatched := byName[tracing.SpanStatePrefix+string(jobstate.StateDispatched)]
	if strAttr(dispatched.GetAttributes(), string(tracing.AttrWorkerID)) != "w1" || len(dispatched.GetEvents()) == 0 ||
		dispatched.GetEvents()[0].GetName() != tracing.EventDispatch {
		t.Fatalf("DISPATCHED span: attrs %v events %v", dispatched.GetAttributes(), dispatched.GetEvents())
	}

	// The worker continues the trace from the DISPATCHED span.
	wantTP := "00-" + clientTraceID + "-" + hex.EncodeToString(dispatched.GetSpanId()) + "-01"
	if got := tp.of("job-otel"); got != wantTP {
		t.Fatalf("worker got traceparent %q, want %q (the DISPATCHED span)", got, wantTP)
	}
	if got := tp.ctxSpan("job-otel"); got != hex.EncodeToString(dispatched.GetSpanId()) {
		t.Fatalf("the handler's context names span %s as parent, want the DISPATCHED span", got)
	}

	// Mailbox tracing: the messages the actor handled, from the submit on.
	types := map[string]bool{}
	for _, e := range job.GetEvents() {
		if e.GetName() == tracing.EventMessage {
			types[strAttr(e.GetAttributes(), string(tracing.AttrMessageType))] = true
		}
	}
	if !types["lifecycle.Submit"] || !types["lifecycle.Result"] || !types["lifecycle.WriteDone"] {
		t.Fatalf("mailbox events %v", types)
	}

	// The dispatch latency's exemplar names the DISPATCHED span.
	if exemplar["trace_id"] != clientTraceID || exemplar["span_id"] != hex.EncodeToString(dispatched.GetSpanId()) {
		t.Fatalf("dispatch latency exemplar %v", exemplar)
	}
	if strAttr(recv.res, "service.name") != "troupe" || strAttr(recv.res, "service.instance.id") != "node-a" {
		t.Fatalf("resource %v", recv.res)
	}
}

// dispatchExemplar returns the labels of the exemplar of
// troupe_dispatch_latency_seconds (nil if none).
func dispatchExemplar(t *testing.T, n *troupe.Node) map[string]string {
	t.Helper()
	mfs, err := n.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "troupe_dispatch_latency_seconds" {
			continue
		}
		for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
			if ex := b.GetExemplar(); ex != nil {
				out := map[string]string{}
				for _, l := range ex.GetLabel() {
					out[l.GetName()] = l.GetValue()
				}
				return out
			}
		}
	}
	return nil
}

// A job that parks while its worker runs it ends its first job span marked
// parked; the result's activation starts a second job span in the same
// trace, under the same client span, that ends the job.
func TestParkedJobEndsItsSpanParkedAndItsResumedSpanEndsTheJobInTheSameTrace(t *testing.T) {
	t.Parallel()
	recv, addr := startOTLPReceiver(t)
	f := newFixture(t, func(c *troupe.Config) {
		parkFast(c)
		c.OTLPEndpoint = addr
	})
	tp := newTraceparents()
	release := make(chan struct{})
	f.tracingWorker(tp, func(string) <-chan struct{} { return release })

	f.submitTraced(echoReq("job-otel-park"))
	f.waitState("job-otel-park", jobstate.StateRunning)
	waitParked(t, f.node, 1)
	close(release)
	f.waitState("job-otel-park", jobstate.StateSucceeded)
	f.stopAndFlush()

	jobs, states := recv.jobSpans("job-otel-park")
	if len(jobs) != 2 {
		t.Fatalf("%d job spans, want 2 (parked, then resumed)", len(jobs))
	}
	first, second := jobs[0], jobs[1]
	if first.GetStartTimeUnixNano() > second.GetStartTimeUnixNano() {
		first, second = second, first
	}
	fa, sa := first.GetAttributes(), second.GetAttributes()
	if strAttr(fa, string(tracing.AttrParked)) != "true" || strAttr(fa, string(tracing.AttrEnd)) != tracing.EndParked ||
		strAttr(fa, string(tracing.AttrState)) != "RUNNING" {
		t.Fatalf("first job span attributes %v", fa)
	}
	if strAttr(sa, string(tracing.AttrResumed)) != "true" || strAttr(sa, string(tracing.AttrEnd)) != tracing.EndTerminal ||
		strAttr(sa, string(tracing.AttrState)) != "SUCCEEDED" {
		t.Fatalf("second job span attributes %v", sa)
	}
	for _, j := range jobs {
		if hex.EncodeToString(j.GetTraceId()) != clientTraceID || hex.EncodeToString(j.GetParentSpanId()) != clientSpanID {
			t.Fatalf("job span %x/%x not under the client's span", j.GetTraceId(), j.GetParentSpanId())
		}
	}
	// The resumed activation's RUNNING span says so.
	resumed := 0
	for _, s := range states {
		if s.GetName() == tracing.SpanStatePrefix+"RUNNING" && strAttr(s.GetAttributes(), string(tracing.AttrResumed)) == "true" {
			resumed++
		}
	}
	if resumed != 1 {
		t.Fatalf("%d resumed RUNNING spans, want 1: %v", resumed, states)
	}
}

// Without an endpoint (and no OTEL_EXPORTER_OTLP_* in the environment) the
// node traces nothing: the request the worker gets has no traceparent.
func TestTracingIsOffWithoutAnEndpoint(t *testing.T) {
	t.Parallel()
	if tracing.EndpointFromEnv() {
		t.Skip("OTEL_EXPORTER_OTLP_ENDPOINT is set in this environment")
	}
	f := newFixture(t, nil)
	tp := newTraceparents()
	f.tracingWorker(tp, nil)
	f.submitTraced(echoReq("job-otel-off"))
	f.waitState("job-otel-off", jobstate.StateSucceeded)
	if got := tp.of("job-otel-off"); got != "00-"+clientTraceID+"-"+clientSpanID+"-01" {
		t.Fatalf("worker got traceparent %q, want the client's own, untouched", got)
	}
	if ex := dispatchExemplar(t, f.node); ex != nil {
		t.Fatalf("exemplar %v with tracing off", ex)
	}
}
