package consumer

// Benchmarks of the consumer's own per-message cost, with no server: the
// in-memory broker and SQLite. One op is one message, consumed and
// committed; allocs/op is what the consumer, the inbox and the database
// driver allocate for it together (run with -benchmem, and -memprofile to
// see whose). The SQLite transaction's cost is shared by a batch's
// messages, so with batches the consumer's per-message work shows.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/sqlitetest"
	"github.com/inboxgo/inbox/transport/memtransport"
)

// BenchmarkConsumerSequencedBatch: sequenced dedup, a batch handler, batches
// of 100.
func BenchmarkConsumerSequencedBatch(b *testing.B) {
	benchConsumer(b, true, func(cfg *Config) {
		cfg.BatchHandler = func(context.Context, *gorm.DB, []Message) error { return nil }
		cfg.BatchSize = 100
	})
}

// BenchmarkConsumerRowsBatch: inbox rows, a batch handler, batches of 100.
func BenchmarkConsumerRowsBatch(b *testing.B) {
	benchConsumer(b, false, func(cfg *Config) {
		cfg.BatchHandler = func(context.Context, *gorm.DB, []Message) error { return nil }
		cfg.BatchSize = 100
	})
}

// BenchmarkConsumerHandlerDefault: inbox rows, a per-message Handler, the
// default settings.
func BenchmarkConsumerHandlerDefault(b *testing.B) {
	benchConsumer(b, false, func(cfg *Config) {
		cfg.Handler = func(context.Context, *gorm.DB, Message) error { return nil }
	})
}

// benchConsumer consumes b.N messages of one partition (sequenced ones of
// an aligned trusted source if seq) with the consumer set by set, at log
// level Info and with no hooks, until their offsets are committed.
func benchConsumer(b *testing.B, seq bool, set func(cfg *Config)) {
	cluster := memtransport.NewCluster()
	if err := cluster.CreateTopic("orders", 1); err != nil {
		b.Fatal(err)
	}
	db := sqlitetest.Open(b)
	log := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ib, err := inbox.New(db, &sqlitetest.Store{}, inbox.Config{Logger: log, RetentionDays: 30})
	if err != nil {
		b.Fatal(err)
	}
	if err := ib.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	msgs := make([]kafka.Message, b.N)
	for i := range msgs {
		id := fmt.Sprintf("e%d", i)
		if seq {
			msgs[i] = sequenced(id, "orders-outbox", 0, int64(i+1), 1)
		} else {
			msgs[i] = event(id, id)
		}
	}
	if err := cluster.ProduceTo("orders", 0, msgs...); err != nil {
		b.Fatal(err)
	}
	cfg := Config{
		Kafka: KafkaConfig{
			Transport:      cluster.Client(memtransport.Eager),
			CommitInterval: 5 * time.Millisecond,
		},
		GroupID:  "inventory",
		Topics:   []string{"orders"},
		Inbox:    ib,
		Consumer: "reserve-stock",
		Logger:   log,
	}
	if seq {
		cfg.Sequenced.Sources = []string{"orders-outbox"}
	}
	set(&cfg)
	c, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.ReportAllocs()
	b.ResetTimer()
	go func() { done <- c.Run(ctx) }()
	for next := int64(0); next < int64(b.N); next, _ = cluster.Committed("inventory", "orders", 0) {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		b.Fatal(err)
	}
}
