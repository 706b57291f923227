package sqlite_test

import (
	"path/filepath"
	"testing"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/outboxbench"
	"github.com/inboxgo/inbox/storage"
)

// BenchmarkOutboxRelay is the PostgreSQL benchmark of the same name on
// SQLite. Run with -benchtime 1x.
func BenchmarkOutboxRelay(b *testing.B) {
	outboxbench.Bench(b, testservers.KafkaBrokers(b), func(shards int) (*gorm.DB, storage.OutboxStore, func(), error) {
		db, err := gorm.Open(inboxsqlite.Open(filepath.Join(b.TempDir(), "bench.db")), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			return nil, nil, nil, err
		}
		store, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Shards: shards})
		cleanup := func() {
			if sqlDB, err := db.DB(); err == nil {
				_ = sqlDB.Close()
			}
		}
		return db, store, cleanup, err
	})
}
