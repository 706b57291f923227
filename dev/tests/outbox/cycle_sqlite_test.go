//go:build cgo

package outbox_test

import (
	"testing"

	"gorm.io/gorm"

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

// cycleSQLite is cyclePostgres on SQLite: sequenceDB's database, with an
// outbox table of cycleShards shards beside its own.
func cycleSQLite(t *testing.T) (*gorm.DB, storage.OutboxStore, string) {
	t.Helper()
	db, _ := sequenceDB(t)
	store, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Table: "cycle", Shards: cycleShards})
	if err != nil {
		t.Fatal(err)
	}
	return db, store, "cycle-sqlite"
}
