package outbox_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

func newOutbox(t testing.TB, db *gorm.DB, store storage.OutboxStore, cfg outbox.Config) *outbox.Outbox {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ob, err := outbox.New(db, store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ob
}

func enqueue(ctx context.Context, db *gorm.DB, ob *outbox.Outbox, msgs ...outbox.Message) error {
	return db.Transaction(func(tx *gorm.DB) error { return ob.Enqueue(ctx, tx, msgs...) })
}

// headers returns m's headers by name, each name's values in order.
func headers(m kafka.Message) map[string][]string {
	out := map[string][]string{}
	for _, h := range m.Headers {
		out[h.Key] = append(out[h.Key], string(h.Value))
	}
	return out
}
