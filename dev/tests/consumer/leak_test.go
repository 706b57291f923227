package consumer_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"

	"gorm.io/gorm"
)

// kafkaGoroutines returns the stacks of the goroutines running kafka-go
// code, by goroutine id.
func kafkaGoroutines() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "github.com/segmentio/kafka-go") {
			id, _, _ := strings.Cut(strings.TrimPrefix(g, "goroutine "), " ")
			out[id] = g
		}
	}
	return out
}

// Run leaves no kafka-go goroutine behind: after it returned, the group, the
// partition readers, the default dead-letter writer and its transport's
// connections and metadata goroutine are all gone. (Not parallel: it counts
// the goroutines of the whole process.)
func TestRunLeavesNoKafkaGoroutines(t *testing.T) {
	brokers := newKfake(t, 1, "orders", "orders.dlq")
	s := newSQLiteShop(t)
	sendOrders(t, brokers, "orders", 1, 2, nil)
	before := kafkaGoroutines() // the test helpers' own (kafka.DefaultTransport)
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.OnFailure, cfg.DeadLetterTopic, cfg.MaxAttempts = consumer.DeadLetter, "orders.dlq", 1
	cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
		if string(msg.Key) == "order-1" {
			return errors.New("poison")
		}
		return s.reserve(ctx, tx, msg)
	}
	r := start(t, cfg)
	waitUntil(t, 20*time.Second, "a dead letter", func() bool {
		return ev.count(hooks.DeadLettered) == 1 && ev.count(hooks.Processed) == 1
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []string
		for id, g := range kafkaGoroutines() {
			if _, ok := before[id]; !ok {
				left = append(left, g)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d kafka-go goroutines started during Run are left after it returned:\n%s",
				len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
