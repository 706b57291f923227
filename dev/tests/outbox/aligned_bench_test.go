package outbox_test

import (
	"testing"

	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/outboxbench"
	"github.com/inboxgo/inbox/storage"
)

// BenchmarkAlignedEnqueue measures what aligned shards cost concurrent
// enqueuers on PostgreSQL and MariaDB, paired with the default outbox
// (outboxbench.EnqueueBench; figures in docs/BENCHMARKS.md). Run with
// -benchtime 1x.
func BenchmarkAlignedEnqueue(b *testing.B) {
	b.Run("postgres", func(b *testing.B) {
		dsn := testservers.PostgresDSN(b)
		outboxbench.EnqueueBench(b, func(shards int) (*gorm.DB, storage.OutboxStore, func(), error) {
			db, err := gorm.Open(gormpg.Open(dsn), &gorm.Config{Logger: logger.Discard})
			if err != nil {
				return nil, nil, nil, err
			}
			schema := "aligned_bench_" + conformance.RandomSuffix()
			store, err := inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: schema, Shards: shards})
			cleanup := func() {
				db.Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`)
				if sqlDB, err := db.DB(); err == nil {
					_ = sqlDB.Close()
				}
			}
			return db, store, cleanup, err
		})
	})
	b.Run("mysql", func(b *testing.B) {
		dsn := testservers.MySQLDSN(b)
		outboxbench.EnqueueBench(b, func(shards int) (*gorm.DB, storage.OutboxStore, func(), error) {
			d, err := inboxmysql.Open(dsn)
			if err != nil {
				return nil, nil, nil, err
			}
			db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
			if err != nil {
				return nil, nil, nil, err
			}
			store, err := inboxmysql.NewOutbox(inboxmysql.OutboxOptions{Table: "aligned_bench_" + conformance.RandomSuffix(), Shards: shards})
			cleanup := func() {
				if store != nil {
					for _, suffix := range []string{"", "_shards", "_relay", "_source"} {
						db.Exec("DROP TABLE IF EXISTS `" + store.Table() + suffix + "`")
					}
				}
				if sqlDB, err := db.DB(); err == nil {
					_ = sqlDB.Close()
				}
			}
			return db, store, cleanup, err
		})
	})
}
