package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/testhooks"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
)

// commitOffset commits next for the partition of an empty group, as
// kafka-consumer-groups.sh --reset-offsets does.
func commitOffset(t *testing.T, brokers []string, group, topic string, partition int, next int64) {
	t.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	resp, err := cl.OffsetCommit(context.Background(), &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{topic: {{Partition: partition, Offset: next}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			t.Fatal(p.Error)
		}
	}
}

// kafkaTarget is a broker with a fresh topic and group name.
type kafkaTarget struct {
	brokers      []string
	topic, group string
}

// onEachBroker runs test against kfake and against the real broker
// (INBOX_KAFKA_BROKERS; skipped without it unless backends are required),
// in parallel, each with fresh names. The test creates its topics.
func onEachBroker(t *testing.T, test func(t *testing.T, k kafkaTarget)) {
	for _, kind := range []string{"kfake", "kafka"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var brokers []string
			if kind == "kfake" {
				brokers = newKfake(t, 1)
			} else {
				brokers = testservers.KafkaBrokers(t)
			}
			suffix := conformance.RandomSuffix()
			test(t, kafkaTarget{brokers: brokers, topic: "orders-" + suffix, group: "inventory-" + suffix})
		})
	}
}

// createTopicWith creates a topic through kafka.Client (so with configs, on
// kfake and on a real broker alike) and waits until its partition 0 answers.
func createTopicWith(t *testing.T, brokers []string, tc kafka.TopicConfig) {
	t.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	ctx := context.Background()
	if tc.NumPartitions == 0 {
		tc.NumPartitions = 1
	}
	if tc.ReplicationFactor == 0 {
		tc.ReplicationFactor = 1
	}
	waitUntil(t, 30*time.Second, "topic "+tc.Topic+" to be created", func() bool {
		cr, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{tc}})
		return err == nil && cr.Errors[tc.Topic] == nil
	})
	waitUntil(t, 30*time.Second, "topic "+tc.Topic+" to have a leader", func() bool {
		lo, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{tc.Topic: {kafka.LastOffsetOf(0)}}})
		return err == nil && len(lo.Topics[tc.Topic]) == 1 && lo.Topics[tc.Topic][0].Error == nil
	})
}

// recreateTopic deletes topic and creates it again, empty.
func recreateTopic(t *testing.T, brokers []string, topic string) {
	t.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	dr, err := cl.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	if err != nil || dr.Errors[topic] != nil {
		t.Fatalf("delete %s: %v %v", topic, err, dr)
	}
	// A real broker deletes asynchronously: creating fails until it is done.
	createTopicWith(t, brokers, kafka.TopicConfig{Topic: topic})
}

// recorder is a slog.Handler that keeps every record (and passes it on).
type recorder struct {
	next slog.Handler
	mu   *sync.Mutex
	recs *[]slog.Record
}

func newRecorder(t *testing.T) *recorder {
	return &recorder{next: testLogger(t).Handler(), mu: new(sync.Mutex), recs: new([]slog.Record)}
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(ctx context.Context, rec slog.Record) error {
	r.mu.Lock()
	*r.recs = append(*r.recs, rec.Clone())
	r.mu.Unlock()
	if r.next.Enabled(ctx, rec.Level) {
		return r.next.Handle(ctx, rec)
	}
	return nil
}
func (r *recorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &recorder{next: r.next.WithAttrs(as), mu: r.mu, recs: r.recs}
}
func (r *recorder) WithGroup(name string) slog.Handler {
	return &recorder{next: r.next.WithGroup(name), mu: r.mu, recs: r.recs}
}

// find returns the attributes of the first record at level whose message
// contains substr.
func (r *recorder) find(level slog.Level, substr string) (map[string]slog.Value, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range *r.recs {
		if rec.Level == level && strings.Contains(rec.Message, substr) {
			attrs := map[string]slog.Value{}
			rec.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value; return true })
			return attrs, true
		}
	}
	return nil, false
}

