package postgres_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/transport/franzgo"
)

// TestOutboxRelayToKafka runs three relays against a real broker while four
// writers enqueue; one relay dies without releasing its leases halfway. Every
// message must reach Kafka, readable by the consumer's header extractor, and
// per key the first copies must arrive in commit order.
// It runs on each relay publisher this library ships.
func TestOutboxRelayToKafka(t *testing.T) {
	publishers := map[string]func(t *testing.T, brokers []string) outbox.Publisher{
		"kafka-go": func(t *testing.T, brokers []string) outbox.Publisher {
			w := outbox.NewKafkaWriter(brokers...)
			t.Cleanup(func() { _ = w.Close() })
			pub, err := outbox.NewKafkaPublisher(w)
			if err != nil {
				t.Fatal(err)
			}
			return pub
		},
		"franz-go": func(t *testing.T, brokers []string) outbox.Publisher {
			pub, err := franzgo.NewPublisher(franzgo.Options{Brokers: brokers})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pub.Close)
			return pub
		},
	}
	for _, name := range []string{"kafka-go", "franz-go"} {
		t.Run(name, func(t *testing.T) { runOutboxRelayToKafka(t, publishers[name]) })
	}
}

func runOutboxRelayToKafka(t *testing.T, open func(t *testing.T, brokers []string) outbox.Publisher) {
	dsn, brokers := testservers.PostgresDSN(t), testservers.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	db, err := openDB(dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := "outbox_kafka_" + conformance.RandomSuffix()
	t.Cleanup(func() {
		db.Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`)
		_ = closeDB(db)
	})
	store, err := inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: schema, Shards: 16})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(db, store, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	topic := "outbox-relay-" + conformance.RandomSuffix()
	const partitions = 4
	if err := inventory.CreateTopic(ctx, brokers[0], topic, partitions); err != nil {
		t.Fatal(err)
	}

	const writers, keysPerWriter, perKey = 4, 8, 25
	total := writers * keysPerWriter * perKey
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var relays sync.WaitGroup
	newRelay := func(id string) *outbox.Relay {
		r, err := ob.NewRelay(open(t, brokers), outbox.RelayConfig{ID: id, Lease: 2 * time.Second, MaxShards: 6, MaxMessages: 20, PollInterval: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for i := range 2 {
		r := newRelay(fmt.Sprintf("relay-%d", i))
		relays.Go(func() { _ = r.Run(runCtx) })
	}
	// The doomed relay runs cycles by hand and stops dead: its leases stay
	// until they expire.
	doomed := newRelay("doomed")
	doomedCtx, kill := context.WithCancel(runCtx)
	defer kill()
	relays.Go(func() {
		for doomedCtx.Err() == nil {
			if _, err := doomed.PublishOnce(doomedCtx); err != nil && doomedCtx.Err() == nil {
				t.Logf("doomed relay: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})

	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range perKey {
				if i == perKey/2 && w == 0 {
					kill()
				}
				for k := range keysPerWriter {
					key := fmt.Sprintf("w%d-k%d", w, k)
					err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
						return ob.Enqueue(ctx, tx, outbox.Message{Topic: topic, Key: []byte(key), Value: []byte(strconv.Itoa(i))})
					})
					if err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()

	got := readTopic(ctx, t, brokers, topic, partitions, total)
	stop()
	relays.Wait()

	extract := consumer.HeaderExtractor(nil, nil)
	firsts := map[string][]int{}
	ids := map[string]string{}
	for _, m := range got {
		id, _, err := extract(&m)
		if err != nil {
			t.Fatalf("the consumer cannot read the event id of a relayed message: %v", err)
		}
		v := string(m.Key) + "/" + string(m.Value)
		if prev, ok := ids[v]; ok {
			if prev != id {
				t.Fatalf("message %s published twice with different event ids %s and %s", v, prev, id)
			}
			continue
		}
		ids[v] = id
		n, _ := strconv.Atoi(string(m.Value))
		firsts[string(m.Key)] = append(firsts[string(m.Key)], n)
	}
	if len(ids) != total {
		t.Fatalf("%d distinct messages reached Kafka, want %d", len(ids), total)
	}
	for key, vs := range firsts {
		for i, v := range vs {
			if v != i {
				t.Fatalf("key %s: first copies arrived as %v, want 0..%d in order", key, vs, perKey-1)
			}
		}
	}
	t.Logf("%d messages, %d copies in Kafka (%d duplicates from the killed relay)", total, len(got), len(got)-total)
}

// readTopic reads every partition of topic from the start until want
// distinct key/value pairs arrived, and returns the messages in partition
// order (order across partitions does not matter: one key is in one).
func readTopic(ctx context.Context, t *testing.T, brokers []string, topic string, partitions, want int) []kafka.Message {
	t.Helper()
	var mu sync.Mutex
	var got []kafka.Message
	distinct := map[string]bool{}
	readCtx, stop := context.WithTimeout(ctx, 90*time.Second)
	defer stop()
	var wg sync.WaitGroup
	byPartition := make([][]kafka.Message, partitions)
	for p := range partitions {
		wg.Go(func() {
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
			defer r.Close()
			for {
				m, err := r.ReadMessage(readCtx)
				if err != nil {
					return
				}
				mu.Lock()
				byPartition[p] = append(byPartition[p], m)
				distinct[string(m.Key)+"/"+string(m.Value)] = true
				if len(distinct) >= want {
					stop()
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, ms := range byPartition {
		got = append(got, ms...)
	}
	return got
}
