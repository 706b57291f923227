package inboxotel

import (
	"context"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/storage"
)

// ScopeName names the tracer and the meter of this package.
const ScopeName = "github.com/inboxgo/inbox/otel"

// Options chooses where spans and metrics go. The zero value uses the
// global providers (otel.SetTracerProvider, otel.SetMeterProvider; set
// later, they still apply) and W3C Trace Context with Baggage.
type Options struct {
	// TracerProvider creates the tracer. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider creates the meter. Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Propagator extracts the producer's trace context from the message
	// headers. Default W3C Trace Context and Baggage, whatever the global
	// propagator is: that is what producers put into Kafka headers.
	Propagator propagation.TextMapPropagator
	// ConsumerGroup, if set, is recorded as messaging.consumer.group.name
	// on spans and metrics.
	ConsumerGroup string
}

// Hook is the OpenTelemetry instrumentation: put the *Hook into the Hooks
// of the inbox's Config, which a consumer without Hooks of its own takes
// (and of an outbox RelayConfig, whose cycles it ignores). It opens
// the spans (a hooks.MessageTracer, ClaimTracer and HandlerTracer),
// continues the producer's trace from the message headers (a
// consumer.ContextHook), and counts from the events (a hooks.EventHook).
// Each outcome is reported once by whoever decides it (see package hooks),
// so each is counted once however the hook is wired.
type Hook struct{ t *telemetry }

var (
	_ hooks.EventHook      = (*Hook)(nil)
	_ hooks.MessageTracer  = (*Hook)(nil)
	_ hooks.ClaimTracer    = (*Hook)(nil)
	_ hooks.HandlerTracer  = (*Hook)(nil)
	_ consumer.ContextHook = (*Hook)(nil)
)

// New returns the instrumentation for opts. It fails only if the meter
// refuses an instrument.
func New(opts Options) (*Hook, error) {
	t, err := newTelemetry(opts)
	if err != nil {
		return nil, err
	}
	return &Hook{t: t}, nil
}

// OnEvent counts outcomes, retries, dead letters and lag.
func (h *Hook) OnEvent(ev hooks.Event) { h.t.onEvent(ev) }

// TraceMessage opens the message span.
func (h *Hook) TraceMessage(ctx context.Context, row storage.InboxRow) (context.Context, func(hooks.Kind, error)) {
	return h.t.startMessage(ctx, row)
}

// TraceClaim opens the claim span.
func (h *Hook) TraceClaim(ctx context.Context, rows []storage.InboxRow) (context.Context, func([]bool, error)) {
	return h.t.startClaim(ctx, rows)
}

// TraceHandler opens the handler span.
func (h *Hook) TraceHandler(ctx context.Context, rows []storage.InboxRow) (context.Context, func(error)) {
	return h.t.startHandler(ctx, rows)
}

// MessageContext continues the producer's trace found in msg's headers.
func (h *Hook) MessageContext(ctx context.Context, msg *consumer.Message) context.Context {
	return extractContext(h.t.prop, ctx, msg)
}
