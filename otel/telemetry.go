package inboxotel

import (
	"context"
	"errors"
	"strconv"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/storage"
)

// Attribute keys: OpenTelemetry's messaging semantic conventions where they
// have one, inbox.* for the rest.
const (
	keyMessagingSystem = attribute.Key("messaging.system")
	keyOperationType   = attribute.Key("messaging.operation.type")
	keyOperationName   = attribute.Key("messaging.operation.name")
	keyDestination     = attribute.Key("messaging.destination.name")
	keyPartitionID     = attribute.Key("messaging.destination.partition.id")
	keyKafkaPartition  = attribute.Key("messaging.kafka.partition")
	keyKafkaOffset     = attribute.Key("messaging.kafka.offset")
	keyMessageID       = attribute.Key("messaging.message.id")
	keyConsumerGroup   = attribute.Key("messaging.consumer.group.name")
	keyConsumer        = attribute.Key("inbox.consumer")
	keyOutcome         = attribute.Key("inbox.outcome")
	keyRetryKind       = attribute.Key("inbox.retry.kind")
	keyClaimRows       = attribute.Key("inbox.claim.rows")
	keyClaimNew        = attribute.Key("inbox.claim.new")
	keyHandlerMessages = attribute.Key("inbox.handler.messages")
	// keyDedup says how a processed or duplicate message was deduplicated:
	// dedupRow (an inbox row), dedupWatermark (its sequenced stream's
	// watermark) or, for a naturally idempotent consumer's, dedupNone.
	keyDedup              = attribute.Key("inbox.dedup")
	outcomeFailed         = "failed"
	dedupRow              = "row"
	dedupWatermark        = "watermark"
	dedupNone             = "none"
	spanNameClaim         = "inbox claim"
	spanNameHandler       = "inbox handler"
	spanNameProcessPrefix = "process"
)

// telemetry is one instrumentation: its tracer, propagator and instruments.
type telemetry struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	group  string // Options.ConsumerGroup

	messages    metric.Int64Counter
	retries     metric.Int64Counter
	deadLetters metric.Int64Counter
	duration    metric.Float64Histogram
	lag         metric.Int64Gauge
}

