// Package outboxbench measures the outbox relay against producing the same
// events straight to Kafka, on any outbox Store. The adapters' benchmarks
// call it; the numbers go to docs/BENCHMARKS.md.
package outboxbench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/internal/dev/inventory"
	"github.com/inboxgo/inbox/outbox"
)

// Options of a run.
type Options struct {
	Events     int // events per mode
	Keys       int // distinct keys
	ValueBytes int
	Partitions int // of each fresh topic
	Relays     int // relays draining at once
	Writers    int // enqueuing goroutines in the end-to-end mode
	PerTx      int // messages per enqueuing transaction
	Batch      int // messages per relay cycle and per direct write
}

// Defaults returns the options docs/BENCHMARKS.md reports.
func Defaults() Options {
	return Options{Events: 20000, Keys: 1000, ValueBytes: 200, Partitions: 8, Relays: 1, Writers: 4, PerTx: 1, Batch: 500}
}

// Metrics name Relay's results, in order, for b.ReportMetric.
var Metrics = []string{"enqueue-events/s", "drain-events/s", "e2e-events/s"}

// Result is one mode.
type Result struct {
	Mode    string
	Events  int
	Elapsed time.Duration
}

// EventsPerSec is the throughput.
func (r Result) EventsPerSec() float64 { return float64(r.Events) / r.Elapsed.Seconds() }

func (r Result) String() string {
	return fmt.Sprintf("%-28s %6d events in %8v: %8.0f events/s", r.Mode, r.Events, r.Elapsed.Round(time.Millisecond), r.EventsPerSec())
}

func messages(topic string, o Options) []outbox.Message {
	value := make([]byte, o.ValueBytes)
	for i := range value {
		value[i] = 'x'
	}
	msgs := make([]outbox.Message, o.Events)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "key-%d", i%o.Keys), Value: value}
	}
	return msgs
}

// Direct produces the events straight to a fresh topic with the relay's
// writer settings, Batch messages per synchronous write: the reference.
func Direct(ctx context.Context, brokers []string, o Options) (Result, error) {
	topic := fmt.Sprintf("outbox-bench-direct-%d", time.Now().UnixNano())
	if err := inventory.CreateTopic(ctx, brokers[0], topic, o.Partitions); err != nil {
		return Result{}, err
	}
	w := outbox.NewKafkaWriter(brokers...)
	defer w.Close()
	msgs := messages(topic, o)
	kms := make([]kafka.Message, len(msgs))
	at := time.Now().UTC().Format(time.RFC3339Nano)
	for i, m := range msgs {
		// The same headers the outbox adds.
		kms[i] = kafka.Message{Topic: m.Topic, Key: m.Key, Value: m.Value, Headers: []kafka.Header{
			{Key: outbox.HeaderEventID, Value: []byte(outbox.NewEventID(time.Now()))}, {Key: outbox.HeaderEventTime, Value: []byte(at)}}}
	}
	start := time.Now()
	for lo := 0; lo < len(kms); lo += o.Batch {
		if err := w.WriteMessages(ctx, kms[lo:min(lo+o.Batch, len(kms))]...); err != nil {
			return Result{}, err
		}
	}
	return Result{Mode: "direct to Kafka", Events: len(kms), Elapsed: time.Since(start)}, nil
}

// counting counts what the relays acknowledged.
type counting struct {
	mu   sync.Mutex
	n    int
	done chan struct{}
	want int
}

func (c *counting) event(ev outbox.RelayEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n += ev.Published
	if c.n >= c.want && c.done != nil {
		close(c.done)
		c.done = nil
	}
}

