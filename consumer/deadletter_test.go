package consumer

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/gorm"
)

// newKfakeWith is newKfake with extra cluster options.
func newKfakeWith(t *testing.T, partitions int32, topics []string, opts ...kfake.Opt) []string {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.SeedTopics(partitions, topics...),
		kfake.GroupMinSessionTimeout(time.Second),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// produceLarge writes msgs with a writer that accepts messages of up to
// 16 MiB (produce keeps kafka-go's 1 MiB limit).
func produceLarge(t *testing.T, brokers []string, topic string, msgs ...kafka.Message) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: partitionBalancer{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchBytes: 16 << 20}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}
}

// A message the partition reader accepts (here 3 MiB) can be dead-lettered
// by the default writer: it is not refused client-side for exceeding
// kafka-go's default 1 MiB batch size.
func TestDeadLetterOfALargeMessage(t *testing.T) {
	t.Parallel()
	brokers := newKfakeWith(t, 1, []string{"orders", "orders.dlq"},
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": "16777216"}))
	s := newSQLiteShop(t)
	big := orderMessage(1, 0)
	big.Headers = append(big.Headers, kafka.Header{Key: "attachment", Value: bytes.Repeat([]byte("x"), 3<<20)})
	produceLarge(t, brokers, "orders", orderMessage(0, 0), big, orderMessage(2, 0))
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.OnFailure, cfg.DeadLetterTopic, cfg.MaxAttempts = DeadLetter, "orders.dlq", 1
	cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg Message) error {
		if string(msg.Key) == "order-1" {
			return errors.New("attachment rejected")
		}
		return s.reserve(ctx, tx, msg)
	}
	r := start(t, cfg)
	waitUntil(t, 20*time.Second, "the large message to be dead-lettered and the rest processed", func() bool {
		return ev.count(EventDeadLettered) == 1 && ev.count(EventProcessed) == 2
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if got := committed(t, brokers, "inventory", "orders", 1); got[0] != 3 {
		t.Fatalf("committed %v, want 3", got)
	}
	s.checkExactlyOnce(t, 3, map[int]bool{1: true})
}
