package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"

	"gorm.io/gorm"
)

type orderKey struct{}

// withOrderKey is a MessageContext hook: it puts the message's key into
// the context, as a trace propagator puts the producer's span there.
func withOrderKey(ctx context.Context, msg *consumer.Message) context.Context {
	return context.WithValue(ctx, orderKey{}, string(msg.Key))
}

// The context MessageContext returns for a message reaches the handler for
// that message, with Handler, BatchHandler (the first new message's) and
// naturally idempotent handlers alike.
func TestMessageContextReachesTheHandler(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		batch      bool
		idempotent bool
	}{{"handler", false, false}, {"batch-handler", true, false}, {"idempotent", false, true}, {"idempotent-batch", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			brokers := newKfake(t, 1, "orders")
			s := newSQLiteShop(t)
			sendOrders(t, brokers, "orders", 1, 10, nil)
			ev := newEvents()
			cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
			cfg.Hooks = append(cfg.Hooks, consumer.ContextFunc(withOrderKey))
			cfg.BatchSize = 4
			var mu sync.Mutex
			var wrong []string
			check := func(ctx context.Context, first consumer.Message) {
				if got, _ := ctx.Value(orderKey{}).(string); got != string(first.Key) {
					mu.Lock()
					wrong = append(wrong, fmt.Sprintf("handler of %s got the context of %q", first.Key, got))
					mu.Unlock()
				}
			}
			if tc.batch {
				cfg.Handler = nil
				cfg.BatchHandler = func(ctx context.Context, tx *gorm.DB, msgs []consumer.Message) error {
					check(ctx, msgs[0])
					for _, m := range msgs {
						if err := s.reserve(ctx, tx, m); err != nil {
							return err
						}
					}
					return nil
				}
			} else {
				cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
					check(ctx, msg)
					return s.reserve(ctx, tx, msg)
				}
			}
			if tc.idempotent {
				cfg.NaturallyIdempotent, cfg.DB, cfg.Classifier, cfg.Inbox = true, s.db, s.ib.Store(), nil
			}
			r := start(t, cfg)
			waitUntil(t, 30*time.Second, "10 messages", func() bool { return ev.count(hooks.Processed) == 10 })
			if err := r.stop(t); err != nil {
				t.Fatalf("Run: %v", err)
			}
			for _, w := range wrong {
				t.Error(w)
			}
		})
	}
}