// Relay measures two modes on store over db, each on a fresh topic: "relay
// drain" enqueues every event first (PerTx per transaction) and times the
// relays from start to the last acknowledgement; "enqueue to ack" runs
// Writers enqueuing goroutines and the relays together and times from the
// first enqueue to the last acknowledgement.
func Relay(ctx context.Context, db *gorm.DB, store outbox.Store, brokers []string, o Options) ([]Result, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ob, err := outbox.New(db, store, outbox.Config{Logger: quiet})
	if err != nil {
		return nil, err
	}
	if err := ob.Migrate(ctx); err != nil {
		return nil, err
	}
	if _, err := ob.Maintain(ctx); err != nil {
		return nil, err
	}
	var results []Result
	for _, mode := range []string{"relay drain", "enqueue to ack"} {
		topic := fmt.Sprintf("outbox-bench-%d", time.Now().UnixNano())
		if err := inventory.CreateTopic(ctx, brokers[0], topic, o.Partitions); err != nil {
			return nil, err
		}
		msgs := messages(topic, o)
		enqueueAll := func(writers int) error {
			var wg sync.WaitGroup
			errs := make(chan error, writers)
			for w := range writers {
				wg.Go(func() {
					for lo := w * o.PerTx; lo < len(msgs); lo += writers * o.PerTx {
						batch := msgs[lo:min(lo+o.PerTx, len(msgs))]
						if err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return ob.Enqueue(ctx, tx, batch...) }); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			return <-errs
		}
		if mode == "relay drain" {
			start := time.Now()
			if err := enqueueAll(o.Writers); err != nil {
				return nil, err
			}
			results = append(results, Result{Mode: fmt.Sprintf("enqueue only (%d writers, %d/tx)", o.Writers, o.PerTx), Events: len(msgs), Elapsed: time.Since(start)})
		}
		c := &counting{done: make(chan struct{}), want: len(msgs)}
		done := c.done
		runCtx, stop := context.WithCancel(ctx)
		var relays sync.WaitGroup
		var writers []*kafka.Writer
		start := time.Now()
		for i := range o.Relays {
			w := outbox.NewKafkaWriter(brokers...)
			writers = append(writers, w)
			pub, err := outbox.NewKafkaPublisher(w)
			if err != nil {
				stop()
				return nil, err
			}
			r, err := ob.NewRelay(pub, outbox.RelayConfig{ID: fmt.Sprintf("bench-%d", i), MaxMessages: o.Batch, PollInterval: 5 * time.Millisecond, OnEvent: c.event})
			if err != nil {
				stop()
				return nil, err
			}
			relays.Go(func() { _ = r.Run(runCtx) })
		}
		var enqErr error
		if mode == "enqueue to ack" {
			enqErr = enqueueAll(o.Writers)
		}
		select {
		case <-done:
		case <-ctx.Done():
		}
		elapsed := time.Since(start)
		stop()
		relays.Wait()
		for _, w := range writers {
			_ = w.Close()
		}
		if enqErr != nil {
			return nil, enqErr
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		results = append(results, Result{Mode: fmt.Sprintf("%s (%d relay)", mode, o.Relays), Events: len(msgs), Elapsed: elapsed})
	}
	return results, nil
}

// Bench runs Direct and Relay with Defaults once per b.Loop, each time on
// the database and store open returns (and then cleans up), and reports
// every mode's events/s and its ratio to direct producing.
func Bench(b *testing.B, brokers []string, open func() (db *gorm.DB, store outbox.Store, cleanup func(), err error)) {
	for b.Loop() {
		db, store, cleanup, err := open()
		if err != nil {
			if cleanup != nil {
				cleanup()
			}
			b.Fatal(err)
		}
		o := Defaults()
		direct, err := Direct(b.Context(), brokers, o)
		if err != nil {
			cleanup()
			b.Fatal(err)
		}
		relay, err := Relay(b.Context(), db, store, brokers, o)
		cleanup()
		if err != nil {
			b.Fatal(err)
		}
		b.Log(direct)
		b.ReportMetric(direct.EventsPerSec(), "direct-events/s")
		for i, r := range relay {
			b.Logf("%v (%.2fx direct)", r, r.EventsPerSec()/direct.EventsPerSec())
			b.ReportMetric(r.EventsPerSec(), Metrics[i])
		}
	}
}
