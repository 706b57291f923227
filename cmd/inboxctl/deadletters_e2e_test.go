package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/inbox"
)

// TestRedriveThroughTheConsumer: a real consumer dead-letters an event its
// handler cannot apply; once the handler is fixed, redrive puts it back and
// the consumer applies it exactly once, and a second redrive of the same
// dead letter is a duplicate its inbox row catches.
func TestRedriveThroughTheConsumer(t *testing.T) {
	brokers := testBrokers(t)
	orders := newTopic(t, brokers, "orders", 2)
	dlq := newTopic(t, brokers, "orders-dlq", 1)
	db := openGorm(t, dialectSQLite, emptySQLite(t))
	if err := db.Exec(`CREATE TABLE applied (event_id TEXT NOT NULL)`).Error; err != nil {
		t.Fatal(err)
	}
	store, err := inboxsqlite.New(inboxsqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(db, store, inbox.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	var fixed atomic.Bool
	c, err := consumer.New(consumer.Config{
		Brokers: brokers, GroupID: "billing-" + orders, Topics: []string{orders},
		Inbox: ib, Consumer: "billing",
		Handler: func(ctx context.Context, tx *gorm.DB, m consumer.Message) error {
			if m.EventID == "e-bad" && !fixed.Load() {
				return errors.New("cannot apply e-bad yet")
			}
			return tx.Exec(`INSERT INTO applied VALUES (?)`, m.EventID).Error
		},
		Failure: consumer.FailureConfig{
			Policy:          consumer.DeadLetter,
			DeadLetterTopic: dlq,
			MaxAttempts:     2,
			MinBackoff:      10 * time.Millisecond,
			MaxBackoff:      20 * time.Millisecond,
		},
		Kafka:  consumer.KafkaConfig{StartOffset: kafka.FirstOffset},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("consumer Run: %v", err)
		}
	})

	at := []byte(time.Now().UTC().Format(time.RFC3339))
	msg := func(p int, id string) kafka.Message {
		return kafka.Message{Partition: p, Key: []byte("k-" + id), Value: []byte(id), Headers: []kafka.Header{
			{Key: header.EventID, Value: []byte(id)}, {Key: header.EventTime, Value: at}}}
	}
	produce(t, brokers, orders, msg(0, "e-1"), msg(1, "e-bad"), msg(1, "e-2"))
	count := func(id string) int {
		var n int
		if err := db.Raw(`SELECT COUNT(*) FROM applied WHERE event_id = ?`, id).Scan(&n).Error; err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, 60*time.Second, "e-1 and e-2 applied and e-bad dead-lettered", func() bool {
		return count("e-1") == 1 && count("e-2") == 1 && len(readAllQuiet(brokers, dlq)) == 1
	})
	if n := count("e-bad"); n != 0 {
		t.Fatalf("e-bad applied %d times before the fix", n)
	}

	fixed.Store(true)
	q := &deadLetterQuery{brokers: brokers, topic: dlq, partition: -1, offset: -1, idle: 10 * time.Second, originalTopic: orders}
	for round := 1; round <= 2; round++ {
		res, err := redrive(t.Context(), q, redriveOptions{rate: 50}, io.Discard)
		if err != nil || len(res.Redriven) != 1 || res.Redriven[0].EventID != "e-bad" || res.Redriven[0].Partition != 1 {
			t.Fatalf("redrive round %d: %+v %v", round, res, err)
		}
		want := inbox.Counters{Processed: 3, Duplicates: uint64(round - 1)}
		waitFor(t, 60*time.Second, "the redriven e-bad to be consumed", func() bool {
			got := ib.Counters()
			return got.Processed == want.Processed && got.Duplicates == want.Duplicates
		})
	}
	for _, id := range []string{"e-1", "e-2", "e-bad"} {
		if n := count(id); n != 1 {
			t.Errorf("%s applied %d times, want once", id, n)
		}
	}
	if n := len(readAllQuiet(brokers, dlq)); n != 1 {
		t.Errorf("the dead-letter topic holds %d messages, want the 1 dead letter", n)
	}
}

// readAllQuiet is readAll for a polling condition: nil on any error.
func readAllQuiet(brokers []string, topic string) []kafka.Message {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []kafka.Message
	q := &deadLetterQuery{brokers: brokers, topic: topic, partition: -1, offset: -1, idle: 5 * time.Second}
	_, err := scanDeadLetters(ctx, q, io.Discard, func(d deadLetter) error {
		out = append(out, d.msg)
		return nil
	})
	if err != nil {
		return nil
	}
	return out
}
