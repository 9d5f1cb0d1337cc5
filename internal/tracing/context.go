package tracing

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/troupe-run/troupe/proto/capv1"
)

// Keys of the W3C trace context in a JobRequest's env map. CAP has a
// field for the trace id (BusPacket.trace_id) but none for the caller's
// span, so the span travels as a W3C traceparent entry in env, which CAP
// clients set and CAP workers receive unchanged.
const (
	TraceparentKey = "traceparent"
	TracestateKey  = "tracestate"
)

// envCarrier reads and writes the W3C trace context in a request's env
// map. Reads also accept the upper-case names (TRACEPARENT, TRACESTATE),
// which is how trace context travels in process environment variables.
type envCarrier map[string]string

func (c envCarrier) Get(key string) string {
	if v, ok := c[key]; ok {
		return v
	}
	return c[strings.ToUpper(key)]
}

func (c envCarrier) Set(key, value string) { c[key] = value }

func (c envCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

var w3c = propagation.TraceContext{}

// SpanContextFromEnv returns the span context of the traceparent (and
// tracestate) entries of env; it is not valid when env has none, or one
// that does not parse.
func SpanContextFromEnv(env map[string]string) trace.SpanContext {
	if len(env) == 0 {
		return trace.SpanContext{}
	}
	ctx := w3c.Extract(context.Background(), envCarrier(env))
	return trace.SpanContextFromContext(ctx)
}

// ContextFromRequest returns ctx carrying, as its remote parent, the span
// Troupe named in the request it dispatched (the job's DISPATCHED span):
// a worker that starts its spans from this context continues the job's
// trace. Without a traceparent in req.Env, ctx is returned unchanged.
func ContextFromRequest(ctx context.Context, req *capv1.JobRequest) context.Context {
	sc := SpanContextFromEnv(req.GetEnv())
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// inject writes the W3C trace context of the span in ctx into env.
func inject(ctx context.Context, env map[string]string) {
	w3c.Inject(ctx, envCarrier(env))
}

// ParseTraceID reads a CAP trace id as an OpenTelemetry trace id: 32 hex
// digits (either case), or a UUID (8-4-4-4-12 hex digits with dashes). The
// all-zero id is not one.
func ParseTraceID(s string) (trace.TraceID, bool) {
	var id trace.TraceID
	switch len(s) {
	case 32:
	case 36:
		if s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
			return id, false
		}
		s = s[:8] + s[9:13] + s[14:18] + s[19:23] + s[24:]
	default:
		return id, false
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil || !id.IsValid() {
		return trace.TraceID{}, false
	}
	return id, true
}

// DerivedTraceID is the trace id of a job whose CAP trace id is not one
// (ParseTraceID): the first 16 bytes of SHA-256 over the CAP trace id, or
// over the job id when the packet had none. Every activation of the job,
// on any node, derives the same id, so its spans share one trace; jobs
// submitted under one CAP trace id share it too.
func DerivedTraceID(capTraceID, jobID string) trace.TraceID {
	src := "troupe-trace:" + capTraceID
	if capTraceID == "" {
		src = "troupe-job:" + jobID
	}
	sum := sha256.Sum256([]byte(src))
	var id trace.TraceID
	copy(id[:], sum[:16])
	return id
}

// Parent is where a job's span goes in the client's trace, from what the
// job's submit carried: capTraceID is BusPacket.trace_id, env the
// request's env map.
//
//   - A traceparent whose trace id is the packet's (or the packet's does
//     not parse) is the parent: the job span is a child of the client's span.
//   - Otherwise the packet's trace id, when it parses, is the trace: the job
//     span is a root span of that trace, linked to the traceparent's span
//     if there was one (a client that named another trace).
//   - Otherwise the trace id is derived (DerivedTraceID).
//
// The returned ctx carries the remote parent, or the trace id wanted for a
// root span (see IDGenerator); link is the span to link to, if valid.
func Parent(capTraceID, jobID string, env map[string]string) (ctx context.Context, link trace.SpanContext) {
	ctx = context.Background()
	sc := SpanContextFromEnv(env)
	tid, ok := ParseTraceID(capTraceID)
	switch {
	case sc.IsValid() && (!ok || sc.TraceID() == tid):
		return trace.ContextWithRemoteSpanContext(ctx, sc), trace.SpanContext{}
	case ok:
		return WithTraceID(ctx, tid), sc
	default:
		return WithTraceID(ctx, DerivedTraceID(capTraceID, jobID)), sc
	}
}
