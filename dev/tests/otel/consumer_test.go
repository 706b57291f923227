package inboxotel_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	inboxotel "github.com/inboxgo/inbox/otel"
)

// A consumer with the otel Hook in both Configs continues each
// producer's trace: every attempt at a message is a span whose parent is
// the producer's span, with the claim and the handler as children and the
// handler's context in the handler span; the metrics count each message
// once, whatever became of it. The same holds with the hooks given to the
// inbox alone, which the consumer then takes (kfake only: the wiring, not
// the broker, is what differs).
func TestConsumerTracesAndCountsEachMessageOnce(t *testing.T) {
	t.Parallel()
	// The real broker carries the headers as Kafka stores them; kfake is the
	// fast check that needs no server.
	for _, broker := range []string{"kafka", "kfake"} {
		for _, batch := range []bool{false, true} {
			name := broker + "/handler"
			if batch {
				name = broker + "/batch-handler"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				testConsumer(t, batch, broker, false)
			})
			if broker == "kfake" {
				t.Run(name+"/hooks-in-the-inbox", func(t *testing.T) {
					t.Parallel()
					testConsumer(t, batch, broker, true)
				})
			}
		}
	}
}

// testConsumer runs the consumer with the hooks in both Configs, or, with
// inboxOnly, in the inbox's alone.
func testConsumer(t *testing.T, batch bool, broker string, inboxOnly bool) {
	tel := newTelemetry(t)
	brokers, topics := newBroker(t, broker, "orders", "orders-dlq")
	topic, dlq := topics[0], topics[1]
	// "a" twice: the producer's retry, a duplicate. "bad" fails every time
	// and is dead-lettered after its second attempt.
	sent := produce(t, brokers, topic, "a", "b", "bad", "a")
	db, store := newDB(t)

	var mu sync.Mutex
	handlerTraces := map[string]trace.SpanContext{} // key -> the handler's span context
	effect := func(ctx context.Context, tx *gorm.DB, m consumer.Message) error {
		mu.Lock()
		handlerTraces[string(m.Key)] = trace.SpanContextFromContext(ctx)
		mu.Unlock()
		if string(m.Key) == "bad" {
			return errors.New("bad order")
		}
		return tx.Exec(`INSERT INTO effects (id) VALUES (?)`, m.EventID).Error
	}
	ev := &eventCounts{}
	icfg := inbox.Config{Logger: slog.New(slog.DiscardHandler)}
	ccfg := consumer.Config{
		Brokers:  brokers,
		GroupID:  "inventory",
		Topics:   []string{topic},
		Consumer: "reserve-stock",
		Failure: consumer.FailureConfig{
			MaxAttempts:     2,
			Policy:          consumer.DeadLetter,
			DeadLetterTopic: dlq,
			MinBackoff:      time.Millisecond,
			MaxBackoff:      5 * time.Millisecond,
		},
		Kafka: consumer.KafkaConfig{
			MaxWait:        100 * time.Millisecond,
			SessionTimeout: 6 * time.Second,
		},
		Logger: slog.New(slog.DiscardHandler),
		Hooks:  []hooks.Hook{hooks.EventFunc(ev.on)}, // the user's own hook, still called
	}
	if batch {
		ccfg.BatchSize, ccfg.BatchWait = 10, 200*time.Millisecond
		ccfg.BatchHandler = func(ctx context.Context, tx *gorm.DB, msgs []consumer.Message) error {
			for _, m := range msgs {
				if err := effect(ctx, tx, m); err != nil {
					return err
				}
			}
			return nil
		}
	} else {
		ccfg.Handler = effect
	}
	otelOpts := tel.opts
	otelOpts.ConsumerGroup = ccfg.GroupID
	otelHook, err := inboxotel.New(otelOpts)
	if err != nil {
		t.Fatal(err)
	}
	icfg.Hooks = append(icfg.Hooks, otelHook)
	ccfg.Hooks = append(ccfg.Hooks, otelHook)
	if inboxOnly {
		icfg.Hooks, ccfg.Hooks = ccfg.Hooks, nil
	}
	ib, err := inbox.New(db, store, icfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	ccfg.Inbox = ib
	c, err := consumer.New(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	waitUntil(t, 30*time.Second, "4 messages decided", func() bool {
		return ev.count(hooks.Processed, hooks.Duplicate, hooks.DeadLettered) == 4
	})
	_ = c.Close()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}

	// Spans.
	spans := tel.spans.Ended()
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byID[s.SpanContext().SpanID()] = s
	}
	var messageSpans int
	outcomes := map[string][]string{} // key -> outcome of each attempt
	children := map[trace.SpanID][]string{}
	for _, s := range spans {
		children[s.Parent().SpanID()] = append(children[s.Parent().SpanID()], s.Name())
	}
	for _, s := range spans {
		if s.Name() != "process "+topic {
			continue
		}
		messageSpans++
		a := s.Attributes()
		off, _ := strconv.Atoi(attr(a, "messaging.kafka.offset"))
		if off < 0 || off >= len(sent) {
			t.Fatalf("message span with offset %d", off)
		}
		want := sent[off]
		if s.Parent().SpanID() != want.parent.SpanID() || s.SpanContext().TraceID() != want.parent.TraceID() || !s.Parent().IsRemote() {
			t.Errorf("message span of offset %d: parent %v, trace %v; want the producer's span %v", off, s.Parent().SpanID(), s.SpanContext().TraceID(), want.parent.SpanID())
		}
		if s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("message span kind %v", s.SpanKind())
		}
		for k, v := range map[attribute.Key]string{
			"messaging.system":                   "kafka",
			"messaging.destination.name":         topic,
			"messaging.destination.partition.id": "0",
			"messaging.kafka.partition":          "0",
			"messaging.message.id":               "evt-" + want.key,
			"messaging.consumer.group.name":      "inventory",
			"inbox.consumer":                     "reserve-stock",
		} {
			if got := attr(a, k); got != v {
				t.Errorf("offset %d: %s = %q, want %q", off, k, got, v)
			}
		}
		outcome := attr(a, "inbox.outcome")
		outcomes[want.key] = append(outcomes[want.key], outcome)
		if (outcome == "failed") != (s.Status().Code == codes.Error) {
			t.Errorf("offset %d: outcome %s with status %v", off, outcome, s.Status())
		}
		if !batch {
			kids := fmt.Sprint(children[s.SpanContext().SpanID()])
			wantKids := "[inbox claim inbox handler]"
			if outcome == "duplicate" {
				wantKids = "[inbox claim]"
			}
			if kids != wantKids {
				t.Errorf("offset %d (%s): children %s, want %s", off, outcome, kids, wantKids)
			}
		}
	}
	wantOutcomes := map[string]string{"a": "[processed duplicate]", "b": "[processed]", "bad": "[failed failed]"}
	for k, w := range wantOutcomes {
		if got := fmt.Sprint(outcomes[k]); got != w {
			t.Errorf("spans of %s: outcomes %s, want %s", k, got, w)
		}
	}
	if messageSpans != 5 {
		t.Errorf("%d message spans, want 5 (bad tried twice)", messageSpans)
	}
	// Claims and handlers are children of message spans, and the handler
	// ran in its span, in the producer's trace.
	for _, s := range spans {
		switch s.Name() {
		case "inbox claim", "inbox handler":
			if p, ok := byID[s.Parent().SpanID()]; !ok || p.Name() != "process "+topic {
				t.Errorf("%s span not under a message span", s.Name())
			}
		}
	}
	for k, sc := range handlerTraces {
		if h, ok := byID[sc.SpanID()]; !ok || h.Name() != "inbox handler" {
			t.Errorf("handler of %s ran in span %v, not in a handler span", k, sc.SpanID())
		}
		if !batch && sc.TraceID() != traceOf(sent, k) {
			t.Errorf("handler of %s ran in trace %v, not the producer's", k, sc.TraceID())
		}
	}

	// Metrics: each message counted once.
	if got := fmt.Sprint(tel.counts(t, "inbox.messages", "inbox.outcome")); got != "map[duplicate:1 failed:1 processed:2]" {
		t.Errorf("inbox.messages %s, want duplicate:1 failed:1 processed:2", got)
	}
	if got := fmt.Sprint(tel.counts(t, "inbox.messages", "inbox.dedup")); got != "map[:1 row:3]" {
		t.Errorf("inbox.messages by dedup path %s, want row:3 (and the failed one without)", got)
	}
	if got := fmt.Sprint(tel.counts(t, "inbox.dead_letters", "")); got != "map[:1]" {
		t.Errorf("inbox.dead_letters %s, want 1", got)
	}
	if got := fmt.Sprint(tel.counts(t, "inbox.retries", "inbox.retry.kind")); got != "map[message:1]" {
		t.Errorf("inbox.retries %s, want message:1", got)
	}
	var attempts uint64
	for _, dp := range tel.points(t, "inbox.processing.duration") {
		attempts += dp.(metricdata.HistogramDataPoint[float64]).Count
	}
	if attempts != 5 {
		t.Errorf("inbox.processing.duration counted %d, want 5 (one per attempt at a message)", attempts)
	}
	lag := tel.points(t, "inbox.consumer.lag")
	if len(lag) != 1 || lag[0].(metricdata.DataPoint[int64]).Value != 0 {
		t.Errorf("inbox.consumer.lag %+v, want one point at 0", lag)
	}
}

