package inboxotel_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxgo/inbox/consumer"
	inboxotel "github.com/inboxgo/inbox/otel"
)

func TestHeaderCarrier(t *testing.T) {
	hs := []kafka.Header{{Key: "a", Value: []byte("1")}, {Key: "traceparent", Value: []byte("old")}, {Key: "a", Value: []byte("2")}}
	orig := hs
	c := inboxotel.NewHeaderCarrier(&hs)
	if got := c.Get("a"); got != "1" {
		t.Errorf("Get(a) = %q, want the first, 1", got)
	}
	if got := c.Get("A"); got != "" {
		t.Errorf("Get(A) = %q: Kafka header keys are case-sensitive", got)
	}
	c.Set("traceparent", "new")
	if got := fmt.Sprint(c.Keys()); got != "[a traceparent]" {
		t.Errorf("Keys() = %s", got)
	}
	if got := c.Get("traceparent"); got != "new" || len(hs) != 3 {
		t.Errorf("after Set: %q, %d headers", got, len(hs))
	}
	if string(orig[1].Value) != "old" {
		t.Error("Set changed the headers' backing array, which another message may share")
	}
	var none inboxotel.HeaderCarrier
	none.Set("k", "v")
	if none.Get("k") != "" || none.Keys() != nil {
		t.Error("the zero carrier holds something")
	}
}

func TestMessageContextExtractsTheProducersSpan(t *testing.T) {
	ctx, span := sdktrace.NewTracerProvider().Tracer("p").Start(context.Background(), "send")
	span.End()
	var msg consumer.Message
	propagation.TraceContext{}.Inject(ctx, inboxotel.NewHeaderCarrier(&msg.Headers))
	before := len(msg.Headers)
	got := trace.SpanContextFromContext(inboxotel.MessageContext(nil)(context.Background(), &msg))
	if got.SpanID() != span.SpanContext().SpanID() || !got.IsRemote() {
		t.Errorf("extracted %v, want the producer's span %v", got, span.SpanContext())
	}
	if len(msg.Headers) != before {
		t.Error("extraction changed the message")
	}
	base := context.Background()
	if got := inboxotel.MessageContext(nil)(base, &consumer.Message{}); trace.SpanContextFromContext(got).IsValid() {
		t.Error("a message without trace headers got a span context")
	}
}
