package consumer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/kafkaerr"

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
	cfg.Failure.Policy, cfg.Failure.DeadLetterTopic, cfg.Failure.MaxAttempts = consumer.DeadLetter, "orders.dlq", 1
	cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
		if string(msg.Key) == "order-1" {
			return errors.New("attachment rejected")
		}
		return s.reserve(ctx, tx, msg)
	}
	r := start(t, cfg)
	waitUntil(t, 20*time.Second, "the large message to be dead-lettered and the rest processed", func() bool {
		return ev.count(hooks.DeadLettered) == 1 && ev.count(hooks.Processed) == 2
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if got := committed(t, brokers, "inventory", "orders", 1); got[0] != 3 {
		t.Fatalf("committed %v, want 3", got)
	}
	s.checkExactlyOnce(t, 3, map[int]bool{1: true})
}

// fakeWriter is a MessageWriter whose i-th call returns errs[i] (nil once
// errs is used up).
type fakeWriter struct {
	mu    sync.Mutex
	errs  []error
	calls int
	msgs  []kafka.Message
}

func (f *fakeWriter) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.calls <= len(f.errs) && f.errs[f.calls-1] != nil {
		return f.errs[f.calls-1]
	}
	f.msgs = append(f.msgs, msgs...)
	return nil
}

func (f *fakeWriter) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// deadLetterConfig consumes topic with order-1 failing at once under the
// DeadLetter policy, publishing to topic.dlq through w (nil: the default
// writer).
func deadLetterConfig(t *testing.T, brokers []string, topic, group string, s *shop, ev *events, w consumer.MessageWriter) consumer.Config {
	cfg := baseConfig(t, brokers, topic, group, s, ev)
	cfg.Failure.Policy, cfg.Failure.DeadLetterTopic, cfg.Failure.MaxAttempts = consumer.DeadLetter, topic+".dlq", 1
	if w != nil {
		cfg.Failure.DeadLetterWriter = w
	}
	cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
		if string(msg.Key) == "order-1" {
			return errPoison
		}
		return s.reserve(ctx, tx, msg)
	}
	return cfg
}

var errPoison = errors.New("poison order")

// A dead letter that the producer refuses for good (too large, a bad or
// missing topic, no authorization) is not retried forever: the partition
// stops at the message, loudly, with the producer's error as the cause, and
// nothing at or after it is committed.
func TestDeadLetterPermanentErrorStopsThePartition(t *testing.T) {
	t.Parallel()
	unknown := make([]error, 50)
	for i := range unknown {
		unknown[i] = kafka.UnknownTopicOrPartition
	}
	cases := []struct {
		name  string
		errs  []error
		want  error
		calls int
	}{
		{"client-side too large", []error{kafka.MessageTooLargeError{}}, kafka.MessageSizeTooLarge, 1},
		{"broker too large", []error{kafka.WriteErrors{kafka.MessageSizeTooLarge}}, kafka.MessageSizeTooLarge, 1},
		{"topic authorization", []error{fmt.Errorf("produce: %w", kafka.TopicAuthorizationFailed)}, kafka.TopicAuthorizationFailed, 1},
		{"invalid topic", []error{kafka.WriteErrors{kafka.InvalidTopic}}, kafka.InvalidTopic, 1},
		{"writer closed", []error{io.ErrClosedPipe}, io.ErrClosedPipe, 1},
		{"unknown topic that persists", unknown, kafka.UnknownTopicOrPartition, kafkaerr.UnknownTopicAttempts},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			brokers := newKfake(t, 1, "orders")
			s := newSQLiteShop(t)
			sendOrders(t, brokers, "orders", 1, 3, nil)
			ev := newEvents()
			w := &fakeWriter{errs: c.errs}
			r := start(t, deadLetterConfig(t, brokers, "orders", "inventory", s, ev, w))
			waitUntil(t, 20*time.Second, "the partition to stop", func() bool { return ev.count(hooks.PartitionStopped) == 1 })
			if n := w.count(); n != c.calls {
				t.Errorf("the dead letter was tried %d times, want %d", n, c.calls)
			}
			st := r.c.Stopped()
			if len(st) != 1 || st[0].Offset != 1 || st[0].Reason != consumer.ReasonDeadLetterFailed || st[0].EventID != "evt-order-1" {
				t.Fatalf("Stopped() = %v, want offset 1 stopped for %s", st, consumer.ReasonDeadLetterFailed)
			}
			if !errors.Is(st[0], c.want) || !errors.Is(st[0], errPoison) {
				t.Errorf("stop cause %v: want both the producer's error %v and the message's failure", st[0].Err, c.want)
			}
			err := r.stop(t)
			if !errors.Is(err, consumer.ErrPartitionStopped) || !errors.Is(err, c.want) {
				t.Errorf("Run = %v, want the stopped partition", err)
			}
			if n := ev.count(hooks.Processed); n != 1 || ev.count(hooks.DeadLettered) != 0 {
				t.Errorf("%d processed, %d dead-lettered; want only order-0 processed", n, ev.count(hooks.DeadLettered))
			}
			if got := committed(t, brokers, "inventory", "orders", 1); got[0] != 1 {
				t.Errorf("committed %v, want 1 (held at the message)", got)
			}
		})
	}
}

