//go:build cgo

package outbox_test

import (
	"path/filepath"
	"testing"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/storage"
)

// On SQLite the same cycle sends the lease, which returns the source and
// epoch with the leased shards, a read of each shard's rows and an
// acknowledgement of each shard (3 shards); the source is not read apart,
// so a relay that shares one connection with the enqueuers waits for it
// once less.
func TestRelayCycleStatementsSQLite(t *testing.T) {
	db, store, topic := cycleSQLite(t)
	steady, backlog := cycleStatements(t, db, store, topic)
	if steady != 7 || backlog != 7 {
		t.Errorf("a cycle of %d rows sent %d statements, of %d rows of %d %d; want 7 each (lease with the source 1, rows 3, acknowledgements 3)",
			cycleKeys, steady, cycleTake, 2*cycleTake, backlog)
	}
}

// cycleSQLite is cyclePostgres on SQLite, in a file of tb's own.
func cycleSQLite(tb testing.TB) (*gorm.DB, storage.OutboxStore, string) {
	tb.Helper()
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(tb.TempDir(), "cycle.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	store, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Shards: cycleShards})
	if err != nil {
		tb.Fatal(err)
	}
	return db, store, "cycle-sqlite"
}