// With StartOffset = LastOffset a partition that saw no message still
// commits where it started: a message produced while the consumer was down
// is processed by the next start instead of being skipped.
func TestLastOffsetStartSurvivesARestart(t *testing.T) {
	t.Parallel()
	onEachBroker(t, func(t *testing.T, k kafkaTarget) {
		createTopicWith(t, k.brokers, kafka.TopicConfig{Topic: k.topic})
		s := newSQLiteShop(t)
		sendOrders(t, k.brokers, k.topic, 1, 2, nil) // before the group existed: not for it
		ev := newEvents()
		cfg := baseConfig(t, k.brokers, k.topic, k.group, s, ev)
		cfg.Kafka.StartOffset = kafka.LastOffset
		a := start(t, cfg)
		waitUntil(t, 30*time.Second, "the partition to be assigned", func() bool { return ev.count(hooks.Assigned) == 1 })
		if err := a.stop(t); err != nil {
			t.Fatal(err)
		}
		if got := committed(t, k.brokers, k.group, k.topic, 1); got[0] != 2 {
			t.Errorf("committed %v after a start at the log end, want 2", got)
		}
		produce(t, k.brokers, k.topic, orderMessage(2, 0)) // while no consumer runs
		ev2 := newEvents()
		cfg.Hooks = []hooks.Hook{hooks.EventFunc(ev2.on)}
		b := start(t, cfg)
		waitUntil(t, 30*time.Second, "order-2 to be processed", func() bool { return ev2.count(hooks.Processed) == 1 })
		if err := b.stop(t); err != nil {
			t.Fatal(err)
		}
		if c := s.counts(t); len(c) != 1 || c["order-2"] != 1 {
			t.Errorf("reservations %v, want only order-2", c)
		}
	})
}

// The topic was deleted and recreated: the stored offset is past the new
// log end. The partition stops loudly instead of waiting there while the
// new messages below it are never processed; once the group's rows and
// offsets are reset, the new messages are processed.
func TestRecreatedTopicWithStoredOffsetsStopsThePartition(t *testing.T) {
	t.Parallel()
	onEachBroker(t, func(t *testing.T, k kafkaTarget) {
		createTopicWith(t, k.brokers, kafka.TopicConfig{Topic: k.topic})
		s := newSQLiteShop(t)
		sendOrders(t, k.brokers, k.topic, 1, 5, nil)
		ev := newEvents()
		cfg := baseConfig(t, k.brokers, k.topic, k.group, s, ev)
		cfg.Offsets.Store = true
		a := start(t, cfg)
		waitUntil(t, 30*time.Second, "5 processed", func() bool { return ev.count(hooks.Processed) == 5 })
		if err := a.stop(t); err != nil {
			t.Fatal(err)
		}

		recreateTopic(t, k.brokers, k.topic)
		produce(t, k.brokers, k.topic, orderMessage(5, 0), orderMessage(6, 0))
		ev2 := newEvents()
		cfg.Hooks = []hooks.Hook{hooks.EventFunc(ev2.on)}
		b := start(t, cfg)
		waitUntil(t, 30*time.Second, "the partition to stop", func() bool { return ev2.count(hooks.PartitionStopped) == 1 })
		st := b.c.Stopped()
		if len(st) != 1 || st[0].Offset != 5 || st[0].Reason != consumer.ReasonOffsetBeyondLogEnd || !errors.Is(st[0], consumer.ErrOffsetBeyondLogEnd) {
			t.Fatalf("Stopped() = %v, want offset 5 stopped for %s", st, consumer.ReasonOffsetBeyondLogEnd)
		}
		if msg := st[0].Error(); !strings.Contains(msg, consumer.DefaultOffsetsTable) || !strings.Contains(msg, "log end 2") {
			t.Errorf("the stop does not say what to do: %s", msg)
		}
		if err := b.stop(t); !errors.Is(err, consumer.ErrOffsetBeyondLogEnd) {
			t.Errorf("Run = %v, want the stopped partition", err)
		}
		if n := ev2.count(hooks.Processed); n != 0 {
			t.Errorf("%d processed past the log end", n)
		}

		// The documented fix: delete the group's rows and reset its offsets.
		if err := s.db.Exec(`DELETE FROM `+consumer.DefaultOffsetsTable+` WHERE group_id = ?`, k.group).Error; err != nil {
			t.Fatal(err)
		}
		cl := &kafka.Client{Addr: kafka.TCP(k.brokers...), Timeout: 10 * time.Second}
		if _, err := cl.DeleteGroups(context.Background(), &kafka.DeleteGroupsRequest{GroupIDs: []string{k.group}}); err != nil {
			t.Fatal(err)
		}
		ev3 := newEvents()
		cfg.Hooks = []hooks.Hook{hooks.EventFunc(ev3.on)}
		c := start(t, cfg)
		waitUntil(t, 30*time.Second, "the new messages", func() bool { return ev3.count(hooks.Processed) == 2 })
		if err := c.stop(t); err != nil {
			t.Fatal(err)
		}
		s.checkExactlyOnce(t, 7, nil)
	})
}

