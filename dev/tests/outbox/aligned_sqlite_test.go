//go:build cgo

package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

func alignedSQLite(t *testing.T, shards int) (*gorm.DB, *inboxsqlite.OutboxStore) {
	t.Helper()
	db, _ := sequenceDB(t)
	store, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Table: "aligned", Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	return db, store
}

func TestSQLiteOutboxIsSharded(t *testing.T) {
	store, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Shards: 8})
	if err != nil {
		t.Fatal(err)
	}
	if store.Shards() != 8 {
		t.Fatalf("Shards() = %d, want 8", store.Shards())
	}
	if def, _ := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{}); def.Shards() != inboxsqlite.DefaultShards {
		t.Fatalf("default Shards() = %d, want %d", def.Shards(), inboxsqlite.DefaultShards)
	}
}

// An aligned outbox takes messages for its topic only: a call with one for
// another topic fails before anything is written, even if the caller
// commits its transaction anyway.
func TestAlignedEnqueueRefusesAnotherTopic(t *testing.T) {
	ctx := t.Context()
	db, store := alignedSQLite(t, 4)
	ob := newOutbox(t, db, store, outbox.Config{AlignedTopic: "orders"})
	var enqErr error
	if err := db.Transaction(func(tx *gorm.DB) error {
		enqErr = ob.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: []byte("k")}, outbox.Message{Topic: "payments", Key: []byte("k")})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var ve *inbox.ValidationError
	if !errors.Is(enqErr, inbox.ErrInvalidMessage) || !errors.As(enqErr, &ve) || ve.Field != "topic" || ve.Value != "payments" {
		t.Fatalf("Enqueue for another topic: %v, want a validation error of the topic", enqErr)
	}
	var rows int64
	if err := db.Raw(`SELECT COUNT(*) FROM aligned`).Scan(&rows).Error; err != nil || rows != 0 {
		t.Fatalf("%d rows stored (%v), want none", rows, err)
	}
	if c := ob.Counters(); c.Refused != 1 || c.Enqueued != 0 {
		t.Fatalf("counters %+v, want one refused call", c)
	}
}