// Transient producer errors (no leader, timeouts, the network) are retried
// until the dead letter is published; the partition then goes on.
func TestDeadLetterTransientErrorsAreRetried(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	s := newSQLiteShop(t)
	sendOrders(t, brokers, "orders", 1, 3, nil)
	ev := newEvents()
	w := &fakeWriter{errs: []error{
		kafka.WriteErrors{kafka.LeaderNotAvailable},
		kafka.RequestTimedOut,
		&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")},
		kafka.WriteErrors{kafka.NotEnoughReplicas},
		kafka.UnknownTopicOrPartition, // briefly, as after a topic is created
	}}
	r := start(t, deadLetterConfig(t, brokers, "orders", "inventory", s, ev, w))
	waitUntil(t, 20*time.Second, "the dead letter and the rest", func() bool {
		return ev.count(hooks.DeadLettered) == 1 && ev.count(hooks.Processed) == 2
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if n := w.count(); n != 6 {
		t.Errorf("%d publish attempts, want 6", n)
	}
	if ev.count(hooks.PartitionStopped) != 0 {
		t.Error("a transient producer error stopped the partition")
	}
	if got := committed(t, brokers, "inventory", "orders", 1); got[0] != 3 {
		t.Errorf("committed %v, want 3", got)
	}
}

// The same with a real producer error: the dead-letter topic's
// max.message.bytes is smaller than the dead letter, so the broker refuses
// it with MESSAGE_TOO_LARGE.
func TestDeadLetterRefusedByTheBrokerStopsThePartition(t *testing.T) {
	t.Parallel()
	onEachBroker(t, func(t *testing.T, k kafkaTarget) {
		createTopicWith(t, k.brokers, kafka.TopicConfig{Topic: k.topic})
		createTopicWith(t, k.brokers, kafka.TopicConfig{Topic: k.topic + ".dlq",
			ConfigEntries: []kafka.ConfigEntry{{ConfigName: "max.message.bytes", ConfigValue: "200"}}})
		s := newSQLiteShop(t)
		sendOrders(t, k.brokers, k.topic, 1, 3, nil)
		ev := newEvents()
		r := start(t, deadLetterConfig(t, k.brokers, k.topic, k.group, s, ev, nil))
		waitUntil(t, 30*time.Second, "the partition to stop", func() bool { return ev.count(hooks.PartitionStopped) == 1 })
		st := r.c.Stopped()
		if len(st) != 1 || st[0].Offset != 1 || st[0].Reason != consumer.ReasonDeadLetterFailed || !errors.Is(st[0], kafka.MessageSizeTooLarge) {
			t.Fatalf("Stopped() = %v, want offset 1 stopped for a too large dead letter", st)
		}
		if err := r.stop(t); !errors.Is(err, kafka.MessageSizeTooLarge) {
			t.Errorf("Run = %v, want the stopped partition", err)
		}
		if got := committed(t, k.brokers, k.group, k.topic, 1); got[0] != 1 {
			t.Errorf("committed %v, want 1", got)
		}
	})
}