// The topic was deleted and recreated, and the new topic already holds
// more messages than the stored offset: the offset is inside the new log,
// so nothing about it looks wrong, yet starting there would skip the new
// messages below it for good (before, they were: neither processed nor
// dead-lettered). The message at the stored offset - 1 is not the one the
// group processed there, so the partition stops loudly; once the group's
// rows and offsets are reset, every new message is processed. A restart on
// the same topic passes the check.
func TestRecreatedTopicGrownPastTheStoredOffsetStopsThePartition(t *testing.T) {
	t.Parallel()
	onEachBroker(t, func(t *testing.T, k kafkaTarget) {
		createTopicWith(t, k.brokers, kafka.TopicConfig{Topic: k.topic})
		s := newSQLiteShop(t)
		sendOrders(t, k.brokers, k.topic, 1, 8, nil)
		ev := newEvents()
		cfg := baseConfig(t, k.brokers, k.topic, k.group, s, ev)
		cfg.Offsets.Store = true
		a := start(t, cfg)
		waitUntil(t, 30*time.Second, "8 processed", func() bool { return ev.count(hooks.Processed) == 8 })
		if err := a.stop(t); err != nil {
			t.Fatal(err)
		}
		// The same topic: the message before the stored offset is the one
		// processed there.
		ev1, rec := newEvents(), newRecorder(t)
		cfg.Hooks, cfg.Logger = []hooks.Hook{hooks.EventFunc(ev1.on)}, slog.New(rec)
		produce(t, k.brokers, k.topic, orderMessage(8, 0))
		a2 := start(t, cfg)
		waitUntil(t, 30*time.Second, "order 8", func() bool { return ev1.count(hooks.Processed) == 1 })
		if err := a2.stop(t); err != nil {
			t.Fatalf("a restart on the same topic: %v", err)
		}
		if _, ok := rec.find(slog.LevelInfo, "cannot check"); ok {
			t.Error("the check of the message before the stored offset was not made")
		}
		cfg.Logger = testLogger(t)

		recreateTopic(t, k.brokers, k.topic)
		var fresh []kafka.Message
		for i := 100; i < 110; i++ {
			fresh = append(fresh, orderMessage(i, 0))
		}
		produce(t, k.brokers, k.topic, fresh...)
		ev2 := newEvents()
		cfg.Hooks = []hooks.Hook{hooks.EventFunc(ev2.on)}
		b := start(t, cfg)
		waitUntil(t, 30*time.Second, "the partition to stop (or orders to be processed)", func() bool {
			return ev2.count(hooks.PartitionStopped) == 1 || ev2.count(hooks.Processed) > 0
		})
		time.Sleep(300 * time.Millisecond) // what a resumed partition would process shows now
		st := b.c.Stopped()
		if len(st) != 1 || st[0].Offset != 9 || st[0].Reason != consumer.ReasonTopicRecreated || !errors.Is(st[0], consumer.ErrPartitionStopped) {
			t.Errorf("Stopped() = %v, want offset 9 stopped for %s", st, consumer.ReasonTopicRecreated)
		} else if msg := st[0].Error(); !strings.Contains(msg, consumer.DefaultOffsetsTable) || !strings.Contains(msg, "--reset-offsets") {
			t.Errorf("the stop does not say what to do: %s", msg)
		}
		var pse *consumer.PartitionStoppedError
		if err := b.stop(t); !errors.As(err, &pse) || pse.Reason != consumer.ReasonTopicRecreated {
			t.Errorf("Run = %v, want the stopped partition", err)
		}
		if n := ev2.count(hooks.Processed); n != 0 {
			t.Errorf("%d processed from the stored offset of the old topic: orders 100-108 were skipped", n)
		}

		// The documented fix: delete the group's rows and reset its offsets.
		if err := s.db.Exec(`DELETE FROM `+consumer.DefaultOffsetsTable+` WHERE group_id = ?`, k.group).Error; err != nil {
			t.Fatal(err)
		}
		cl := &kafka.Client{Addr: kafka.TCP(k.brokers...), Timeout: 10 * time.Second}
		if _, err := cl.DeleteGroups(context.Background(), &kafka.DeleteGroupsRequest{GroupIDs: []string{k.group}}); err != nil {
			t.Fatal(err)
		}
		ev3 := newEvents()
		cfg.Hooks = []hooks.Hook{hooks.EventFunc(ev3.on)}
		c := start(t, cfg)
		waitUntil(t, 30*time.Second, "the 10 new messages", func() bool { return ev3.count(hooks.Processed) == 10 })
		if err := c.stop(t); err != nil {
			t.Fatal(err)
		}
		counts := s.counts(t)
		for _, i := range []int{0, 8, 100, 108, 109} {
			if n := counts["order-"+strconv.Itoa(i)]; n != 1 {
				t.Errorf("order-%d reserved %d times, want 1", i, n)
			}
		}
		if len(counts) != 19 {
			t.Errorf("%d orders reserved, want 19", len(counts))
		}
	})
}

