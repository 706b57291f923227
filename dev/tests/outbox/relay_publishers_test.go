//go:build cgo

package outbox_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/outbox"
)

// The relay end to end through each publisher this library ships, against
// the real broker and the in-process one (kfake): order per key, a
// publish that fails in part, and an aligned outbox that stamps sequence
// headers (read back through the publisher's Witness) and refuses a topic
// whose partition count changed.
func TestRelayThroughEachPublisher(t *testing.T) {
	brokers := map[string]func(t *testing.T) []string{
		"broker": func(t *testing.T) []string { return testservers.KafkaBrokers(t) },
		"kfake": func(t *testing.T) []string {
			c, err := kfake.NewCluster(kfake.NumBrokers(1))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			return c.ListenAddrs()
		},
	}
	for _, where := range []string{"broker", "kfake"} {
		t.Run(where, func(t *testing.T) {
			for _, pub := range publishers {
				t.Run(pub.name, func(t *testing.T) {
					t.Run("order per key", func(t *testing.T) {
						b := brokers[where](t)
						relayOrderPerKey(t, b, pub.open(t, b))
					})
					t.Run("partial failure", func(t *testing.T) {
						b := brokers[where](t)
						relayPartialFailure(t, b, pub.open(t, b))
					})
					t.Run("aligned", func(t *testing.T) {
						b := brokers[where](t)
						relayAligned(t, b, func() relayPublisher { return pub.open(t, b) })
					})
				})
			}
		})
	}
}

// sqliteOutbox returns a migrated SQLite outbox of shards shards.
func sqliteOutbox(t *testing.T, shards int, cfg outbox.Config) (*gorm.DB, *inboxsqlite.OutboxStore, *outbox.Outbox) {
	t.Helper()
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "ob.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	store, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	ob := newOutbox(t, db, store, cfg)
	if err := ob.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return db, store, ob
}

// checkKeys checks that the first copy of each key's messages in got came
// in the order of their values 0, 1, 2, ... on the partition the Java
// client gives the key, and that every message is there.
func checkKeys(t *testing.T, got []kafka.Message, partitions, keys, perKey int) {
	t.Helper()
	all := make([]int, partitions)
	for i := range all {
		all[i] = i
	}
	seen := map[string]bool{}
	next := map[string]int{}
	for _, m := range got {
		if want := (kafka.Murmur2Balancer{}).Balance(m, all...); m.Partition != want {
			t.Fatalf("key %q on partition %d, the Java client's partitioner gives %d", m.Key, m.Partition, want)
		}
		if v := string(m.Key) + "/" + string(m.Value); seen[v] {
			continue
		} else {
			seen[v] = true
		}
		n, _ := strconv.Atoi(string(m.Value))
		if n != next[string(m.Key)] {
			t.Fatalf("key %q: first copy of %d after %d: out of order", m.Key, n, next[string(m.Key)]-1)
		}
		next[string(m.Key)]++
	}
	if len(seen) != keys*perKey {
		t.Fatalf("%d distinct messages in the topic, want %d", len(seen), keys*perKey)
	}
}

func keyed(topic string, key, value int) outbox.Message {
	return outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "key-%d", key), Value: []byte(strconv.Itoa(value))}
}

