package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

// The adapters' outbox stores tell their shard count.
func TestOutboxStoresAreSharded(t *testing.T) {
	stores := map[string]func(shards int) (storage.OutboxStore, error){
		"postgres": func(n int) (storage.OutboxStore, error) {
			return inboxpg.NewOutbox(inboxpg.OutboxOptions{Shards: n})
		},
		"mysql": func(n int) (storage.OutboxStore, error) {
			return inboxmysql.NewOutbox(inboxmysql.OutboxOptions{Shards: n})
		},
	}
	for name, open := range stores {
		for shards, want := range map[int]int{0: 64, 1: 1, 8: 8} {
			store, err := open(shards)
			if err != nil {
				t.Fatal(err)
			}
			sh, ok := store.(storage.Sharded)
			if !ok || sh.Shards() != want {
				t.Errorf("%s store of Shards %d: storage.Sharded %v, want %d shards", name, shards, ok, want)
			}
		}
	}
}

// alignedStreams checks msgs, everything an aligned outbox of shards
// shards published to its topic, as partition reads them (in offset order
// per partition): each message is on the partition Kafka's partitioner
// gives its key (its event id without one), which is its shard, carries
// the partition count, and each partition's numbers are 1, 2, 3, ...
// without holes. It returns each partition's last number.
func alignedStreams(t *testing.T, msgs []kafka.Message, partitionOf func(i int) int, shards int, source string) map[int]int64 {
	t.Helper()
	all := make([]int, shards)
	for i := range all {
		all[i] = i
	}
	last := map[int]int64{}
	for i, m := range msgs {
		hs := headers(m)
		one := func(k string) string {
			if len(hs[k]) != 1 {
				t.Fatalf("message %d (key %q): %s = %q, want one value", i, m.Key, k, hs[k])
			}
			return hs[k][0]
		}
		p := partitionOf(i)
		placed := m.Key
		if placed == nil {
			placed = []byte(one(header.EventID))
		}
		if want := (kafka.Murmur2Balancer{}).Balance(kafka.Message{Key: placed}, all...); p != want {
			t.Fatalf("message %d (key %q) on partition %d, Kafka's partitioner gives %d", i, m.Key, p, want)
		}
		if got := one(header.SeqShard); got != strconv.Itoa(p) {
			t.Fatalf("message %d on partition %d has shard %s", i, p, got)
		}
		if got := one(header.SeqPartitions); got != strconv.Itoa(shards) {
			t.Fatalf("message %d: %s = %s, want %d", i, header.SeqPartitions, got, shards)
		}
		if got := one(header.SeqSource); got != source {
			t.Fatalf("message %d: source %s, want %s", i, got, source)
		}
		seq, err := strconv.ParseInt(one(header.Seq), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if seq != last[p]+1 {
			t.Fatalf("partition %d: seq %d after %d: the stream is not contiguous", p, seq, last[p])
		}
		last[p] = seq
	}
	return last
}

// alignedMessages returns n messages for topic over keys keys, every
// tenth without a key.
func alignedMessages(topic string, from, n, keys int) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "key-%d", (from+i)%keys), Value: []byte(strconv.Itoa(from + i))}
		if (from+i)%10 == 0 {
			msgs[i].Key = nil
		}
	}
	return msgs
}

// endOffsets returns the end offset of topic's partitions 0..n-1.
func endOffsets(ctx context.Context, t *testing.T, brokers []string, topic string, n int) []int64 {
	t.Helper()
	ends := make([]int64, n)
	for p := range ends {
		ends[p] = endOffset(ctx, t, brokers, topic, p)
	}
	return ends
}

// An aligned relay against a real broker: every message, with a key or
// not, lands on the partition equal to its shard, which is the partition
// Kafka's partitioner gives its key, and each partition's numbers are
// contiguous. Once the topic has more partitions, every cycle fails with
// the counts and nothing more is published, not even through a write that
// was pinned for the old count.
func TestAlignedRelayKafka(t *testing.T) {
	brokers := testservers.KafkaBrokers(t)
	for _, pub := range publishers {
		t.Run(pub.name, func(t *testing.T) { runAlignedRelayKafka(t, brokers, pub.open(t, brokers)) })
	}
}

