package consumer_test

import (
	"context"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"
)

// A handler that ignores a failed statement of its own and returns nil has,
// on PostgreSQL, aborted the transaction (25P02): the stored offset's write
// that follows fails too. That is the message's doing, so it counts the
// message's attempts and reaches the failure policy; it must never be
// retried as a failing database, which would hold the partition for ever.
func TestIgnoredStatementFailureIsTheMessages(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders", "orders.dlq")
	s := newPostgresShop(t)
	sendOrders(t, brokers, "orders", 1, 4, nil)
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.Offsets.Store, cfg.Offsets.Table = true, "inbox_offsets"+s.suffix
	cfg.Failure.Policy, cfg.Failure.DeadLetterTopic, cfg.Failure.MaxAttempts = consumer.DeadLetter, "orders.dlq", 3
	cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
		if string(msg.Key) == "order-2" {
			_ = tx.Exec(`INSERT INTO no_such_table_` + s.suffix + ` VALUES (1)`).Error // ignored
			return nil
		}
		return s.reserve(ctx, tx, msg)
	}
	r := start(t, cfg)
	waitUntil(t, 60*time.Second, "3 processed and 1 dead letter", func() bool {
		return ev.count(hooks.Processed) == 3 && ev.count(hooks.DeadLettered) == 1
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if n := ev.count(hooks.Retry); n != 2 {
		t.Errorf("%d retries, want 2 (3 attempts of the message, none of a batch)", n)
	}
	s.checkExactlyOnce(t, 4, map[int]bool{2: true})
}
