package inboxotel_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/storage"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	inboxotel "github.com/inboxgo/inbox/otel"
)

// telemetry is an in-memory OpenTelemetry SDK: the spans ended so far and
// the metrics collected on demand.
type telemetry struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	opts   inboxotel.Options
}

func newTelemetry(t *testing.T) *telemetry {
	t.Helper()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	return &telemetry{spans: spans, reader: reader, opts: inboxotel.Options{TracerProvider: tp, MeterProvider: mp}}
}

// counts returns the sums of the counter name by the value of the attribute
// key ("" for points without it).
func (tel *telemetry) counts(t *testing.T, name string, key attribute.Key) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, dp := range tel.points(t, name) {
		sum, ok := dp.(metricdata.DataPoint[int64])
		if !ok {
			t.Fatalf("%s: %T, not an int64 data point", name, dp)
		}
		v, _ := sum.Attributes.Value(key)
		out[v.AsString()] += sum.Value
	}
	return out
}

// points returns the data points of the metric name.
func (tel *telemetry) points(t *testing.T, name string) []any {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tel.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var out []any
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					out = append(out, dp)
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					out = append(out, dp)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					out = append(out, dp)
				}
			default:
				t.Fatalf("%s: unexpected data %T", name, m.Data)
			}
		}
	}
	return out
}

// attr returns the value of key among attrs, as a string.
func attr(attrs []attribute.KeyValue, key attribute.Key) string {
	for _, kv := range attrs {
		if kv.Key == key {
			return kv.Value.String()
		}
	}
	return ""
}

// newKfake starts an in-process Kafka cluster with the topics created.
func newKfake(t *testing.T, topics ...string) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topics...), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// newBroker returns the brokers of kind "kfake" (an in-process cluster with
// the topics) or "kafka" (the real broker of make test, with topics of
// fresh names made from the given ones), and the topics' names.
func newBroker(t *testing.T, kind string, topics ...string) ([]string, []string) {
	t.Helper()
	if kind == "kfake" {
		return newKfake(t, topics...), topics
	}
	brokers := testservers.KafkaBrokers(t)
	suffix := "-" + conformance.RandomSuffix()
	names := make([]string, len(topics))
	configs := make([]kafka.TopicConfig, len(topics))
	for i, topic := range topics {
		names[i] = topic + suffix
		configs[i] = kafka.TopicConfig{Topic: names[i], NumPartitions: 1, ReplicationFactor: 1}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...)}
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: configs})
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range res.Errors {
		if err != nil {
			t.Fatalf("create topic %s: %v", name, err)
		}
	}
	return brokers, names
}

// sent is a message produced under a span of its own, as an instrumented
// producer does.
type sent struct {
	key    string
	parent trace.SpanContext // the producer's span
}

// produce writes one message per key to topic, each with the event id
// "evt-"+key and the trace context of a producer span of its own, injected
// into its headers with W3C Trace Context. A repeated key is the
// producer's retry: the same event, in a new span.
func produce(t *testing.T, brokers []string, topic string, keys ...string) []sent {
	t.Helper()
	producer := sdktrace.NewTracerProvider().Tracer("producer")
	at := time.Now().UTC().Truncate(time.Second).Format(time.RFC3339)
	var out []sent
	var msgs []kafka.Message
	for _, k := range keys {
		ctx, span := producer.Start(context.Background(), "send "+topic, trace.WithSpanKind(trace.SpanKindProducer))
		m := kafka.Message{Key: []byte(k), Value: []byte(k), Headers: []kafka.Header{
			{Key: header.EventID, Value: []byte("evt-" + k)},
			{Key: header.EventTime, Value: []byte(at)},
		}}
		propagation.TraceContext{}.Inject(ctx, inboxotel.NewHeaderCarrier(&m.Headers))
		span.End()
		msgs = append(msgs, m)
		out = append(out, sent{key: k, parent: span.SpanContext()})
	}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		err := w.WriteMessages(ctx, msgs...)
		if err == nil {
			return out
		}
		if ctx.Err() != nil || !errors.Is(err, kafka.UnknownTopicOrPartition) && !errors.Is(err, kafka.LeaderNotAvailable) {
			t.Fatalf("produce to %s: %v", topic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// newDB opens a SQLite database with the inbox's Store and an effects
// table the handlers write to.
func newDB(t *testing.T) (*gorm.DB, storage.InboxStore) {
	t.Helper()
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "t.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			s.Close()
		}
	})
	if err := db.Exec(`CREATE TABLE effects (id TEXT NOT NULL)`).Error; err != nil {
		t.Fatal(err)
	}
	store, err := inboxsqlite.New(inboxsqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return db, store
}

// eventCounts counts a consumer's events by kind.
type eventCounts struct {
	mu sync.Mutex
	n  map[hooks.Kind]int
}

func (e *eventCounts) on(ev hooks.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[hooks.Kind]int{}
	}
	e.n[ev.Kind]++
}

func (e *eventCounts) count(kinds ...hooks.Kind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, k := range kinds {
		n += e.n[k]
	}
	return n
}

// waitUntil polls cond until it holds or d passes.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
