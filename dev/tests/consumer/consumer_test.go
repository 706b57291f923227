package consumer_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/testhooks"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"
)

// baseConfig is a consumer of topic on brokers for s, with fast backoffs.
func baseConfig(t *testing.T, brokers []string, topic, group string, s *shop, ev *events) consumer.Config {
	return consumer.Config{
		Brokers:  brokers,
		GroupID:  group,
		Topics:   []string{topic},
		Inbox:    s.ib,
		Consumer: "reserve-stock",
		Handler:  s.reserve,
		Failure: consumer.FailureConfig{
			MinBackoff: 10 * time.Millisecond,
			MaxBackoff: 50 * time.Millisecond,
		},
		Kafka: consumer.KafkaConfig{
			CommitInterval: -1,
			MaxWait:        100 * time.Millisecond,
			SessionTimeout: 6 * time.Second,
		},
		Logger: testLogger(t),
		Hooks:  []hooks.Hook{hooks.EventFunc(ev.on)},
	}
}

// sendOrders produces orders 0..n-1 over the partitions, then sends the
// orders in dups again (a producer's retry: same id and time, new offset).
func sendOrders(t *testing.T, brokers []string, topic string, partitions, n int, dups []int) {
	t.Helper()
	var msgs []kafka.Message
	for i := range n {
		msgs = append(msgs, orderMessage(i, i%partitions))
	}
	for _, i := range dups {
		msgs = append(msgs, orderMessage(i, i%partitions))
	}
	produce(t, brokers, topic, msgs...)
}

func TestConsumeExactlyOnceWithProducerDuplicates(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 2, "orders")
	s := newSQLiteShop(t)
	sendOrders(t, brokers, "orders", 2, 20, []int{3, 4, 11})
	ev := newEvents()
	r := start(t, baseConfig(t, brokers, "orders", "inventory", s, ev))
	waitUntil(t, 30*time.Second, "23 messages", func() bool {
		return ev.count(hooks.Processed)+ev.count(hooks.Duplicate) == 23
	})
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	s.checkExactlyOnce(t, 20, nil)
	if d := ev.count(hooks.Duplicate); d != 3 {
		t.Errorf("%d duplicates, want 3", d)
	}
	got := committed(t, brokers, "inventory", "orders", 2)
	if got[0] != 11 || got[1] != 12 {
		t.Errorf("committed offsets %v, want partition 0 at 11 and 1 at 12", got)
	}
}

// A message without an event id stops its partition under StopPartition:
// the offsets before it are committed, none after it; other partitions go on.
func TestStopPartitionOnMissingID(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 2, "orders")
	s := newSQLiteShop(t)
	var msgs []kafka.Message
	for i := range 10 {
		m := orderMessage(i, i%2)
		if i == 4 { // partition 0, offset 2
			m.Headers = m.Headers[1:]
		}
		msgs = append(msgs, m)
	}
	produce(t, brokers, "orders", msgs...)
	ev := newEvents()
	r := start(t, baseConfig(t, brokers, "orders", "inventory", s, ev))
	waitUntil(t, 30*time.Second, "the partition to stop and the other to finish", func() bool {
		return ev.count(hooks.PartitionStopped) == 1 && ev.count(hooks.Processed) == 7
	})
	time.Sleep(300 * time.Millisecond) // nothing more may happen
	stoppedList := r.c.Stopped()
	if len(stoppedList) != 1 || stoppedList[0].Partition != 0 || stoppedList[0].Offset != 2 || stoppedList[0].Reason != consumer.ReasonNoEventID {
		t.Fatalf("Stopped() = %v", stoppedList)
	}
	err := r.stop(t)
	var pse *consumer.PartitionStoppedError
	if !errors.As(err, &pse) || !errors.Is(err, consumer.ErrPartitionStopped) || !errors.Is(err, consumer.ErrNoEventID) {
		t.Fatalf("Run returned %v, want the stopped partition", err)
	}
	if got := ev.count(hooks.Processed); got != 7 {
		t.Fatalf("%d processed, want 7 (orders 0, 2 on partition 0; all 5 of partition 1)", got)
	}
	got := committed(t, brokers, "inventory", "orders", 2)
	if got[0] != 2 || got[1] != 5 {
		t.Fatalf("committed %v, want partition 0 held at 2 and partition 1 at 5", got)
	}
	skip := map[int]bool{4: true, 6: true, 8: true}
	s.checkExactlyOnce(t, 10, skip)
}

