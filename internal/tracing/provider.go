package tracing

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// The standard OpenTelemetry variables that name an OTLP endpoint; either
// turns tracing on when no endpoint is configured otherwise.
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
)

// EndpointFromEnv reports whether the environment names an OTLP endpoint
// (EnvTracesEndpoint or EnvEndpoint).
func EndpointFromEnv() bool {
	return os.Getenv(EnvTracesEndpoint) != "" || os.Getenv(EnvEndpoint) != ""
}

// ProviderConfig configures NewProvider.
type ProviderConfig struct {
	// Endpoint is the OTLP/gRPC receiver: "host:port" or
	// "http://host:port" for plaintext, "https://host:port" for TLS. Empty:
	// the exporter reads the standard OTEL_EXPORTER_OTLP_* variables
	// (endpoint, headers, certificates, OTEL_EXPORTER_OTLP_INSECURE).
	Endpoint string
	// ServiceName is the resource's service.name (default "troupe";
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override it).
	ServiceName string
	// InstanceID is the resource's service.instance.id (the node id).
	InstanceID string
	// Options are added to the provider's (a sampler, a span processor for
	// tests, ...).
	Options []sdktrace.TracerProviderOption
}

// NewProvider returns an OpenTelemetry SDK tracer provider that batches
// spans to an OTLP/gRPC exporter, with IDGenerator as its id generator.
// The exporter connects lazily: an endpoint that is down costs dropped
// spans, never a failed start. Shut it down to flush the last spans.
func NewProvider(ctx context.Context, cfg ProviderConfig) (*sdktrace.TracerProvider, error) {
	var opts []otlptracegrpc.Option
	if ep := cfg.Endpoint; ep != "" {
		if !strings.Contains(ep, "://") {
			ep = "http://" + ep
		}
		opts = append(opts, otlptracegrpc.WithEndpointURL(ep))
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: otlp exporter: %w", err)
	}
	name := cfg.ServiceName
	if name == "" {
		name = "troupe"
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", name)}
	if cfg.InstanceID != "" {
		attrs = append(attrs, attribute.String("service.instance.id", cfg.InstanceID))
	}
	// Later detectors win: the environment overrides the defaults above.
	res, err := resource.New(ctx, resource.WithAttributes(attrs...), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		res = resource.NewSchemaless(attrs...)
	}
	all := append([]sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res),
		sdktrace.WithIDGenerator(IDGenerator())}, cfg.Options...)
	return sdktrace.NewTracerProvider(all...), nil
}

// wantedTraceID is the context key of the trace id a root span should take.
type wantedTraceID struct{}

// WithTraceID returns ctx asking IDGenerator to give the next root span
// started from it the trace id id.
func WithTraceID(ctx context.Context, id trace.TraceID) context.Context {
	return context.WithValue(ctx, wantedTraceID{}, id)
}

// IDGenerator returns the SDK id generator Troupe's providers use: random
// ids, except that a root span started from a context made by WithTraceID
// takes that trace id. That is how a job whose client sent a CAP trace id
// but no traceparent keeps the client's trace id. An embedder that passes
// its own provider (troupe.Config.TracerProvider) gets the same by building
// it with sdktrace.WithIDGenerator(troupe.TraceIDGenerator()); with another
// generator such a job's span starts a trace of its own (the CAP trace id
// is still its troupe.trace_id attribute).
func IDGenerator() sdktrace.IDGenerator { return idGenerator{} }

type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	tid, ok := ctx.Value(wantedTraceID{}).(trace.TraceID)
	if !ok || !tid.IsValid() {
		tid = randomTraceID()
	}
	return tid, randomSpanID()
}

func (idGenerator) NewSpanID(context.Context, trace.TraceID) trace.SpanID { return randomSpanID() }

func randomTraceID() trace.TraceID {
	var id trace.TraceID
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:8], rand.Uint64())
		binary.BigEndian.PutUint64(id[8:], rand.Uint64())
	}
	return id
}

func randomSpanID() trace.SpanID {
	var id trace.SpanID
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:], rand.Uint64())
	}
	return id
}
