package inboxotel_test

import (
	"context"
	"fmt"
	"log"

	"github.com/segmentio/kafka-go"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/inbox"
	inboxotel "github.com/inboxgo/inbox/otel"
)

// A service that calls the inbox itself (Process, ProcessTx, ProcessBatch)
// puts the hook into the inbox's Hooks. Options{} takes the global
// providers, the ones the service's OpenTelemetry SDK set up; here no-op
// providers stand in for them. The message spans start from the context
// passed to Process: put the producer's trace context there. (A
// consumer.Consumer on this inbox takes its hooks when its own Hooks is
// nil.)
func ExampleNew() {
	icfg := inbox.Config{RetentionDays: 14}
	opts := inboxotel.Options{
		TracerProvider: tracenoop.NewTracerProvider(),
		MeterProvider:  metricnoop.NewMeterProvider(),
	}
	otelHook, err := inboxotel.New(opts)
	if err != nil {
		log.Fatal(err)
	}
	icfg.Hooks = append(icfg.Hooks, otelHook)
	fmt.Println("hooks:", len(icfg.Hooks))

	// Then, in the service:
	//	ib, err := inbox.New(db, store, icfg)
	//	...
	//	ctx := propagation.TraceContext{}.Extract(ctx, inboxotel.NewHeaderCarrier(&m.Headers))
	//	outcome, err := ib.Process(ctx, msg, handler)

	// Output:
	// hooks: 1
}

// The producer's side: the trace context of the request that emits an
// event goes into the Kafka message's headers (W3C traceparent), so that
// the consumer's spans continue that trace. In a service the context comes
// from the request's span; here a fixed span context keeps the output
// stable.
func ExampleNewHeaderCarrier() {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)

	msg := kafka.Message{Topic: "orders", Key: []byte("order-42"), Headers: []kafka.Header{
		{Key: header.EventID, Value: []byte("order-42-placed")},
	}}
	propagation.TraceContext{}.Inject(ctx, inboxotel.NewHeaderCarrier(&msg.Headers))
	for _, h := range msg.Headers {
		fmt.Printf("%s: %s\n", h.Key, h.Value)
	}
	// Output:
	// event_id: order-42-placed
	// traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
}

// A consumer that wants the producer's trace in its handler but no spans of
// the inbox's (a naturally idempotent consumer, say) installs MessageContext
// alone:
//
//	cfg.Hooks = append(cfg.Hooks, inboxotel.MessageContext(nil)) // cfg is the consumer.Config
//
// The handler's context then carries the producer's span as its remote
// parent, and the handler's own spans join that trace.
func ExampleMessageContext() {
	hook := inboxotel.MessageContext(nil) // W3C Trace Context and Baggage
	msg := &consumer.Message{Message: kafka.Message{Headers: []kafka.Header{
		{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
	}}}

	ctx := hook.MessageContext(context.Background(), msg)
	parent := trace.SpanContextFromContext(ctx)
	fmt.Println(parent.TraceID(), parent.SpanID(), parent.IsRemote())
	// Output: 4bf92f3577b34da6a3ce929d0e0e4736 00f067aa0ba902b7 true
}