// A handler that always fails for one order: bounded retries, then the dead
// letter with its headers; the partition goes on.
func TestDeadLetterAfterRetries(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders", "orders.dlq")
	s := newSQLiteShop(t)
	sendOrders(t, brokers, "orders", 1, 6, nil)
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.Failure.Policy, cfg.Failure.DeadLetterTopic, cfg.Failure.MaxAttempts = consumer.DeadLetter, "orders.dlq", 3
	cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
		if string(msg.Key) == "order-2" {
			return errors.New("sku-2 is not sold here")
		}
		return s.reserve(ctx, tx, msg)
	}
	r := start(t, cfg)
	waitUntil(t, 30*time.Second, "5 processed and 1 dead letter", func() bool {
		return ev.count(hooks.Processed) == 5 && ev.count(hooks.DeadLettered) == 1
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if n := ev.count(hooks.Retry); n != 2 {
		t.Errorf("%d retries, want 2 (3 attempts)", n)
	}
	s.checkExactlyOnce(t, 6, map[int]bool{2: true})
	if got := committed(t, brokers, "inventory", "orders", 1); got[0] != 6 {
		t.Errorf("committed %v, want 6", got)
	}
	dl := readAll(t, brokers, "orders.dlq", 1, 1)[0]
	h := map[string]string{}
	for _, x := range dl.Headers {
		h[x.Key] = string(x.Value)
	}
	if string(dl.Key) != "order-2" || !strings.Contains(string(dl.Value), `"order-2"`) || h[header.EventID] != "evt-order-2" {
		t.Errorf("dead letter lost the original message: key %q value %q headers %v", dl.Key, dl.Value, h)
	}
	for k, v := range map[string]string{header.DLQTopic: "orders", header.DLQPartition: "0", header.DLQOffset: "2",
		header.DLQReason: consumer.ReasonHandlerError, header.DLQAttempts: "3", header.DLQGroup: "inventory", header.DLQConsumer: "reserve-stock"} {
		if h[k] != v {
			t.Errorf("dead letter header %s = %q, want %q", k, h[k], v)
		}
	}
	if !strings.Contains(h[header.DLQError], "sku-2 is not sold here") {
		t.Errorf("dead letter error header %q", h[header.DLQError])
	}
	if _, err := time.Parse(time.RFC3339Nano, h[header.DLQTime]); err != nil {
		t.Errorf("dead letter time header: %v", err)
	}
}

// In batch mode a poison message is isolated: the rest of its batch commits
// in one transaction, the poison is dead-lettered without retries when it
// is invalid, and expired events go straight to the policy.
func TestBatchIsolatesPoison(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders", "orders.dlq")
	s := newSQLiteShop(t)
	var msgs []kafka.Message
	for i := range 30 {
		msgs = append(msgs, orderMessage(i, 0))
	}
	msgs[7].Value = []byte("not json")                           // handler error
	msgs[15].Headers[1].Value = []byte("1971-01-01T00:00:00Z")   // expired
	msgs[21].Headers[0].Value = []byte(strings.Repeat("x", 300)) // invalid id: too long
	msgs = append(msgs, orderMessage(3, 0))                      // producer duplicate
	produce(t, brokers, "orders", msgs...)
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.Failure.Policy, cfg.Failure.DeadLetterTopic, cfg.Failure.MaxAttempts = consumer.DeadLetter, "orders.dlq", 2
	cfg.BatchSize, cfg.BatchWait = 31, 2*time.Second
	r := start(t, cfg)
	waitUntil(t, 30*time.Second, "all messages finished", func() bool {
		return ev.count(hooks.Processed)+ev.count(hooks.Duplicate)+ev.count(hooks.DeadLettered) == 31
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if p, d, dl, re := ev.count(hooks.Processed), ev.count(hooks.Duplicate), ev.count(hooks.DeadLettered), ev.count(hooks.Retry); p != 27 || d != 1 || dl != 3 || re != 1 {
		t.Errorf("processed %d duplicates %d dead-lettered %d retries %d; want 27, 1, 3, 1 (only the handler error is retried)", p, d, dl, re)
	}
	s.checkExactlyOnce(t, 30, map[int]bool{7: true, 15: true, 21: true})
	if got := committed(t, brokers, "inventory", "orders", 1); got[0] != 31 {
		t.Errorf("committed %v, want 31", got)
	}
	reasons := map[string]string{}
	for _, m := range readAll(t, brokers, "orders.dlq", 1, 3) {
		var off, reason string
		for _, h := range m.Headers {
			switch h.Key {
			case header.DLQOffset:
				off = string(h.Value)
			case header.DLQReason:
				reason = string(h.Value)
			}
		}
		reasons[off] = reason
	}
	want := map[string]string{"7": consumer.ReasonHandlerError, "15": consumer.ReasonExpired, "21": consumer.ReasonInvalid}
	for off, reason := range want {
		if reasons[off] != reason {
			t.Errorf("dead letter of offset %s has reason %q, want %q (all: %v)", off, reasons[off], reason, reasons)
		}
	}
}

// A consumer killed between its database commit and its offset commit: the
// next instance is handed the message again. The inbox absorbs it; with
// Offsets.Store it is not even redelivered.
func TestCrashBetweenDBCommitAndOffsetCommit(t *testing.T) {
	t.Parallel()
	for _, storeOffsets := range []bool{false, true} {
		t.Run("StoreOffsets="+strconv.FormatBool(storeOffsets), func(t *testing.T) {
			t.Parallel()
			brokers := newKfake(t, 2, "orders")
			s := newSQLiteShop(t)
			sendOrders(t, brokers, "orders", 2, 20, nil)

			ev1 := newEvents()
			cfg := baseConfig(t, brokers, "orders", "inventory", s, ev1)
			cfg.Offsets.Store = storeOffsets
			var commits atomic.Int32
			knobs := &testhooks.Knobs{AfterDB: func(topic string, partition int, next int64, _ int) error {
				if commits.Add(1) == 7 {
					return testhooks.ErrCrash
				}
				return nil
			}}
			first := startWith(t, cfg, knobs)
			select {
			case err := <-first.done:
				if !errors.Is(err, testhooks.ErrCrash) {
					t.Fatalf("first consumer: Run = %v, want the simulated crash", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the first consumer did not crash")
			}
			var kafkaNext int64
			for _, off := range committed(t, brokers, "inventory", "orders", 2) {
				kafkaNext += max(off, 0)
			}
			if kafkaNext >= 7 {
				t.Fatalf("the group committed %d messages; the crash must leave the last database commit uncommitted in Kafka", kafkaNext)
			}

			ev2 := newEvents()
			cfg.Hooks = []hooks.Hook{hooks.EventFunc(ev2.on)}
			second := start(t, cfg)
			waitUntil(t, 30*time.Second, "the second consumer to finish", func() bool {
				return len(s.counts(t)) == 20
			})
			time.Sleep(200 * time.Millisecond)
			if err := second.stop(t); err != nil {
				t.Fatal(err)
			}
			s.checkExactlyOnce(t, 20, nil)
			dups := ev2.count(hooks.Duplicate)
			if storeOffsets && dups != 0 {
				t.Errorf("%d redeliveries reached the inbox; the stored offsets should have prevented them", dups)
			}
			if !storeOffsets && dups == 0 {
				t.Errorf("no redelivery after the crash; the test did not exercise the gap")
			}
			t.Logf("after the crash: %d duplicates absorbed by the inbox", dups)
		})
	}
}

// A dead letter that cannot be published holds the partition: the offset
// does not pass the message until Kafka has the dead letter. A dead-letter
// topic that stays missing stops the partition (it is not retried forever);
// once the topic exists, the next start publishes the dead letter and goes
// on. (Run refuses to start without the dead-letter topic when the
// consumer's own writer publishes dead letters; the test's writer, as one
// of another cluster would, leaves the topic to the publish.)
func TestDeadLetterPublishFailureHoldsTheOffset(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders") // no dead-letter topic yet
	s := newSQLiteShop(t)
	sendOrders(t, brokers, "orders", 1, 4, nil)
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.Failure.Policy, cfg.Failure.DeadLetterTopic, cfg.Failure.MaxAttempts = consumer.DeadLetter, "orders.dlq", 1
	dlq := &kafka.Writer{Addr: kafka.TCP(brokers...), Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, MaxAttempts: 3, BatchTimeout: 5 * time.Millisecond}
	t.Cleanup(func() { _ = dlq.Close() })
	cfg.Failure.DeadLetterWriter = dlq
	cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
		if string(msg.Key) == "order-1" {
			return errors.New("poison")
		}
		return s.reserve(ctx, tx, msg)
	}
	r := start(t, cfg)
	waitUntil(t, 20*time.Second, "the partition to stop at the message", func() bool { return ev.count(hooks.PartitionStopped) == 1 })
	if st := r.c.Stopped(); len(st) != 1 || st[0].Offset != 1 || st[0].Reason != consumer.ReasonDeadLetterFailed || !errors.Is(st[0], kafka.UnknownTopicOrPartition) {
		t.Fatalf("Stopped() = %v, want offset 1 stopped for the missing dead-letter topic", st)
	}
	if got := committed(t, brokers, "inventory", "orders", 1); got[0] > 1 {
		t.Fatalf("committed %v while the dead letter could not be published", got)
	}
	if n := ev.count(hooks.Processed); n != 1 {
		t.Fatalf("%d processed while held at the poison message, want 1", n)
	}
	if err := r.stop(t); !errors.Is(err, consumer.ErrPartitionStopped) {
		t.Fatalf("Run = %v, want the stopped partition", err)
	}
	cl := &kafka.Client{Addr: kafka.TCP(brokers...)}
	resp, err := cl.CreateTopics(context.Background(), &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: "orders.dlq", NumPartitions: 1, ReplicationFactor: 1}}})
	if err != nil || resp.Errors["orders.dlq"] != nil {
		t.Fatalf("create the dead-letter topic: %v %v", err, resp)
	}
	ev2 := newEvents()
	cfg.Hooks = []hooks.Hook{hooks.EventFunc(ev2.on)}
	r2 := start(t, cfg)
	waitUntil(t, 20*time.Second, "the dead letter and the rest", func() bool {
		return ev2.count(hooks.DeadLettered) == 1 && ev2.count(hooks.Processed) == 2
	})
	if err := r2.stop(t); err != nil {
		t.Fatal(err)
	}
	if got := committed(t, brokers, "inventory", "orders", 1); got[0] != 4 {
		t.Fatalf("committed %v, want 4", got)
	}
	s.checkExactlyOnce(t, 4, map[int]bool{1: true})
}

// StopPartition in batch mode: the rest of the poison's batch commits in the
// database, but neither the group's offset nor the stored offset passes the
// poison. Once the cause is fixed, a restart applies it; the later messages
// are duplicates.
func TestBatchStopStoresNoOffsetPastThePoison(t *testing.T) {
	t.Parallel()
	poisons := map[string]func(m *kafka.Message){
		"handler-error": func(m *kafka.Message) { m.Value = []byte(`{"order_id":"order-3","qty":"three"}`) },
		"no-event-id":   func(m *kafka.Message) { m.Headers = m.Headers[1:] },
		"expired":       func(m *kafka.Message) { m.Headers[1].Value = []byte("2001-01-01T00:00:00Z") },
	}
	for name, poison := range poisons {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			brokers := newKfake(t, 1, "orders")
			s := newSQLiteShop(t)
			var msgs []kafka.Message
			for i := range 10 {
				msgs = append(msgs, orderMessage(i, 0))
			}
			poison(&msgs[3])
			produce(t, brokers, "orders", msgs...)
			ev := newEvents()
			cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
			cfg.BatchSize, cfg.BatchWait, cfg.Failure.MaxAttempts, cfg.Offsets.Store = 10, time.Second, 2, true
			r := start(t, cfg)
			waitUntil(t, 20*time.Second, "the partition to stop", func() bool { return ev.count(hooks.PartitionStopped) == 1 })
			if err := r.stop(t); !errors.Is(err, consumer.ErrPartitionStopped) {
				t.Fatalf("Run = %v, want the stopped partition", err)
			}
			if n := ev.count(hooks.Processed); n != 9 {
				t.Fatalf("%d processed, want the 9 others of the batch", n)
			}
			if got := committed(t, brokers, "inventory", "orders", 1); got[0] != 3 {
				t.Fatalf("group committed %v, want 3 (the poison's offset)", got)
			}
			stored, err := r.offsets().Load(context.Background(), s.db, "orders", 0)
			if err != nil || stored != 3 {
				t.Fatalf("stored offset %d (%v), want 3: the poison's offset, not past it", stored, err)
			}

			// The cause is fixed (here: the handler and the inbox accept it).
			ev2 := newEvents()
			cfg.Hooks = []hooks.Hook{hooks.EventFunc(ev2.on)}
			cfg.Extract = func(m *kafka.Message) (string, time.Time, error) {
				if m.Offset == 3 {
					return "evt-order-3", eventBase.Add(3 * time.Second), nil
				}
				return consumer.HeaderExtractor(nil, nil)(m)
			}
			cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
				if msg.Offset == 3 {
					msg.Value = orderMessage(3, 0).Value
				}
				return s.reserve(ctx, tx, msg)
			}
			r2 := start(t, cfg)
			waitUntil(t, 20*time.Second, "the rest", func() bool {
				return ev2.count(hooks.Processed)+ev2.count(hooks.Duplicate) == 7
			})
			if p := ev2.count(hooks.Processed); p != 1 {
				t.Errorf("%d processed after the fix, want only the former poison", p)
			}
			if err := r2.stop(t); err != nil {
				t.Fatal(err)
			}
			if len(r2.c.Stopped()) != 0 {
				t.Fatalf("still stopped: %v", r2.c.Stopped())
			}
			s.checkExactlyOnce(t, 10, nil)
		})
	}
}

// A message that fails inside its batch is retried alone after the rest of
// the batch committed; once it commits, the stored offset follows the
// group's past the whole batch, not only past that message.
func TestBatchRetriedMessageStoresTheBatchsOffset(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	s := newSQLiteShop(t)
	sendOrders(t, brokers, "orders", 1, 6, nil)
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.BatchSize, cfg.BatchWait, cfg.Offsets.Store = 6, time.Second, true
	cfg.Handler = s.failingOnce("order-1")
	r := start(t, cfg)
	// Stopping before the worker's commit would leave the tail unstored
	// (Run's end cancels the database work), and the group at the stored
	// offset: correct, but not what is checked here.
	waitUntil(t, 30*time.Second, "6 processed and committed", func() bool {
		for _, e := range ev.filter(hooks.Committed) {
			if e.Offset == 6 {
				return ev.count(hooks.Processed) == 6
			}
		}
		return false
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s.checkExactlyOnce(t, 6, nil)
	s.checkStoredAtGroup(t, brokers, 6)
}
