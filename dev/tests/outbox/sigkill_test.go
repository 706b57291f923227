package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

// Environment of a relay child process.
const (
	childSchemaVar = "OUTBOX_TEST_RELAY_SCHEMA"
	childIDVar     = "OUTBOX_TEST_RELAY_ID"
)

func openPostgresOutbox(t *testing.T, schema string) (*gorm.DB, storage.OutboxStore, *outbox.Outbox) {
	t.Helper()
	db, err := gorm.Open(gormpg.Open(testservers.PostgresDSN(t)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	store, err := inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: schema, Shards: 16})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(db, store, outbox.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return db, store, ob
}

// TestRelayChild is the relay process TestRelaySIGKILL starts and kills;
// it does nothing in a normal test run.
func TestRelayChild(t *testing.T) {
	schema := os.Getenv(childSchemaVar)
	if schema == "" {
		t.Skip("only run as TestRelaySIGKILL's child process")
	}
	_, _, ob := openPostgresOutbox(t, schema)
	pub, err := outbox.NewKafkaPublisher(outbox.NewKafkaWriter(testservers.KafkaBrokers(t)...))
	if err != nil {
		t.Fatal(err)
	}
	r, err := ob.NewRelay(pub, outbox.RelayConfig{ID: os.Getenv(childIDVar), Lease: 2 * time.Second, MaxMessages: 25, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Run(context.Background()) // until SIGKILL
}

// TestRelaySIGKILL kills relay processes with SIGKILL while they publish:
// their connections and Kafka writes die mid-flight and their leases stay
// behind. Relays that follow (under the same id, resuming at once, or
// another, after the lease) must publish every message, in order per key.
func TestRelaySIGKILL(t *testing.T) {
	brokers := testservers.KafkaBrokers(t)
	schema := "outbox_kill_" + conformance.RandomSuffix()
	db, store, ob := openPostgresOutbox(t, schema)
	t.Cleanup(func() {
		db.Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`)
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	topic := "outbox-kill-" + conformance.RandomSuffix()
	const partitions, keys, perKey = 4, 20, 60
	if err := inventory.CreateTopic(ctx, brokers[0], topic, partitions); err != nil {
		t.Fatal(err)
	}
	for n := range perKey {
		err := db.Transaction(func(tx *gorm.DB) error {
			msgs := make([]outbox.Message, keys)
			for k := range keys {
				msgs[k] = outbox.Message{Topic: topic, Key: []byte("k" + strconv.Itoa(k)), Value: []byte(strconv.Itoa(n))}
			}
			return ob.Enqueue(ctx, tx, msgs...)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	unpublished := func() int64 {
		stats, err := store.(storage.StatsReporter).Stats(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, s := range stats {
			n += s.Unpublished
		}
		return n
	}
	total := int64(keys * perKey)
	for i, id := range []string{"relay-1", "relay-1", "relay-2", "relay-3"} {
		before := unpublished()
		if before == 0 {
			break
		}
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestRelayChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), childSchemaVar+"="+schema, childIDVar+"="+id)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill it once it has published some, mid-run.
		for unpublished() > before-total/8 && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		t.Logf("relay process %d (%s) SIGKILLed with %d of %d unpublished", i+1, id, unpublished(), total)
	}
	// The last relay runs to the end; it waits for the killed relay-3's
	// lease to expire.
	pub, err := outbox.NewKafkaPublisher(outbox.NewKafkaWriter(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	last, err := ob.NewRelay(pub, outbox.RelayConfig{ID: "relay-last", Lease: 2 * time.Second, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = last.Run(runCtx); close(done) }()
	for unpublished() > 0 && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	<-done

	got := readTopic(ctx, t, brokers, topic, partitions)
	extract := consumer.HeaderExtractor(nil, nil)
	seen := map[string]bool{}
	next := map[string]int{}
	for _, m := range got {
		id, _, err := extract(&m)
		if err != nil {
			t.Fatal(err)
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		n, _ := strconv.Atoi(string(m.Value))
		if n != next[string(m.Key)] {
			t.Fatalf("key %s: first copy of message %d arrived after %d", m.Key, n, next[string(m.Key)]-1)
		}
		next[string(m.Key)]++
	}
	if len(seen) != int(total) {
		t.Fatalf("%d distinct messages in Kafka, want %d", len(seen), total)
	}
	t.Logf("%d messages, %d copies in Kafka after 4 SIGKILLed relays: 0 lost, 0 reordered", total, len(got))
}

// readTopic reads every partition of topic from the start to its end.
func readTopic(ctx context.Context, t *testing.T, brokers []string, topic string, partitions int) []kafka.Message {
	t.Helper()
	var got []kafka.Message
	for p := range partitions {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
		end := endOffset(ctx, t, brokers, topic, p)
		for off := int64(0); off < end; off++ {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				t.Fatal(fmt.Errorf("partition %d offset %d: %w", p, off, err))
			}
			got = append(got, m)
		}
		r.Close()
	}
	return got
}

// endOffset returns the end offset of partition p of topic.
func endOffset(ctx context.Context, t *testing.T, brokers []string, topic string, p int) int64 {
	t.Helper()
	conn, err := kafka.DialLeader(ctx, "tcp", brokers[0], topic, p)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	end, err := conn.ReadLastOffset()
	if err != nil {
		t.Fatal(err)
	}
	return end
}