// Aligned mode is refused without what it stands on: a store that tells
// its shard count, sequence headers, a valid topic, a pinning publisher.
func TestAlignedConfigRefused(t *testing.T) {
	db, store := alignedSQLite(t, 4)
	for name, tc := range map[string]struct {
		store storage.OutboxStore
		cfg   outbox.Config
	}{
		"store without storage.Sharded": {struct {
			storage.OutboxStore
			storage.Sequenced
		}{store, store}, outbox.Config{AlignedTopic: "t"}},
		"NoSequenceHeaders": {store, outbox.Config{AlignedTopic: "t", NoSequenceHeaders: true}},
		"store without storage.Sequenced": {struct {
			storage.OutboxStore
			storage.Sharded
		}{store, store}, outbox.Config{AlignedTopic: "t"}},
		"invalid topic": {store, outbox.Config{AlignedTopic: "a b"}},
	} {
		if _, err := outbox.New(db, tc.store, tc.cfg); !errors.Is(err, inbox.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	ob := newOutbox(t, db, store, outbox.Config{AlignedTopic: "t"})
	if _, err := ob.NewRelay(&conformance.Recorder{}, outbox.RelayConfig{}); !errors.Is(err, inbox.ErrInvalidConfig) {
		t.Errorf("relay through a publisher that cannot pin: %v, want ErrInvalidConfig", err)
	}
	w := outbox.NewKafkaWriter("127.0.0.1:1")
	w.Balancer = kafka.Murmur2Balancer{}
	kp, err := outbox.NewKafkaPublisher(w)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.NewRelay(kp, outbox.RelayConfig{}); !errors.Is(err, inbox.ErrInvalidConfig) {
		t.Errorf("relay through a kafka writer with a Murmur2Balancer: %v, want ErrInvalidConfig", err)
	}
}

// The relay of an aligned outbox pins every message, with a key or not, to
// the partition that is its shard, stamps the partition count, and keeps
// each partition's numbers contiguous. While the topic has another count,
// from the check before publishing or seen by the write itself, a cycle
// publishes and marks nothing; once the counts agree the stream goes on
// where it stopped.
func TestAlignedRelayPins(t *testing.T) {
	ctx := t.Context()
	const shards = 4
	db, store := alignedSQLite(t, shards)
	source, _, err := store.Source(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	ob := newOutbox(t, db, store, outbox.Config{AlignedTopic: "orders"})
	pub := &pinRecorder{count: shards}
	relay, err := ob.NewRelay(pub, outbox.RelayConfig{ID: "r", MaxMessages: 25})
	if err != nil {
		t.Fatal(err)
	}
	for lo := 0; lo < 100; lo += 5 {
		if err := enqueue(ctx, db, ob, alignedMessages("orders", lo, 5, 12)...); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := conformance.Drain(ctx, relay); err != nil || n != 100 {
		t.Fatalf("drained %d, %v; want 100", n, err)
	}
	got, parts := pub.published()
	alignedStreams(t, got, func(i int) int { return parts[i] }, shards, source)

	for name, set := range map[string]func(){
		"the topic has 5 partitions":  func() { pub.count = 5 },
		"the write sees 5 partitions": func() { pub.count, pub.seen = shards, 5 },
	} {
		pub.mu.Lock()
		set()
		pub.mu.Unlock()
		if err := enqueue(ctx, db, ob, alignedMessages("orders", 100, 10, 12)...); err != nil {
			t.Fatal(err)
		}
		n, err := relay.PublishOnce(ctx)
		var pe *outbox.PartitionCountError
		if n != 0 || !errors.As(err, &pe) || pe.Topic != "orders" || pe.Partitions != 5 || pe.Shards != shards {
			t.Fatalf("%s: published %d, %v; want nothing and a PartitionCountError of 5 against %d", name, n, err, shards)
		}
		pub.mu.Lock()
		pub.count, pub.seen = shards, 0
		pub.mu.Unlock()
		if n, err := conformance.Drain(ctx, relay); err != nil || n != 10 {
			t.Fatalf("%s, then restored: drained %d, %v; want 10", name, n, err)
		}
	}
	got, parts = pub.published()
	if len(got) != 120 {
		t.Fatalf("published %d messages, want 120", len(got))
	}
	alignedStreams(t, got, func(i int) int { return parts[i] }, shards, source)
	if _, n := headerOf(got, header.SeqPartitions); n != len(got) {
		t.Fatalf("%d of %d messages carry %s", n, len(got), header.SeqPartitions)
	}
}

// A row stored by an outbox that was not aligned (another topic, or a key
// in a shard other than its partition) stops its shard in an aligned
// relay, loudly: it is never published to the wrong partition.
func TestAlignedRelayRefusesMisalignedRows(t *testing.T) {
	ctx := t.Context()
	const shards = 4
	db, store := alignedSQLite(t, shards)
	plain := newOutbox(t, db, store, outbox.Config{})
	aligned := newOutbox(t, db, store, outbox.Config{AlignedTopic: "orders"})
	all := []int{0, 1, 2, 3}
	// A key whose FNV shard (the plain outbox's) is not its partition.
	var key []byte
	for i := 0; key == nil; i++ {
		k := []byte("k" + strconv.Itoa(i))
		if err := enqueue(ctx, db, plain, outbox.Message{Topic: "orders", Key: k}); err != nil {
			t.Fatal(err)
		}
		var shard int
		if err := db.Raw(`SELECT shard FROM aligned WHERE msg_key = ?`, k).Scan(&shard).Error; err != nil {
			t.Fatal(err)
		}
		if shard != (kafka.Murmur2Balancer{}).Balance(kafka.Message{Key: k}, all...) {
			key = k
		}
		if i > 100 {
			t.Fatal("no key of another shard than its partition")
		}
	}
	if err := enqueue(ctx, db, plain, outbox.Message{Topic: "payments", Key: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	pub := &pinRecorder{count: shards}
	relay, err := aligned.NewRelay(pub, outbox.RelayConfig{ID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = relay.PublishOnce(ctx)
	if !errors.Is(err, outbox.ErrShardStuck) {
		t.Fatalf("cycle over misaligned rows: %v, want ErrShardStuck", err)
	}
	got, parts := pub.published()
	for i, m := range got {
		if string(m.Key) == string(key) || m.Topic != "orders" {
			t.Fatalf("published %s key %q to partition %d", m.Topic, m.Key, parts[i])
		}
	}
}

// A relay's hook that implements no hook interface would do nothing:
// NewRelay refuses it.
func TestNewRelayRefusesNonHooks(t *testing.T) {
	db, store := sequenceDB(t)
	ob := newOutbox(t, db, store, outbox.Config{})
	for _, h := range []hooks.Hook{"not a hook", 42, func(hooks.Event) {}} {
		_, err := ob.NewRelay(&pinRecorder{count: 1}, outbox.RelayConfig{Hooks: []hooks.Hook{h}})
		if !errors.Is(err, inbox.ErrInvalidConfig) || !strings.Contains(err.Error(), fmt.Sprintf("outbox.RelayConfig.Hooks[0] is a %T", h)) {
			t.Errorf("%#v: NewRelay = %v, want ErrInvalidConfig naming the hook", h, err)
		}
	}
	if _, err := ob.NewRelay(&pinRecorder{count: 1}, outbox.RelayConfig{Hooks: []hooks.Hook{hooks.EventFunc(func(hooks.Event) {})}}); err != nil {
		t.Fatal(err)
	}
}

// A relay started on a topic whose partition count is not the aligned
// outbox's shard count returns at once, naming both counts.
func TestAlignedRelayRunRefusesAnotherPartitionCount(t *testing.T) {
	db, store := alignedSQLite(t, 4)
	ob := newOutbox(t, db, store, outbox.Config{AlignedTopic: "orders"})
	relay, err := ob.NewRelay(&pinRecorder{count: 6}, outbox.RelayConfig{ID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err = relay.Run(ctx)
	var pc *outbox.PartitionCountError
	if !errors.As(err, &pc) || pc.Partitions != 6 || pc.Shards != 4 || ctx.Err() != nil {
		t.Fatalf("Run: %v, want a PartitionCountError of 6 partitions and 4 shards at once", err)
	}
}
