package postgres_test

import (
	"testing"

	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/outboxbench"
	"github.com/inboxgo/inbox/storage"
)

// BenchmarkOutboxRelay publishes outboxbench.Defaults() events through the
// outbox relay on PostgreSQL and straight to Kafka, and reports both and
// their ratio, and what checking the partitions costs an aligned outbox's
// relay (outboxbench.AlignedBench; see docs/BENCHMARKS.md). Run with
// -benchtime 1x.
func BenchmarkOutboxRelay(b *testing.B) {
	dsn := testservers.PostgresDSN(b)
	outboxbench.Bench(b, testservers.KafkaBrokers(b), func(shards int) (*gorm.DB, storage.OutboxStore, func(), error) {
		db, err := openDB(dsn)
		if err != nil {
			return nil, nil, nil, err
		}
		schema := "outbox_bench_" + conformance.RandomSuffix()
		store, err := inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: schema, Shards: shards})
		cleanup := func() {
			db.Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`)
			_ = closeDB(db)
		}
		return db, store, cleanup, err
	})
}
