package inboxotel

import (
	"context"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/propagation"

	"github.com/inboxgo/inbox/consumer"
)

// HeaderCarrier is a propagation.TextMapCarrier over the headers of a Kafka
// message: a producer injects the trace context into them, a consumer
// extracts it. Header keys are matched exactly, as Kafka does.
type HeaderCarrier struct {
	headers *[]kafka.Header
}

var _ propagation.TextMapCarrier = HeaderCarrier{}

// NewHeaderCarrier returns a carrier reading and writing *headers, for
// example &msg.Headers of a kafka.Message about to be written.
func NewHeaderCarrier(headers *[]kafka.Header) HeaderCarrier {
	return HeaderCarrier{headers: headers}
}

// Get returns the value of the first header named key, or "".
func (c HeaderCarrier) Get(key string) string {
	if c.headers == nil {
		return ""
	}
	for _, h := range *c.headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// Set replaces every header named key by one with value: a message
// forwarded with a new trace context must not carry the old one too.
func (c HeaderCarrier) Set(key, value string) {
	if c.headers == nil {
		return
	}
	hs := (*c.headers)[:0:0]
	for _, h := range *c.headers {
		if h.Key != key {
			hs = append(hs, h)
		}
	}
	*c.headers = append(hs, kafka.Header{Key: key, Value: []byte(value)})
}

// Keys returns the header names, in order, repeated names once.
func (c HeaderCarrier) Keys() []string {
	if c.headers == nil {
		return nil
	}
	keys := make([]string, 0, len(*c.headers))
	seen := make(map[string]bool, len(*c.headers))
	for _, h := range *c.headers {
		if !seen[h.Key] {
			seen[h.Key] = true
			keys = append(keys, h.Key)
		}
	}
	return keys
}

// MessageContext returns a consumer.ContextHook, for consumer.Config.Hooks,
// that extracts the trace context (and baggage) a producer put into the
// message's headers with p, so that the message's spans and the handler's
// continue the producer's trace. A nil p means W3C Trace Context and
// Baggage. A message without such headers keeps ctx. A [Hook] does the
// same; use this alone to propagate without the inbox's spans.
func MessageContext(p propagation.TextMapPropagator) consumer.ContextFunc {
	if p == nil {
		p = defaultPropagator()
	}
	return func(ctx context.Context, msg *consumer.Message) context.Context {
		// A copy of the slice header: extraction only reads, and msg must not
		// be modified.
		hs := msg.Headers
		return p.Extract(ctx, NewHeaderCarrier(&hs))
	}
}

func defaultPropagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// extractContext is ctx with the trace context p finds in msg's headers.
func extractContext(p propagation.TextMapPropagator, ctx context.Context, msg *consumer.Message) context.Context {
	// A copy of the slice header: extraction only reads, and msg must not be
	// modified.
	hs := msg.Headers
	return p.Extract(ctx, NewHeaderCarrier(&hs))
}
