package troupe_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/tracing"
	"github.com/troupe-run/troupe/worker"
)

// An embedder's own TracerProvider built with troupe.TraceIDGenerator puts a
// job whose client sent a CAP trace id (and no traceparent) in the trace
// derived from that id, as the node's own provider does.
func TestTracerProviderWithTheTraceIDGeneratorKeepsTheCAPTrace(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithIDGenerator(troupe.TraceIDGenerator()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	f := newFixture(t, func(c *troupe.Config) { c.TracerProvider = tp })
	f.startWorker("w1", true, newReceipts(), worker.Echo)

	f.submit(echoReq("job-gen")) // CAP trace id "trace-job-gen", no traceparent
	f.waitState("job-gen", jobstate.StateSucceeded)
	if err := f.node.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := tracing.DerivedTraceID("trace-job-gen", "job-gen")
	jobs := 0
	for _, s := range exp.GetSpans() {
		if s.Name != "troupe.job" {
			continue
		}
		jobs++
		if got := s.SpanContext.TraceID(); got != want {
			t.Fatalf("job span in trace %s, want %s (derived from the CAP trace id)", got, want)
		}
	}
	if jobs == 0 {
		t.Fatalf("no troupe.job span among %d spans", len(exp.GetSpans()))
	}
}