func newTelemetry(opts Options) (*telemetry, error) {
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	mp := opts.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	t := &telemetry{
		tracer: tp.Tracer(ScopeName),
		prop:   opts.Propagator,
		group:  opts.ConsumerGroup,
	}
	if t.prop == nil {
		t.prop = defaultPropagator()
	}
	m := mp.Meter(ScopeName)
	var errs [5]error
	t.messages, errs[0] = m.Int64Counter("inbox.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Messages by outcome (processed, duplicate, failed), each counted once when its fate is decided."))
	t.retries, errs[1] = m.Int64Counter("inbox.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("Retries by kind: transaction (a transient database failure), message (a failed message tried again), batch (a batch that could not commit)."))
	t.deadLetters, errs[2] = m.Int64Counter("inbox.dead_letters", metric.WithUnit("{message}"),
		metric.WithDescription("Messages published to the dead-letter topic."))
	t.duration, errs[3] = m.Float64Histogram("inbox.processing.duration", metric.WithUnit("s"),
		metric.WithDescription("Time the inbox took for a message, from the call to its outcome, per attempt."))
	t.lag, errs[4] = m.Int64Gauge("inbox.consumer.lag", metric.WithUnit("{message}"),
		metric.WithDescription("Messages of a partition behind the next offset to process, as of the last fetch."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *telemetry) startMessage(ctx context.Context, m storage.InboxRow) (context.Context, func(hooks.Kind, error)) {
	start := time.Now()
	name := spanNameProcessPrefix
	attrs := make([]attribute.KeyValue, 0, 12)
	attrs = append(attrs,
		keyOperationType.String("process"),
		keyOperationName.String("process"),
		keyMessageID.String(m.EventID),
		keyConsumer.String(m.Consumer),
	)
	if m.Topic != "" {
		// Provenance is set only for messages from a broker.
		name += " " + m.Topic
		attrs = append(attrs,
			keyMessagingSystem.String("kafka"),
			keyDestination.String(m.Topic),
			keyPartitionID.String(strconv.Itoa(int(m.Partition))),
			keyKafkaPartition.Int(int(m.Partition)),
			keyKafkaOffset.Int64(m.Offset),
		)
	}
	if t.group != "" {
		attrs = append(attrs, keyConsumerGroup.String(t.group))
	}
	dedup := dedupRow
	if hooks.IsSequenced(ctx, m) {
		dedup = dedupWatermark
	}
	ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	return ctx, func(o hooks.Kind, err error) {
		outcome := []attribute.KeyValue{keyOutcome.String(o.String())}
		if o == hooks.Processed || o == hooks.Duplicate {
			outcome = append(outcome, keyDedup.String(dedup))
		}
		span.SetAttributes(outcome...)
		endSpan(span, err)
		t.duration.Record(context.Background(), time.Since(start).Seconds(),
			metric.WithAttributes(t.messageAttrs(m.Consumer, m.Topic, outcome...)...))
	}
}

func (t *telemetry) startClaim(ctx context.Context, rows []storage.InboxRow) (context.Context, func([]bool, error)) {
	ctx, span := t.tracer.Start(ctx, spanNameClaim, trace.WithAttributes(keyClaimRows.Int(len(rows))))
	return ctx, func(inserted []bool, err error) {
		if err == nil {
			n := 0
			for _, ins := range inserted {
				if ins {
					n++
				}
			}
			span.SetAttributes(keyClaimNew.Int(n))
		}
		endSpan(span, err)
	}
}

func (t *telemetry) startHandler(ctx context.Context, msgs []storage.InboxRow) (context.Context, func(error)) {
	ctx, span := t.tracer.Start(ctx, spanNameHandler, trace.WithAttributes(keyHandlerMessages.Int(len(msgs))))
	return ctx, func(err error) { endSpan(span, err) }
}

// endSpan ends span, marking it failed with err if there is one.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// onEvent counts an event: the message outcomes (each reported once, by
// the inbox used alone or by the consumer), retries, dead letters and lag.
func (t *telemetry) onEvent(ev hooks.Event) {
	ctx := context.Background()
	switch ev.Kind {
	case hooks.Processed, hooks.Duplicate:
		dedup := dedupRow
		switch {
		case ev.Sequenced:
			dedup = dedupWatermark
		case ev.NoDedup:
			dedup = dedupNone
		}
		t.messages.Add(ctx, 1, metric.WithAttributes(t.messageAttrs(ev.Consumer, ev.Topic, keyOutcome.String(ev.Kind.String()), keyDedup.String(dedup))...))
	case hooks.Failed:
		t.messages.Add(ctx, 1, metric.WithAttributes(t.messageAttrs(ev.Consumer, ev.Topic, keyOutcome.String(ev.Kind.String()))...))
	case hooks.DeadLettered:
		t.deadLetters.Add(ctx, 1, metric.WithAttributes(t.messageAttrs(ev.Consumer, ev.Topic)...))
		t.messages.Add(ctx, 1, metric.WithAttributes(t.messageAttrs(ev.Consumer, ev.Topic, keyOutcome.String(outcomeFailed))...))
	case hooks.PartitionStopped:
		// A partition stopped at its start offset stopped at no message.
		var pe *consumer.PartitionStoppedError
		if errors.As(ev.Err, &pe) && pe.Reason == consumer.ReasonOffsetBeyondLogEnd {
			return
		}
		t.messages.Add(ctx, 1, metric.WithAttributes(t.messageAttrs(ev.Consumer, ev.Topic, keyOutcome.String(outcomeFailed))...))
	case hooks.Retry:
		t.retries.Add(ctx, 1, metric.WithAttributes(t.messageAttrs(ev.Consumer, ev.Topic, keyRetryKind.String(ev.Scope.String()))...))
	case hooks.Lag:
		t.lag.Record(ctx, ev.Lag, metric.WithAttributes(t.messageAttrs(ev.Consumer, ev.Topic,
			keyPartitionID.String(strconv.Itoa(ev.Partition)))...))
	}
}

// messageAttrs are the metric attributes of a message of consumerName from
// topic (either may be empty, then left out), followed by extra.
func (t *telemetry) messageAttrs(consumerName, topic string, extra ...attribute.KeyValue) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 4+len(extra))
	if consumerName != "" {
		attrs = append(attrs, keyConsumer.String(consumerName))
	}
	if t.group != "" {
		attrs = append(attrs, keyConsumerGroup.String(t.group))
	}
	if topic != "" {
		attrs = append(attrs, keyMessagingSystem.String("kafka"), keyDestination.String(topic))
	}
	return append(attrs, extra...)
}