func relayOrderPerKey(t *testing.T, brokers []string, pub relayPublisher) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const partitions, keys, perKey = 4, 10, 20
	topic := "order-" + conformance.RandomSuffix()
	if err := inventory.CreateTopic(ctx, brokers[0], topic, partitions); err != nil {
		t.Fatal(err)
	}
	waitForLeaders(ctx, t, pub, topic, partitions)
	db, _, ob := sqliteOutbox(t, 8, outbox.Config{})
	relay, err := ob.NewRelay(pub, outbox.RelayConfig{ID: "order", MaxMessages: 30})
	if err != nil {
		t.Fatal(err)
	}
	for v := range perKey {
		var msgs []outbox.Message
		for k := range keys {
			msgs = append(msgs, keyed(topic, k, v))
		}
		if err := enqueue(ctx, db, ob, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := conformance.Drain(ctx, relay); err != nil || n != keys*perKey {
		t.Fatalf("drained %d, %v; want %d", n, err, keys*perKey)
	}
	checkKeys(t, readTopic(ctx, t, brokers, topic, partitions), partitions, keys, perKey)
}

// A message the broker refuses (larger than the topic's
// max.message.bytes) fails its partition's batch: Publish reports one
// entry per message, the relay marks in each shard only what came before
// the first failure, the other partitions' messages are published, and
// once the topic takes the message every key's messages are in order.
func relayPartialFailure(t *testing.T, brokers []string, pub relayPublisher) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const partitions, keys, perKey = 4, 8, 3
	topic := "partial-" + conformance.RandomSuffix()
	if err := inventory.CreateTopic(ctx, brokers[0], topic, partitions); err != nil {
		t.Fatal(err)
	}
	waitForLeaders(ctx, t, pub, topic, partitions)
	setTopicConfig(ctx, t, brokers, topic, "max.message.bytes", "4000")
	big := keyed(topic, 0, 1)
	// Random, so that no compression brings it under the limit.
	big.Value = append([]byte("1 "), make([]byte, 8000)...)
	_, _ = rand.Read(big.Value[2:])
	all := []int{0, 1, 2, 3}
	bigPartition := (kafka.Murmur2Balancer{}).Balance(kafka.Message{Key: big.Key}, all...)

	// Publish itself: one entry per message, nil for those of other
	// partitions.
	direct := []kafka.Message{
		{Topic: topic, Key: big.Key, Value: big.Value},
		{Topic: topic, Key: []byte("key-1"), Value: []byte("direct")},
	}
	otherPartition := (kafka.Murmur2Balancer{}).Balance(direct[1], all...)
	for k := 2; otherPartition == bigPartition; k++ {
		direct[1].Key = fmt.Appendf(nil, "key-%d", k)
		otherPartition = (kafka.Murmur2Balancer{}).Balance(direct[1], all...)
	}
	err := pub.Publish(ctx, direct)
	var we kafka.WriteErrors
	if !errors.As(err, &we) || len(we) != 2 || we[0] == nil || we[1] != nil {
		t.Fatalf("Publish of a refused message and one of another partition: %v; want a kafka.WriteErrors failing the first only", err)
	}
	var ke kafka.Error
	if !errors.As(we[0], &ke) || ke != kafka.MessageSizeTooLarge {
		t.Fatalf("the refused message's error is %v, want kafka.MessageSizeTooLarge", we[0])
	}

	db, _, ob := sqliteOutbox(t, 8, outbox.Config{})
	relay, err := ob.NewRelay(pub, outbox.RelayConfig{ID: "partial"})
	if err != nil {
		t.Fatal(err)
	}
	for v := range perKey {
		var msgs []outbox.Message
		for k := range keys {
			m := keyed(topic, k, v)
			if k == 0 && v == 1 {
				m = big
			}
			msgs = append(msgs, m)
		}
		if err := enqueue(ctx, db, ob, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	n, err := relay.PublishOnce(ctx)
	if err == nil || !errors.As(err, &we) {
		t.Fatalf("cycle with a refused message: %d, %v; want a per-message failure", n, err)
	}
	inBig := 0
	for k := range keys {
		if (kafka.Murmur2Balancer{}).Balance(kafka.Message{Key: fmt.Appendf(nil, "key-%d", k)}, all...) == bigPartition {
			inBig++
		}
	}
	// The refused partition's batch held all its keys' messages.
	if want := (keys - inBig) * perKey; n != want {
		t.Fatalf("the cycle marked %d published, want the %d of the other partitions", n, want)
	}
	for _, m := range readTopic(ctx, t, brokers, topic, partitions) {
		if m.Partition == bigPartition {
			t.Fatalf("partition %d holds %q/%q: its batch failed", bigPartition, m.Key, m.Value)
		}
	}

	setTopicConfig(ctx, t, brokers, topic, "max.message.bytes", "100000")
	deadline := time.Now().Add(30 * time.Second)
	for {
		left, err := conformance.Drain(ctx, relay)
		n += left
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after raising max.message.bytes: %v", err)
		}
		time.Sleep(200 * time.Millisecond) // the broker applies the config
	}
	if n != keys*perKey {
		t.Fatalf("published %d in all, want %d", n, keys*perKey)
	}
	var got []kafka.Message
	for _, m := range readTopic(ctx, t, brokers, topic, partitions) {
		if string(m.Value) != "direct" {
			got = append(got, m)
		}
	}
	for i := range got {
		if len(got[i].Value) > 8000 {
			got[i].Value = []byte("1")
		}
	}
	checkKeys(t, got, partitions, keys, perKey)
}

// An aligned outbox stamping sequence headers: a relay checks each
// partition through the publisher's Witness before it publishes there, a
// second relay (with nothing of the first's view) reads back what the
// first published and goes on where it stopped, and a topic grown by a
// partition is refused, by the relay and by a write pinned for the old
// count.
func relayAligned(t *testing.T, brokers []string, open func() relayPublisher) {
	pub := open()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const shards, keys = 4, 12
	topic := "aligned-" + conformance.RandomSuffix()
	if err := inventory.CreateTopic(ctx, brokers[0], topic, shards); err != nil {
		t.Fatal(err)
	}
	db, store, ob := sqliteOutbox(t, shards, outbox.Config{AlignedTopic: topic})
	source, _, err := store.Source(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	waitForLeaders(ctx, t, pub, topic, shards)
	// The second relay has the first's id, to take its leases at once,
	// and none of its view of the partitions.
	for round, id := range []string{"first", "second"} {
		relay, err := ob.NewRelay(pub, outbox.RelayConfig{ID: "aligned", MaxMessages: 25})
		if err != nil {
			t.Fatal(err)
		}
		for lo := round * 60; lo < (round+1)*60; lo += 5 {
			if err := enqueue(ctx, db, ob, alignedMessages(topic, lo, 5, keys)...); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := conformance.Drain(ctx, relay); err != nil || n != 60 {
			t.Fatalf("relay %s drained %d, %v; want 60", id, n, err)
		}
	}
	got := readTopic(ctx, t, brokers, topic, shards)
	if len(got) != 120 {
		t.Fatalf("the topic holds %d messages, want 120", len(got))
	}
	alignedStreams(t, got, func(i int) int { return got[i].Partition }, shards, source)

	// The second relay's witness, read through ReadPartition, matches what
	// the first published: its messages numbered past the mark.
	ends, err := pub.EndOffsets(ctx, topic, []int{0, 1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	read := 0
	for p := range shards {
		first, err := pub.ReadPartition(ctx, topic, p, 0, ends[p], func(m kafka.Message) error {
			if m.Partition != p || m.Topic != topic || m.Offset != int64(read-countBefore(got, p)) {
				return fmt.Errorf("read %s/%d@%d, want partition %d in order", m.Topic, m.Partition, m.Offset, p)
			}
			read++
			return nil
		})
		if err != nil || first != 0 {
			t.Fatalf("ReadPartition of %d: first %d, %v", p, first, err)
		}
	}
	if read != 120 {
		t.Fatalf("ReadPartition read %d messages, want 120", read)
	}

	addPartitions(ctx, t, brokers, topic, shards+1)
	for {
		n, err := pub.Partitions(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		if n == shards+1 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := enqueue(ctx, db, ob, alignedMessages(topic, 120, 10, keys)...); err != nil {
		t.Fatal(err)
	}
	relay, err := ob.NewRelay(pub, outbox.RelayConfig{ID: "aligned"})
	if err != nil {
		t.Fatal(err)
	}
	n, err := relay.PublishOnce(ctx)
	var pe *outbox.PartitionCountError
	if n != 0 || !errors.As(err, &pe) || pe.Partitions != shards+1 || pe.Shards != shards {
		t.Fatalf("cycle on a topic of %d partitions: published %d, %v; want a PartitionCountError", shards+1, n, err)
	}
	// A write pinned for the old count, as if the count changed between
	// the relay's check and the write: refused by a publisher that read
	// the new count, and by a new one, which only its producer's metadata
	// tells.
	for i, p := range []relayPublisher{pub, open()} {
		err = p.PublishPinned(ctx, []kafka.Message{{Topic: topic, Key: []byte("late")}, {Topic: topic, Key: []byte("later")}}, []int{1, 2}, shards)
		var we kafka.WriteErrors
		var pe *outbox.PartitionCountError
		if !errors.As(err, &pe) || pe.Partitions != shards+1 || !errors.As(err, &we) || len(we) != 2 || we[0] == nil || we[1] == nil {
			t.Fatalf("publisher %d: a write pinned for %d partitions on a topic of %d: %v; want both messages failed and a PartitionCountError", i, shards, shards+1, err)
		}
	}
	if after := readTopic(ctx, t, brokers, topic, shards+1); len(after) != 120 {
		t.Fatalf("the topic holds %d messages after the refused writes, want 120", len(after))
	}
}

// waitForLeaders waits until every partition of a new topic answers for
// its end offset: its leader was elected.
func waitForLeaders(ctx context.Context, t *testing.T, pub relayPublisher, topic string, partitions int) {
	t.Helper()
	all := make([]int, partitions)
	for i := range all {
		all[i] = i
	}
	for {
		_, err := pub.EndOffsets(ctx, topic, all)
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("topic %s has no leaders: %v", topic, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// countBefore returns how many of got lie on partitions below p (got is
// in partition order).
func countBefore(got []kafka.Message, p int) int {
	n := 0
	for _, m := range got {
		if m.Partition < p {
			n++
		}
	}
	return n
}