func traceOf(sent []sent, key string) trace.TraceID {
	for _, s := range sent {
		if s.key == key {
			return s.parent.TraceID()
		}
	}
	return trace.TraceID{}
}

// A naturally idempotent consumer has no inbox: the otel Hook in the
// consumer's Hooks alone still runs the handler in the producer's trace,
// and the consumer's events are counted.
func TestNaturallyIdempotentConsumer(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	brokers := newKfake(t, "orders")
	sent := produce(t, brokers, "orders", "a", "b")
	db, store := newDB(t)
	var mu sync.Mutex
	handlerSpans := map[string]trace.SpanContext{}
	ev := &eventCounts{}
	ccfg := consumer.Config{
		Brokers:             brokers,
		GroupID:             "view",
		Topics:              []string{"orders"},
		NaturallyIdempotent: true,
		DB:                  db,
		Classifier:          store,
		Handler: func(ctx context.Context, tx *gorm.DB, m consumer.Message) error {
			mu.Lock()
			handlerSpans[string(m.Key)] = trace.SpanContextFromContext(ctx)
			mu.Unlock()
			return nil
		},
		Kafka: consumer.KafkaConfig{
			MaxWait:        100 * time.Millisecond,
			SessionTimeout: 6 * time.Second,
		},
		Logger: slog.New(slog.DiscardHandler),
		Hooks:  []hooks.Hook{hooks.EventFunc(ev.on)},
	}
	otelOpts := tel.opts
	otelOpts.ConsumerGroup = ccfg.GroupID
	otelHook, err := inboxotel.New(otelOpts)
	if err != nil {
		t.Fatal(err)
	}
	ccfg.Hooks = append(ccfg.Hooks, otelHook)
	c, err := consumer.New(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	waitUntil(t, 30*time.Second, "2 messages", func() bool { return ev.count(hooks.Processed) == 2 })
	_ = c.Close()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, s := range sent {
		if got := handlerSpans[s.key]; got.SpanID() != s.parent.SpanID() || !got.IsRemote() {
			t.Errorf("handler of %s in span %v, want the producer's %v", s.key, got.SpanID(), s.parent.SpanID())
		}
	}
	if got := fmt.Sprint(tel.counts(t, "inbox.messages", "inbox.outcome")); got != "map[processed:2]" {
		t.Errorf("inbox.messages %s, want processed:2", got)
	}
	if got := fmt.Sprint(tel.counts(t, "inbox.messages", "inbox.dedup")); got != "map[none:2]" {
		t.Errorf("inbox.messages by inbox.dedup %s, want none:2 (no inbox row, no watermark)", got)
	}
}