// When the message before the stored offset is gone, the check of a
// recreated topic cannot be made: the partition starts all the same (never
// a stop it cannot justify), saying so at Info. Retention deleted it (the
// stored offset - 1 is below the log start), or compaction removed it (a
// later message has its key: the fetch returns a later offset).
func TestStoredOffsetCheckGivesWayToRetentionAndCompaction(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"retention", "compaction"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cluster.Close)
			brokers := cluster.ListenAddrs()
			tc := kafka.TopicConfig{Topic: "orders", NumPartitions: 1, ReplicationFactor: 1,
				ConfigEntries: []kafka.ConfigEntry{{ConfigName: "retention.ms", ConfigValue: "86400000"}}}
			if mode == "compaction" {
				tc.ConfigEntries = []kafka.ConfigEntry{{ConfigName: "cleanup.policy", ConfigValue: "compact"}}
			}
			createTopicWith(t, brokers, tc)
			var first []kafka.Message
			for i := range 3 {
				m := orderMessage(i, 0)
				if mode == "retention" {
					m.Time = time.Now().Add(-48 * time.Hour)
				}
				first = append(first, m)
			}
			produce(t, brokers, "orders", first...)
			s := newSQLiteShop(t)
			ev := newEvents()
			cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
			cfg.Offsets.Store = true
			a := start(t, cfg)
			waitUntil(t, 30*time.Second, "orders 0-2", func() bool { return ev.count(hooks.Processed) == 3 })
			if err := a.stop(t); err != nil {
				t.Fatal(err)
			}

			later := []kafka.Message{orderMessage(3, 0), orderMessage(4, 0)}
			if mode == "compaction" {
				later[0].Key = []byte("order-2") // a newer state of order-2's key: offset 2 is compacted away
			}
			for _, m := range later { // one batch each: compaction keeps the last batch as it is
				produce(t, brokers, "orders", m)
			}
			if mode == "retention" {
				cluster.ApplyRetention()
			} else {
				cluster.Compact()
			}
			left := 4 // compaction keeps 0, 1, 3, 4
			if mode == "retention" {
				left = 2
			}
			for _, m := range readAll(t, brokers, "orders", 1, left) {
				if m.Offset == 2 {
					t.Fatalf("offset 2 is still there after the %s", mode)
				}
			}

			ev2, rec := newEvents(), newRecorder(t)
			cfg.Hooks, cfg.Logger = []hooks.Hook{hooks.EventFunc(ev2.on)}, slog.New(rec)
			b := start(t, cfg)
			waitUntil(t, 30*time.Second, "orders 3 and 4", func() bool { return ev2.count(hooks.Processed) == 2 })
			if err := b.stop(t); err != nil {
				t.Fatalf("Run = %v, want no stopped partition", err)
			}
			if n := ev2.count(hooks.PartitionStopped); n != 0 {
				t.Errorf("%d partitions stopped", n)
			}
			if _, ok := rec.find(slog.LevelInfo, "cannot check that the topic was not recreated"); !ok {
				t.Error("no Info says that the check could not be made")
			}
			s.checkExactlyOnce(t, 5, nil)
		})
	}
}

// Without Offsets.Store, a group's committed offset past the log end stops
// the partition just as loudly (kafka-go's reader would wait there).
func TestCommittedOffsetBeyondLogEndStopsThePartition(t *testing.T) {
	t.Parallel()
	onEachBroker(t, func(t *testing.T, k kafkaTarget) {
		createTopicWith(t, k.brokers, kafka.TopicConfig{Topic: k.topic})
		s := newSQLiteShop(t)
		sendOrders(t, k.brokers, k.topic, 1, 2, nil)
		commitOffset(t, k.brokers, k.group, k.topic, 0, 10)
		ev := newEvents()
		r := start(t, baseConfig(t, k.brokers, k.topic, k.group, s, ev))
		waitUntil(t, 30*time.Second, "the partition to stop", func() bool { return ev.count(hooks.PartitionStopped) == 1 })
		st := r.c.Stopped()
		if len(st) != 1 || st[0].Offset != 10 || st[0].Reason != consumer.ReasonOffsetBeyondLogEnd || !strings.Contains(st[0].Error(), "committed") {
			t.Fatalf("Stopped() = %v, want offset 10 stopped for %s", st, consumer.ReasonOffsetBeyondLogEnd)
		}
		if err := r.stop(t); !errors.Is(err, consumer.ErrOffsetBeyondLogEnd) {
			t.Errorf("Run = %v, want the stopped partition", err)
		}
		if got := committed(t, k.brokers, k.group, k.topic, 1); got[0] != 10 {
			t.Errorf("committed %v, want 10 left alone", got)
		}
	})
}

