package consumer_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/dev/testtransport"
	"github.com/inboxgo/inbox/hooks"

	"gorm.io/gorm"
)

// clientPackage is the import path of the Kafka client the consumer runs
// on (testtransport.Var): kafka-go's, or franz-go's client package (not
// kfake's, whose goroutines are the in-process broker's).
func clientPackage(t *testing.T) string {
	name, err := testtransport.Name()
	if err != nil {
		t.Fatal(err)
	}
	if name == testtransport.FranzGo {
		return "github.com/twmb/franz-go/pkg/kgo"
	}
	return "github.com/segmentio/kafka-go"
}

// kafkaGoroutines returns the stacks of the goroutines running code of
// pkg, by goroutine id.
func kafkaGoroutines(pkg string) map[string]string {
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
		if strings.Contains(g, pkg) {
			id, _, _ := strings.Cut(strings.TrimPrefix(g, "goroutine "), " ")
			out[id] = g
		}
	}
	return out
}

// Run leaves no goroutine of its Kafka client behind: after it returned,
// the group, the partition readers, the default dead-letter writer and its
// transport's connections and metadata goroutine are all gone. (Not
// parallel: it counts the goroutines of the whole process.)
func TestRunLeavesNoKafkaGoroutines(t *testing.T) {
	pkg := clientPackage(t)
	brokers := newKfake(t, 1, "orders", "orders.dlq")
	s := newSQLiteShop(t)
	sendOrders(t, brokers, "orders", 1, 2, nil)
	before := kafkaGoroutines(pkg) // the test helpers' own (kafka.DefaultTransport)
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.Failure.Policy, cfg.Failure.DeadLetterTopic, cfg.Failure.MaxAttempts = consumer.DeadLetter, "orders.dlq", 1
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
	// The count below means something only if it sees the client's own.
	if during := len(kafkaGoroutines(pkg)) - len(before); during <= 0 {
		t.Fatalf("no goroutine of %s while Run runs: the test does not see its client", pkg)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []string
		for id, g := range kafkaGoroutines(pkg) {
			if _, ok := before[id]; !ok {
				left = append(left, g)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines of %s started during Run are left after it returned:\n%s",
				len(left), pkg, strings.Join(left, "\n\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