func runAlignedRelayKafka(t *testing.T, brokers []string, kp relayPublisher) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	db, err := gorm.Open(gormpg.Open(testservers.PostgresDSN(t)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	sfx := conformance.RandomSuffix()
	schema := "aligned_" + sfx
	t.Cleanup(func() {
		db.Exec(`DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`)
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	const shards, keys, writers, perWriter, perTx = 8, 50, 4, 100, 4
	store, err := inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: schema, Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	topic := "aligned-" + sfx
	if err := inventory.CreateTopic(ctx, brokers[0], topic, shards); err != nil {
		t.Fatal(err)
	}
	ob := newOutbox(t, db, store, outbox.Config{AlignedTopic: topic})
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	source, _, err := store.Source(ctx, db)
	if err != nil {
		t.Fatal(err)
	}

	relay, err := ob.NewRelay(kp, outbox.RelayConfig{ID: "aligned", MaxMessages: 100})
	if err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	for wr := range writers {
		wg.Go(func() {
			msgs := alignedMessages(topic, wr*perWriter, perWriter, keys)
			for lo := 0; lo < len(msgs); lo += perTx {
				if err := enqueue(ctx, db, ob, msgs[lo:lo+perTx]...); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	n, err := conformance.Drain(ctx, relay)
	if err != nil || n != writers*perWriter {
		t.Fatalf("drained %d, %v; want %d", n, err, writers*perWriter)
	}
	got := readTopic(ctx, t, brokers, topic, shards)
	if len(got) != writers*perWriter {
		t.Fatalf("the topic holds %d messages, want %d", len(got), writers*perWriter)
	}
	last := alignedStreams(t, got, func(i int) int { return got[i].Partition }, shards, source)
	if len(last) != shards {
		t.Fatalf("messages on %d partitions of %d: %v", len(last), shards, last)
	}

	// The topic grows by a partition.
	addPartitions(ctx, t, brokers, topic, shards+1)
	for {
		n, err := kp.Partitions(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		if n == shards+1 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	before := endOffsets(ctx, t, brokers, topic, shards+1)
	if err := enqueue(ctx, db, ob, alignedMessages(topic, writers*perWriter, 20, keys)...); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		n, err := relay.PublishOnce(ctx)
		var pe *outbox.PartitionCountError
		if n != 0 || !errors.Is(err, outbox.ErrPartitionCount) || !errors.As(err, &pe) || pe.Topic != topic || pe.Partitions != shards+1 || pe.Shards != shards {
			t.Fatalf("cycle on a topic of %d partitions: published %d, %v; want nothing and a PartitionCountError of %d against %d",
				shards+1, n, err, shards+1, shards)
		}
	}
	// A write pinned for the old count, as if the count changed between
	// the relay's check and the writer's balancing: refused in the client.
	pinnedCtx, stop := context.WithTimeout(ctx, 30*time.Second)
	msgs := []kafka.Message{{Topic: topic, Key: []byte("key-1"), Value: []byte("late")}, {Topic: topic, Key: []byte("key-2"), Value: []byte("late")}}
	err = kp.PublishPinned(pinnedCtx, msgs, []int{1, 2}, shards)
	stop()
	var we kafka.WriteErrors
	if !errors.Is(err, outbox.ErrPartitionCount) || !errors.As(err, &we) || len(we) != 2 || we[0] == nil || we[1] == nil {
		t.Fatalf("a write pinned for %d partitions on a topic of %d: %v; want both messages failed and ErrPartitionCount", shards, shards+1, err)
	}
	if after := endOffsets(ctx, t, brokers, topic, shards+1); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("end offsets went from %v to %v: something was published", before, after)
	}
	var unpublished int64
	if err := db.Raw(`SELECT COUNT(*) FROM ` + schema + `.outbox_messages o JOIN ` + schema + `.outbox_messages_relay r ON r.shard = o.shard WHERE o.seq > r.published_through`).Scan(&unpublished).Error; err != nil {
		t.Fatal(err)
	}
	if unpublished != 20 {
		t.Fatalf("%d rows unpublished, want the 20 enqueued after the topic grew", unpublished)
	}
}
