package mysql_test

import (
	"testing"

	"gorm.io/gorm"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/outboxbench"
	"github.com/inboxgo/inbox/storage"
)

// BenchmarkOutboxRelay is the PostgreSQL benchmark of the same name on
// MariaDB. Run with -benchtime 1x.
func BenchmarkOutboxRelay(b *testing.B) {
	dsn := testservers.MySQLDSN(b)
	outboxbench.Bench(b, testservers.KafkaBrokers(b), func(shards int) (*gorm.DB, storage.OutboxStore, func(), error) {
		db, err := openDB(dsn)
		if err != nil {
			return nil, nil, nil, err
		}
		store, err := inboxmysql.NewOutbox(inboxmysql.OutboxOptions{Table: "outbox_bench_" + conformance.RandomSuffix(), Shards: shards})
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
}
