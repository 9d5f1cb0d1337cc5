package troupe

import (
	"context"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/troupe-run/troupe/internal/tracing"
)

// tracingShutdownTimeout bounds the flush of the last spans in Stop.
const tracingShutdownTimeout = 5 * time.Second

// startTracing returns the node's job tracer: on Config.TracerProvider, or
// on an OTLP exporter the node owns (Config.OTLPEndpoint or the standard
// OTEL_EXPORTER_OTLP_* variables), or nil (off).
func (n *Node) startTracing(ctx context.Context) (*tracing.Tracer, error) {
	mailbox := n.cfg.Tuning.JobTrace
	if n.cfg.TracerProvider != nil {
		return tracing.New(n.cfg.TracerProvider, n.cfg.NodeID, mailbox), nil
	}
	if n.cfg.OTLPEndpoint == "" && !tracing.EndpointFromEnv() {
		return nil, nil
	}
	tp, err := tracing.NewProvider(ctx, tracing.ProviderConfig{Endpoint: n.cfg.OTLPEndpoint, InstanceID: n.cfg.NodeID})
	if err != nil {
		return nil, err
	}
	n.stopTracer = tp.Shutdown
	ep := n.cfg.OTLPEndpoint
	if ep == "" {
		ep = "from the OTEL_EXPORTER_OTLP_* environment"
	}
	n.log.Info("tracing on: job spans exported over OTLP", "endpoint", ep)
	return tracing.New(tp, n.cfg.NodeID, mailbox), nil
}

// stopTracing flushes and shuts down the exporter the node owns, after the
// job actors have stopped (their spans have ended).
func (n *Node) stopTracing(ctx context.Context) {
	if n.stopTracer == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingShutdownTimeout)
	defer cancel()
	if err := n.stopTracer(ctx); err != nil {
		n.log.Warn("tracing: flushing the last spans failed", "err", err)
	}
}

// TraceIDGenerator is the OpenTelemetry id generator to build a
// Config.TracerProvider with (sdktrace.WithIDGenerator): a job whose client
// sent a CAP trace id but no traceparent then keeps one trace id, derived
// from the CAP trace id, on every node and activation. With another
// generator such a job's span starts a trace of its own (the CAP trace id
// is still its troupe.trace_id attribute).
func TraceIDGenerator() sdktrace.IDGenerator { return tracing.IDGenerator() }
