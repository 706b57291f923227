package inboxotel_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/inbox"
	inboxotel "github.com/inboxgo/inbox/otel"
)

// A consumer wired with one otel Hook in the inbox's and the consumer's Hooks: the producer sends an order
// twice (a retry) from a traced request; the consumer's spans continue
// the producer's trace, and the metrics count one processed message and
// one duplicate. In a service the providers are the global ones (leave
// Options empty) with real exporters.
func ExampleNew_consumer() {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))

	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	dir, _ := os.MkdirTemp("", "inboxotel-example")
	defer os.RemoveAll(dir)
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(dir, "shop.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}

	// The producer's side: its span's context goes into the headers.
	ctx, request := tp.Tracer("checkout").Start(context.Background(), "POST /orders")
	msg := kafka.Message{Key: []byte("order-1"), Headers: []kafka.Header{
		{Key: "event_id", Value: []byte("OrderCreated/order-1")},
		{Key: "event_time", Value: []byte(time.Now().UTC().Format(time.RFC3339))},
	}}
	propagation.TraceContext{}.Inject(ctx, inboxotel.NewHeaderCarrier(&msg.Headers))
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: "orders", BatchTimeout: time.Millisecond}
	if err := w.WriteMessages(context.Background(), msg, msg); err != nil {
		log.Fatal(err)
	}
	w.Close()
	request.End()

	// The consumer's side: instrument both configurations, then build.
	icfg := inbox.Config{}
	ccfg := consumer.Config{
		Brokers:  brokers,
		GroupID:  "inventory",
		Topics:   []string{"orders"},
		Consumer: "reserve-stock",
		Handler: func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
			return nil // the reservation, written through tx, traced under ctx
		},
		Logger: slog.New(slog.DiscardHandler),
	}
	opts := inboxotel.Options{TracerProvider: tp, MeterProvider: mp}
	otelOpts := opts
	otelOpts.ConsumerGroup = ccfg.GroupID
	otelHook, err := inboxotel.New(otelOpts)
	if err != nil {
		log.Fatal(err)
	}
	icfg.Hooks = append(icfg.Hooks, otelHook)
	ccfg.Hooks = append(ccfg.Hooks, otelHook)
	store, _ := inboxsqlite.New(inboxsqlite.Options{})
	ib, err := inbox.New(db, store, icfg)
	if err != nil {
		log.Fatal(err)
	}
	if err := ib.Migrate(context.Background()); err != nil {
		log.Fatal(err)
	}
	ccfg.Inbox = ib
	c, err := consumer.New(ccfg)
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = c.Run(context.Background()) }()
	for ib.Counters().Processed+ib.Counters().Duplicates < 2 {
		time.Sleep(20 * time.Millisecond)
	}
	c.Close()

	for _, s := range spans.Ended() {
		if s.Name() != "process orders" {
			continue
		}
		var children []string
		for _, k := range spans.Ended() {
			if k.Parent().SpanID() == s.SpanContext().SpanID() {
				children = append(children, k.Name())
			}
		}
		outcome := ""
		for _, a := range s.Attributes() {
			if a.Key == "inbox.outcome" {
				outcome = a.Value.AsString()
			}
		}
		fmt.Printf("%s: %s, in the request's trace: %t, children %v\n", s.Name(), outcome,
			s.Parent().SpanID() == request.SpanContext().SpanID(), children)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name != "inbox.messages" {
			continue
		}
		var counts []string
		for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
			o, _ := dp.Attributes.Value("inbox.outcome")
			counts = append(counts, fmt.Sprintf("%s=%d", o.AsString(), dp.Value))
		}
		slices.Sort(counts)
		fmt.Println("inbox.messages:", counts)
	}
	// Output:
	// process orders: processed, in the request's trace: true, children [inbox claim inbox handler]
	// process orders: duplicate, in the request's trace: true, children [inbox claim]
	// inbox.messages: [duplicate=1 processed=1]
}
