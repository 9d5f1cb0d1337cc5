package jobactor

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/internal/tracing"
	"github.com/troupe-run/troupe/proto/capv1"
)

// stubContext is the part of an actor context the job actor's message path
// reads when a message leads to no effect.
type stubContext struct {
	actor.Context
	msg          any
	self, parent *actor.PID
}

func (c *stubContext) Message() interface{} { return c.msg }
func (c *stubContext) Self() *actor.PID     { return c.self }
func (c *stubContext) Parent() *actor.PID   { return c.parent }
func (c *stubContext) Sender() *actor.PID   { return nil }

// newTestActor returns a started job actor of env, with a request, outside
// any actor system.
func newTestActor(env *Env) (*JobActor, *stubContext) {
	c := &stubContext{self: actor.NewPID("local", "jobs-0/job-1"), parent: actor.NewPID("local", "jobs-0")}
	a := &JobActor{env: env}
	c.msg = &actor.Started{}
	a.Receive(c)
	a.job.Req = &capv1.JobRequest{JobId: "job-1", Topic: "job.echo", ContextPtr: "redis://ctx:job-1",
		Env: map[string]string{"A": "b"}}
	a.job.TraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	a.job.Worker = "w1"
	return a, c
}

func testEnv(tr *tracing.Tracer) *Env {
	return (&Env{NodeID: "node-a", Publish: func(string, []byte) error { return nil }, Tracing: tr}).WithDefaults()
}

// With tracing off (Env.Tracing nil) the job actor's hooks cost no
// allocation: a message through Receive and the core, the observations the
// core reports, the tracing effects, and the dispatch publish (which
// allocates exactly what encoding and publishing the request by hand
// does). With tracing on the same calls allocate, so the measurement sees
// the hooks.
func TestTracingOffAddsNoAllocation(t *testing.T) {
	const runs = 1000
	off, c := newTestActor(testEnv(nil))
	if off.trace != nil || off.env.core.Trace {
		t.Fatal("tracing off, yet the actor or its core traces")
	}
	// A timer of an epoch the job no longer waits for: through Receive and
	// Step, no effect.
	stale := &lifecycle.Timer{Epoch: 12345}
	receive := func(a *JobActor) func() {
		return func() {
			c.msg = stale
			a.Receive(c)
		}
	}
	observe := func(a *JobActor) func() {
		return func() {
			a.Observe(lifecycle.MDispatchLatency, 0.002)
			a.do(c, lifecycle.Observe{M: lifecycle.MActivationDelay, Value: 0.001})
			a.do(c, lifecycle.Moved{})
			a.do(c, lifecycle.Resumed{})
		}
	}
	publish := func(a *JobActor) func() {
		return func() { a.publishRequest(lifecycle.PublishRequest{Subject: "worker.w1.jobs"}) }
	}
	byHand := testing.AllocsPerRun(runs, func() {
		// The encoding publishRequest uses (this Env stamps nothing).
		data, err := bus.EncodeRequestEnv(off.job.TraceID, off.env.NodeID, off.job.Req)
		if err == nil {
			_ = off.env.Publish("worker.w1.jobs", data)
		}
	})
	offReceive := testing.AllocsPerRun(runs, receive(off))
	offObserve := testing.AllocsPerRun(runs, observe(off))
	offPublish := testing.AllocsPerRun(runs, publish(off))

	on, _ := newTestActor(testEnv(tracing.New(sdktrace.NewTracerProvider(), "node-a", true)))
	on.trace.job.Start(on.job.TraceID, "job.echo", nil, false)
	on.trace.job.Enter("DISPATCHED", "dispatched", time.Now())
	onReceive := testing.AllocsPerRun(runs, receive(on))
	onPublish := testing.AllocsPerRun(runs, publish(on))

	t.Logf("allocations per call, tracing off: receive %.0f, observe+effects %.0f, publish %.0f (by hand %.0f); "+
		"tracing on: receive %.0f, publish %.0f", offReceive, offObserve, offPublish, byHand, onReceive, onPublish)
	if offReceive != 0 || offObserve != 0 || offPublish != byHand {
		t.Fatalf("tracing off allocates: receive %.0f, observe %.0f, publish %.0f (by hand %.0f)",
			offReceive, offObserve, offPublish, byHand)
	}
	if onReceive <= offReceive || onPublish <= offPublish {
		t.Fatalf("tracing on allocates no more than off (receive %.0f, publish %.0f): the test does not see the hooks",
			onReceive, onPublish)
	}
}

// The request published to the worker carries the traceparent of the
// DISPATCHED span; the job's own request is left as it was.
func TestDispatchCarriesTheDispatchedSpansTraceparent(t *testing.T) {
	a, _ := newTestActor(testEnv(tracing.New(sdktrace.NewTracerProvider(sdktrace.WithIDGenerator(tracing.IDGenerator())),
		"node-a", false)))
	var sent []byte
	a.env.Publish = func(_ string, data []byte) error { sent = data; return nil }
	a.trace.job.Start(a.job.TraceID, "job.echo", nil, false)
	a.trace.job.Enter("DISPATCHED", "dispatched", time.Now())
	a.publishRequest(lifecycle.PublishRequest{Subject: "worker.w1.jobs"})
	pkt, err := bus.Decode(sent)
	if err != nil {
		t.Fatal(err)
	}
	env := pkt.GetJobRequest().GetEnv()
	tid, sid := a.trace.job.IDs()
	if env[tracing.TraceparentKey] != "00-"+tid+"-"+sid+"-01" || env["A"] != "b" || pkt.TraceId != a.job.TraceID {
		t.Fatalf("dispatched env %v (packet trace %q), want the DISPATCHED span %s/%s", env, pkt.TraceId, tid, sid)
	}
	if _, ok := a.job.Req.Env[tracing.TraceparentKey]; ok {
		t.Fatal("the job's own request was changed")
	}
}
