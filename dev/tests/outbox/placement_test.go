package outbox_test

import (
	"context"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/outbox"
)

// beforePublish runs before, once, ahead of the next PublishPinned, and
// counts the relay's requests for the end offsets.
type beforePublish struct {
	relayPublisher
	before     func(msgs []kafka.Message, parts []int)
	endOffsets atomic.Int64
}

func (p *beforePublish) PublishPinned(ctx context.Context, msgs []kafka.Message, parts []int, n int) error {
	if b := p.before; b != nil {
		p.before = nil
		b(msgs, parts)
	}
	return p.relayPublisher.PublishPinned(ctx, msgs, parts, n)
}

func (p *beforePublish) EndOffsets(ctx context.Context, topic string, partitions []int) (map[int]int64, error) {
	p.endOffsets.Add(1)
	return p.relayPublisher.EndOffsets(ctx, topic, partitions)
}

// An aligned relay takes the offsets of its messages from the publisher
// (each shipped one reports those of the broker's answer to its write): a
// cycle that nobody raced sends no request for the end offsets after its
// publish. When another writer appended to a partition between the relay's
// check and its write, the offsets do not follow what the relay read: it
// reads the end offsets and the partition, finds the number taken by the
// other message, and publishes its own again under a new epoch.
func TestAlignedRelayTakesOffsetsFromItsWrite(t *testing.T) {
	brokers := testservers.KafkaBrokers(t)
	for _, p := range publishers {
		t.Run(p.name, func(t *testing.T) { alignedRelayTakesOffsetsFromItsWrite(t, brokers, p.open(t, brokers)) })
	}
}

func alignedRelayTakesOffsetsFromItsWrite(t *testing.T, brokers []string, rp relayPublisher) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	db, err := gorm.Open(gormpg.Open(testservers.PostgresDSN(t)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	sfx := conformance.RandomSuffix()
	schema := "placed_" + sfx
	t.Cleanup(func() {
		db.Exec(`DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`)
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	const shards, keys = 3, 12
	store, err := inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: schema, Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	topic := "placed-" + sfx
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
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	pub := &beforePublish{relayPublisher: rp}
	relay, err := ob.NewRelay(pub, outbox.RelayConfig{ID: "placed"})
	if err != nil {
		t.Fatal(err)
	}
	cycle := func(from, n int) (published int, listOffsets int64) {
		t.Helper()
		if err := enqueue(ctx, db, ob, alignedMessages(topic, from, n, keys)...); err != nil {
			t.Fatal(err)
		}
		before := pub.endOffsets.Load()
		got, err := relay.PublishOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return got, pub.endOffsets.Load() - before
	}

	// The first cycle checks every partition from its start.
	if n, _ := cycle(0, keys); n != keys {
		t.Fatalf("first cycle published %d, want %d", n, keys)
	}
	for round := 1; round <= 5; round++ {
		n, asked := cycle(round*keys, keys)
		if n != keys || asked != 0 {
			t.Fatalf("cycle %d published %d (want %d) with %d requests for the end offsets (want 0: the write's offsets follow what the relay read)", round, n, keys, asked)
		}
	}

	// Another writer (a copy of the database with a relay of its own)
	// publishes the number of the relay's next message of a partition, for
	// another event, just before the relay's write.
	foreign := &kafka.Writer{Addr: kafka.TCP(brokers...), Transport: transport, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond,
		Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition })}
	defer foreign.Close()
	var raced kafka.Message
	pub.before = func(msgs []kafka.Message, parts []int) {
		raced = msgs[0]
		copied := kafka.Message{Topic: topic, Partition: parts[0], Value: []byte("foreign")}
		for _, h := range msgs[0].Headers {
			if h.Key == header.EventID {
				h.Value = []byte("foreign-event")
			}
			copied.Headers = append(copied.Headers, h)
		}
		if err := foreign.WriteMessages(ctx, copied); err != nil {
			t.Error(err)
		}
		raced.Partition = parts[0]
	}
	n, asked := cycle(6*keys, keys)
	if t.Failed() {
		t.FailNow()
	}
	if asked == 0 {
		t.Fatal("the relay did not read the end offsets after a write another writer preceded")
	}
	if n >= keys {
		t.Fatalf("the raced cycle marked %d of %d published; the message that lost its number must not be", n, keys)
	}
	if _, err := conformance.Drain(ctx, relay); err != nil {
		t.Fatal(err)
	}

	id, _ := headerOf([]kafka.Message{raced}, header.EventID)
	epoch, _ := headerOf([]kafka.Message{raced}, header.SeqEpoch)
	var epochs []string
	for _, m := range readTopic(ctx, t, brokers, topic, shards) {
		if got, _ := headerOf([]kafka.Message{m}, header.EventID); got == id {
			e, _ := headerOf([]kafka.Message{m}, header.SeqEpoch)
			epochs = append(epochs, e)
		}
	}
	first, _ := strconv.Atoi(epoch)
	if len(epochs) != 2 || epochs[0] != epoch || slices.ContainsFunc(epochs[1:], func(e string) bool { n, _ := strconv.Atoi(e); return n <= first }) {
		t.Fatalf("event %s was published under epochs %v; want %s, then again under a new one", id, epochs, epoch)
	}
}
