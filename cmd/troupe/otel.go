package main

import (
	"log/slog"

	"go.opentelemetry.io/otel"
)

// otelErrorsTo sends OpenTelemetry's own errors (an OTLP export that
// failed: the receiver is down, say) to log as warnings, instead of the
// standard logger's plain lines. Only the troupe command does this: it is
// process-wide, which an embedding program decides for itself.
func otelErrorsTo(log *slog.Logger) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: opentelemetry error", "err", err)
	}))
}