// Retention deleted messages the group had not processed: the consumer
// starts at the log start, and says at Warn how many it skipped.
func TestOffsetBelowLogStartIsSkippedLoudly(t *testing.T) {
	t.Parallel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	cr, err := cl.CreateTopics(context.Background(), &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: "orders", NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: []kafka.ConfigEntry{{ConfigName: "retention.ms", ConfigValue: "86400000"}},
	}}})
	if err != nil || cr.Errors["orders"] != nil {
		t.Fatalf("create topic: %v %v", err, cr)
	}
	var old []kafka.Message
	for i := range 3 {
		m := orderMessage(i, 0)
		m.Time = time.Now().Add(-48 * time.Hour)
		old = append(old, m)
	}
	produce(t, brokers, "orders", old...)
	produce(t, brokers, "orders", orderMessage(3, 0), orderMessage(4, 0))
	cluster.ApplyRetention()
	lo, err := cl.ListOffsets(context.Background(), &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{"orders": {kafka.FirstOffsetOf(0)}}})
	if err != nil || lo.Topics["orders"][0].FirstOffset != 3 {
		t.Fatalf("retention did not delete offsets 0..2: %v %+v", err, lo)
	}
	commitOffset(t, brokers, "inventory", "orders", 0, 1)

	s := newSQLiteShop(t)
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	rec := newRecorder(t)
	cfg.Logger = slog.New(rec)
	r := start(t, cfg)
	waitUntil(t, 20*time.Second, "orders 3 and 4", func() bool { return ev.count(hooks.Processed) == 2 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	attrs, ok := rec.find(slog.LevelWarn, "deleted")
	if !ok || attrs["skipped"].Int64() != 2 || attrs["log_start"].Int64() != 3 {
		t.Fatalf("no Warn about the 2 messages deleted before they were processed (found %v)", attrs)
	}
	if got := committed(t, brokers, "inventory", "orders", 1); got[0] != 5 {
		t.Errorf("committed %v, want 5", got)
	}
	s.checkExactlyOnce(t, 5, map[int]bool{0: true, 1: true, 2: true})
}

// The topic is deleted and recreated while the consumer runs: the
// partition's next offset is then past the new log end, and kafka-go's
// reader would wait there. The idle partition's periodic check stops it,
// without waiting for a rebalance.
func TestTopicRecreatedWhileRunningStopsThePartition(t *testing.T) {
	t.Parallel()
	onEachBroker(t, func(t *testing.T, k kafkaTarget) {
		createTopicWith(t, k.brokers, kafka.TopicConfig{Topic: k.topic})
		s := newSQLiteShop(t)
		sendOrders(t, k.brokers, k.topic, 1, 5, nil)
		ev := newEvents()
		cfg := baseConfig(t, k.brokers, k.topic, k.group, s, ev)
		cfg.Offsets.Store = true
		r := startWith(t, cfg, &testhooks.Knobs{LogCheckInterval: 200 * time.Millisecond})
		waitUntil(t, 30*time.Second, "5 processed", func() bool { return ev.count(hooks.Processed) == 5 })
		recreateTopic(t, k.brokers, k.topic)
		produce(t, k.brokers, k.topic, orderMessage(5, 0), orderMessage(6, 0))
		waitUntil(t, 30*time.Second, "the partition to stop", func() bool { return ev.count(hooks.PartitionStopped) == 1 })
		st := r.c.Stopped()
		if len(st) != 1 || st[0].Offset != 5 || st[0].Reason != consumer.ReasonOffsetBeyondLogEnd || !errors.Is(st[0], consumer.ErrOffsetBeyondLogEnd) {
			t.Fatalf("Stopped() = %v, want offset 5 stopped for %s", st, consumer.ReasonOffsetBeyondLogEnd)
		}
		if n := ev.count(hooks.Assigned); n != 1 {
			t.Logf("%d assignments: the group rebalanced", n)
		}
		if err := r.stop(t); !errors.Is(err, consumer.ErrOffsetBeyondLogEnd) {
			t.Errorf("Run = %v, want the stopped partition", err)
		}
	})
}
